"""The process that the kill-9 tests SIGKILL: it writes turns until it dies.

Usage: ``python kill9_child.py jsonl|sqlite PATH MARKERS``. It resumes session
``s`` (or creates it), then runs turns forever. Each turn calls the ``mark``
tool, which writes a file named by its call id into MARKERS, then streams
sixty-odd chunks; a steer joins every other turn. The model prints what it
was given when it is called (``saw`` and the texts): by then the write-ahead
has put the prompt and the steering in the log, so a kill after that line
must not lose them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import trio
import trio.lowlevel

from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation
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
from greenroom.tools import Tool

_SENT = re.compile(r"(?:prompt|steer) \d+ of \d+")
WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * 8).split()


class Chatty:
    """A prompt gets a call to ``mark``; the call's result gets sixty-odd text chunks."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        users = [m.content for m in request.messages if isinstance(m, UserTurn)]
        print("saw " + "|".join(_SENT.findall(" ".join(users))), flush=True)
        if isinstance(request.messages[-1], UserTurn):
            self.calls += 1
            yield TextDelta("checking ")
            yield ToolCallChunk(f"call-{self.calls}-{id(self)}", "mark", "{}")
            yield Finish("tool-calls")
            return
        for word in WORDS:
            await trio.lowlevel.checkpoint()
            yield TextDelta(word + " ")
        yield Finish("stop")


class NoArgs(msgspec.Struct):
    pass


async def main(backend: str, path: str, markers: str) -> None:
    async def mark(args: NoArgs, call: ToolInvocation) -> str:
        (Path(markers) / call.call_id).write_text("ran")
        return "marked"

    store: Persistence = JsonlPersistence(path) if backend == "jsonl" else SqlitePersistence(path)
    tools = [Tool("mark", "writes a marker file", NoArgs, mark)]
    async with open_runtime(model=Chatty(), persistence=store, tools=tools) as rt:
        try:
            handle = await rt.agents.resume(agent_id="a", session_id="s")
        except SessionNotFound:
            handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        print("ready", flush=True)
        for number in range(10**9):
            agent.send(f"prompt {number} of {id(agent)}")
            if number % 2:
                await trio.lowlevel.checkpoint()
                agent.steer(f"steer {number} of {id(agent)}")
            await agent.when_idle()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
