"""The process that the kill-9 tests SIGKILL: it writes turns until it dies.

Usage: ``python kill9_child.py jsonl|sqlite PATH``. It resumes session
``s`` (or creates it), then runs turns forever with a zero-latency model
whose turns call a tool and answer in many chunks, printing ``flushed N``
(N = events durably stored) after each turn.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import trio

from greenroom import open_runtime
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    UserTurn,
)
from greenroom.session.persistence import (
    JsonlPersistence,
    Persistence,
    SessionNotFound,
    SqlitePersistence,
)

WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * 12).split()


class Chatty:
    """Answers a prompt with a tool call, then a tool result with sixty-odd text chunks."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        if isinstance(request.messages[-1], UserTurn):
            self.calls += 1
            yield TextDelta("checking ")
            yield ToolCallChunk(f"call-{self.calls}", "lookup", "{}")
            yield Finish("tool-calls")
            return
        for word in WORDS:
            await trio.lowlevel.checkpoint()
            yield TextDelta(word + " ")
        yield Finish("stop")


async def main(backend: str, path: str) -> None:
    store: Persistence = JsonlPersistence(path) if backend == "jsonl" else SqlitePersistence(path)
    async with open_runtime(model=Chatty(), persistence=store) as rt:
        try:
            handle = await rt.agents.resume(agent_id="a", session_id="s")
        except SessionNotFound:
            handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        print("ready", flush=True)
        while True:
            agent.send("go on")
            await agent.when_idle()
            print(f"flushed {agent.session.next_seq}", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
