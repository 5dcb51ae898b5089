"""The process the durable-turn tests SIGKILL mid-turn, then run again to carry the turn on.

Usage: ``python durable_child.py jsonl|sqlite|postgres PATH CUT RUNS`` (for postgres,
PATH is the DSN). ``CUT`` is where the first life stops, for good, to be killed:

* ``model``: the model streams half a reply to the prompt, then hangs;
* ``write``: the model calls ``write`` (an ``edit`` tool), which hangs once running;
* ``read``: the model calls ``look`` (a ``read`` tool), which hangs once running.

Each tool run appends its name to the file ``RUNS``; each model request prints
``request`` and the last message's kind, so the parent counts what ran and what was asked.

The first life creates session ``s``, prompts it and prints ``cut`` at the point;
the second (the session exists) resumes it with ``interrupted="continue"``: nothing
hangs now, and it prints ``answer STOP TEXT`` for the continued turn, then exits.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import trio

from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    ToolTurn,
    UserTurn,
)
from greenroom.session.persistence import (
    JsonlPersistence,
    Persistence,
    SessionNotFound,
    SqlitePersistence,
)
from greenroom.tools import Tool

TOOL_OF = {"write": "write", "read": "look"}


class NoArgs(msgspec.Struct):
    pass


class Cutting:
    """Asks for the cut's tool at the prompt and answers ``done`` after its result; hangs
    where the first life is cut."""

    def __init__(self, cut: str, first: bool) -> None:
        self.cut = cut
        self.first = first

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        last = request.messages[-1]
        print(f"request {type(last).__name__}", flush=True)
        if isinstance(last, UserTurn) and self.cut in TOOL_OF:
            yield ToolCallChunk("call-1", TOOL_OF[self.cut], "{}")
            yield Finish("tool-calls")
            return
        if isinstance(last, UserTurn) and self.first:  # the cut model step
            yield TextDelta("half a ")
            yield TextDelta("reply")
            await trio.sleep(0.05)  # the chunks reach the log's writer
            print("cut", flush=True)
            await trio.sleep_forever()
        seen = last.content if isinstance(last, ToolTurn) else ""
        yield TextDelta(f"done after {seen!r}")
        yield Finish("stop")


def tools(runs: Path, first: bool) -> list[Tool[NoArgs]]:
    def tool(name: str, **flags: object) -> Tool[NoArgs]:
        async def run(args: NoArgs, call: ToolInvocation) -> str:
            with runs.open("a") as file:
                file.write(name + "\n")
            if first:  # the write-ahead logged the call before it ran: cut here
                print("cut", flush=True)
                await trio.sleep_forever()
            return f"{name} ran"

        return Tool(name, f"the {name} tool", NoArgs, run, **flags)  # type: ignore[arg-type]

    return [tool("write", kind="edit"), tool("look", kind="read")]


def store_of(backend: str, path: str) -> Persistence:
    if backend == "postgres":
        from greenroom.session.persistence.postgres import PostgresPersistence

        return PostgresPersistence(path)
    return JsonlPersistence(path) if backend == "jsonl" else SqlitePersistence(path)


async def main(backend: str, path: str, cut: str, runs: str) -> None:
    store = store_of(backend, path)
    try:
        await store.load("s")
        first = False
    except SessionNotFound:
        first = True
    model = Cutting(cut, first)
    async with open_runtime(model=model, persistence=store, tools=tools(Path(runs), first)) as rt:
        if first:
            handle = await rt.agents.create(agent_id="a", session_id="s")
            await handle.agent.run("go")  # never returns: the process is killed mid-turn
            return
        handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
        assert handle.resumed is not None, "no turn to carry on"
        answer = await handle.resumed
        print(f"answer {answer.stop_reason} {answer.text}", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
