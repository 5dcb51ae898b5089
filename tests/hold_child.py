"""A process that holds session ``s`` live: ``python hold_child.py jsonl|sqlite|postgres PATH``
(for postgres, PATH is the DSN).

It resumes ``s`` (or creates it), runs one turn, prints ``held PID``, then
keeps the session live until its stdin ends, and exits cleanly.
"""

from __future__ import annotations

import os
import sys

import trio

from greenroom import open_runtime
from greenroom.models import ScriptedModel
from greenroom.session.persistence import (
    JsonlPersistence,
    Persistence,
    SessionNotFound,
    SqlitePersistence,
)


async def main(backend: str, path: str) -> None:
    store: Persistence
    if backend == "postgres":
        from greenroom.session.persistence.postgres import PostgresPersistence

        store = PostgresPersistence(path, lease_ttl=30)
    else:
        store = JsonlPersistence(path) if backend == "jsonl" else SqlitePersistence(path)
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        try:
            handle = await rt.agents.resume(agent_id="a", session_id="s")
        except SessionNotFound:
            handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send(f"from {os.getpid()}")
        await handle.agent.when_idle()
        print(f"held {os.getpid()}", flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(0))
        while await stdin.receive_some():
            pass


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
