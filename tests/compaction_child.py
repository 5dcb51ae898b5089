"""The process the compaction kill test SIGKILLs: it compacts until it dies.

Usage: ``python compaction_child.py DIR``. Session ``s`` in a JSONL store at DIR:
prompts ``question N`` under a tiny context window, so every few turns a turn
compacts; the summarizing call prints ``summarizing`` and streams its summary
slowly, so a kill lands before, during or after the ``context/compacted`` append.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from greenroom import open_runtime
from greenroom.actors.compaction import SUMMARY_SYSTEM
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta, Usage
from greenroom.session.persistence import JsonlPersistence


class Slow:
    context_window = 400

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        if request.system == SUMMARY_SYSTEM:
            print("summarizing", flush=True)
            for word in ("they ", "asked ", "questions ") * 5:
                await trio.sleep(0.001)
                yield TextDelta(word)
            yield Finish("stop")
            return
        yield TextDelta("answer")
        yield Usage(input_tokens=len(str(request)) // 4, output_tokens=1)
        yield Finish("stop")


async def main(root: Path) -> None:
    async with open_runtime(model=Slow(), persistence=JsonlPersistence(root)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        n = 0
        while True:
            await handle.agent.run(f"question {n}")
            n += 1


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]))
