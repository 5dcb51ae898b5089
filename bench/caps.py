"""Caps: a turn whose tool answers 5 MB, its result cut and spilled, against the same turn
logging and sending all of it.

* ours: the default ``max_tool_result`` (100,000 characters): the result is
  cut, the whole written to a spill file in a worker thread, the cut text
  logged and put in the model's next request;
* raw: the same turn with the cap above the result (what every tool but MCP
  did before results were bounded): the whole 5 MB logged and sent.

Each turn is a scripted model calling the tool, then answering (two steps),
on a JSONL store (its default sync, one fsync a turn), in milliseconds per
turn. Both run in one ``trio.run`` per repeat, alternating which goes first,
after a warm-up of each.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import msgspec
import trio

from bench.report import Row, compare
from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation
from greenroom.models.scripted import CallTool, Say, ScriptedModel
from greenroom.session.persistence import JsonlPersistence
from greenroom.spill import DEFAULT_MAX_TOOL_RESULT
from greenroom.tools import Tool

SCENARIO = "caps"
_SIZE = 5_000_000
_WARM = 3


class _NoArgs(msgspec.Struct):
    pass


async def _answer(args: _NoArgs, invocation: ToolInvocation) -> str:
    await trio.lowlevel.checkpoint()
    return _TEXT


_TEXT = "r" * _SIZE
_TOOL = Tool("huge", "answers 5 MB", _NoArgs, _answer)


async def _turns(turns: int, cap: int, root: Path) -> float:
    scripts = [s for _ in range(turns + _WARM) for s in ([CallTool("huge")], [Say("ok")])]
    async with open_runtime(
        model=ScriptedModel(scripts, delay=0),
        persistence=JsonlPersistence(root),
        tools=[_TOOL],
        max_tool_result=cap,
    ) as rt:
        handle = await rt.agents.create(agent_id="bench", session_id="bench")
        agent = handle.agent
        for _ in range(_WARM):
            agent.send("go")
            await agent.when_idle()
        t0 = time.perf_counter()
        for _ in range(turns):
            agent.send("go")
            await agent.when_idle()
        took = time.perf_counter() - t0
        await handle.dispose()
    return took / turns * 1e3


def run(repeats: int, quick: bool) -> list[Row]:
    n = 5 if quick else 20
    ours: list[float] = []
    raw: list[float] = []
    for repeat in range(repeats):

        async def both(first: int = repeat % 2) -> tuple[float, float]:
            with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                cut, whole = (DEFAULT_MAX_TOOL_RESULT, Path(a)), (_SIZE + 1, Path(b))
                if first:
                    return await _turns(n, *cut), await _turns(n, *whole)
                whole_ms = await _turns(n, *whole)
                return await _turns(n, *cut), whole_ms

        ours_ms, raw_ms = trio.run(both)
        ours.append(ours_ms)
        raw.append(raw_ms)
    return [
        compare(
            SCENARIO,
            "a turn whose tool answers 5 MB: cut to 100,000 characters and spilled",
            "ms",
            ours,
            baseline="the same turn logging and sending all 5 MB",
            raw=raw,
            max_ratio=1.0,
            note="JSONL store; two scripted steps around the call",
        )
    ]
