"""The process the compaction kill tests SIGKILL: it compacts until it dies.

Usage: ``python compaction_child.py DIR [KIND]``. Session ``s`` in a JSONL store at
DIR: prompts ``question N`` under a tiny context window, so every few turns a turn
compacts; the summarizing call prints ``summarizing`` and then does what KIND says,
so a kill lands before, during or after the compaction's events:

* ``ok`` (the default): a summary streamed slowly;
* ``huge``: a summary far past its budget, streamed slowly (it is cut);
* ``fail``: the call fails after a while (the compaction truncates instead);
* ``hang``: the call never answers (the compaction's deadline is far off);
* ``overflow``: the model says no window and refuses a request past 400 tokens (the
  refusal names it), so the first compaction is the refusal's.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from greenroom import open_runtime
from greenroom.actors.compaction import SUMMARY_SYSTEM
from greenroom.models.base import ContextOverflow
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta, Usage
from greenroom.session.persistence import JsonlPersistence

WINDOW = 400


def tokens(request: ModelRequest) -> int:
    """4 characters a token of the request's texts, 4 tokens a message for its framing."""
    size = len(request.system or "") + sum(16 + len(m.content) for m in request.messages)
    return size // 4


class Model:
    """Answers ``answer`` with its usage; a summarizing request as `kind` says (above)."""

    def __init__(self, kind: str = "ok", delay: float = 0.001) -> None:
        self.kind = kind
        self.delay = delay
        if kind != "overflow":
            self.context_window = WINDOW

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        size = tokens(request)
        if self.kind == "overflow" and size > WINDOW:
            raise ContextOverflow(
                f"This model's maximum context length is {WINDOW} tokens. However, your"
                f" messages resulted in {size} tokens.",
                "context-overflow",
                window=WINDOW,
            )
        if request.system == SUMMARY_SYSTEM:
            print("summarizing", flush=True)
            if self.kind == "fail":
                await trio.sleep(50 * self.delay)
                raise RuntimeError("the summarizer is down")
            if self.kind == "hang":
                await trio.sleep_forever()
            words = ("they ", "asked ", "questions ") * (200 if self.kind == "huge" else 5)
            for word in words:
                await trio.sleep(self.delay)
                yield TextDelta(word)
            yield Finish("stop")
            return
        yield TextDelta("answer")
        yield Usage(input_tokens=size, output_tokens=1)
        yield Finish("stop")


async def main(root: Path, kind: str) -> None:
    async with open_runtime(model=Model(kind), persistence=JsonlPersistence(root)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(root.resolve()))
        n = 0
        while True:
            await handle.agent.run(f"question {n}")
            n += 1


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ok")
