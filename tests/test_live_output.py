"""Live output: a running call's progress (`ToolProgress`) in `Prompt.events()`, never logged.

The bash tests run real processes on the real clock; the merging tests run a
tool of their own in virtual time.
"""

from __future__ import annotations

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.actors.events import AGENT_TOOL_PROGRESS
from greenroom.actors.types import Agent, ToolInvocation
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import (
    PROGRESS_BYTES,
    SessionEvent,
    ToolProgress,
    ToolResult,
    ToolStart,
    TurnEnd,
)
from greenroom.tools import Tool
from greenroom.tools.bash.tools import bash_plugin
from tests.agents_helpers import new_agent

LIMIT = 30  # seconds, per real-clock test


def bash_script(command: str) -> list[list[object]]:
    arguments = {"command": command, "description": "live"}
    return [[CallTool("bash", arguments, call_id="b1")], [Say("done")]]


async def follow(agent: Agent, text: str) -> list[object]:
    prompt = agent.send(text)
    return [event async for event in prompt.events()]


@pytest.mark.real_clock
async def test_a_command_printing_a_line_per_half_second_shows_its_output_while_it_runs(
    tmp_path: object,
) -> None:
    command = "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done"
    model = ScriptedModel(bash_script(command), delay=0)  # type: ignore[arg-type]
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model, workdir=str(tmp_path)) as rt:
            await rt.plug("tool-bash", bash_plugin)
            notices: list[ToolProgress] = []
            rt.hooks.on(AGENT_TOOL_PROGRESS, lambda _agent, p: notices.append(p))
            agent = await new_agent(rt)
            events = await follow(agent, "go")
    kinds = [type(event) for event in events]
    start, result = kinds.index(ToolStart), kinds.index(ToolResult)
    live = [e for e in events[start:result] if isinstance(e, ToolProgress)]
    assert len(live) >= 3, live
    assert not any(isinstance(e, ToolProgress) for e in events[result:])
    # Each notice is the output so far: it grows, and it is what the command printed.
    totals = [p.total for p in live]
    assert totals == sorted(totals) and len(set(totals)) == len(totals)
    for progress in live:
        assert progress.call_id == "b1" and progress.turn == 1
        assert progress.output.startswith("line 1\n")
        assert len(progress.output.encode()) == progress.total
    # The first notice came while the command still had lines to print.
    assert "line 6" not in live[0].output
    final = events[result]
    assert isinstance(final, ToolResult)
    assert final.content.splitlines()[:6] == [f"line {i}" for i in range(1, 7)]
    # The embedder's hook saw the same notices; the log holds none of them.
    assert [p.total for p in notices][: len(live)] == totals[: len(notices)]
    assert len(notices) >= len(live)
    logged: list[SessionEvent] = list(agent.session.events)
    assert not any(isinstance(e, ToolProgress) for e in logged)


@pytest.mark.real_clock
async def test_a_flood_is_told_at_the_rate_limit_in_tails_of_8_kb(tmp_path: object) -> None:
    # About 1.5 s of output as fast as the pipe takes it.
    command = "end=$((SECONDS+2)); while [ $SECONDS -lt $end ]; do seq 1 20000; done | head -c 40000000"
    model = ScriptedModel(bash_script(command), delay=0)  # type: ignore[arg-type]
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model, workdir=str(tmp_path)) as rt:
            await rt.plug("tool-bash", bash_plugin)
            times: list[float] = []
            notices: list[ToolProgress] = []

            def seen(_agent: Agent, progress: ToolProgress) -> None:
                times.append(trio.current_time())
                notices.append(progress)

            rt.hooks.on(AGENT_TOOL_PROGRESS, seen)
            agent = await new_agent(rt)
            began = trio.current_time()
            await agent.run("go")
            took = trio.current_time() - began
    assert notices
    assert len(notices) <= took / 0.1 + 1
    assert all(b - a >= 0.099 for a, b in zip(times, times[1:], strict=False))
    assert all(len(p.output.encode()) <= PROGRESS_BYTES for p in notices)
    assert notices[-1].total > PROGRESS_BYTES  # more than one tail was written


@pytest.mark.real_clock
async def test_a_command_without_output_tells_nothing(tmp_path: object) -> None:
    model = ScriptedModel(bash_script("sleep 0.5"), delay=0)  # type: ignore[arg-type]
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model, workdir=str(tmp_path)) as rt:
            await rt.plug("tool-bash", bash_plugin)
            agent = await new_agent(rt)
            events = await follow(agent, "go")
    assert not any(isinstance(e, ToolProgress) for e in events)


# -- merging, in virtual time --------------------------------------------------------------


class _Count(msgspec.Struct):
    bursts: int


async def _counting(args: _Count, call: ToolInvocation) -> str:
    """Ten notices per burst with no checkpoint between them, a second apart."""
    assert call.progress is not None
    text = ""
    for burst in range(args.bursts):
        for tick in range(10):
            text += f"{burst}.{tick}\n"
            call.progress(text, len(text))
        await trio.sleep(1)
    return text


COUNTING = Tool("counting", "Count, showing the count so far.", _Count, _counting)


def counting_model(bursts: int = 3) -> ScriptedModel:
    return ScriptedModel(
        [[CallTool("counting", {"bursts": bursts}, call_id="c1")], [Say("ok")]], delay=0
    )


async def test_a_reader_gets_the_latest_notice_of_a_burst_not_each() -> None:
    async with open_runtime(model=counting_model(), tools=[COUNTING]) as rt:
        agent = await new_agent(rt)
        events = await follow(agent, "go")
    live = [e for e in events if isinstance(e, ToolProgress)]
    # Each burst's ten notices came without a checkpoint: the reader sees the last of each.
    assert [p.output.splitlines()[-1] for p in live] == ["0.9", "1.9", "2.9"]


async def test_a_slow_reader_is_merged_never_queued_and_sees_none_after_the_result() -> None:
    async with open_runtime(model=counting_model(bursts=6), tools=[COUNTING]) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        seen: list[object] = []
        async for event in prompt.events():
            seen.append(event)
            if isinstance(event, ToolProgress):
                await trio.sleep(2.5)  # misses the bursts in between
        logged = list(agent.session.events)
    live = [e for e in seen if isinstance(e, ToolProgress)]
    lasts = [p.output.splitlines()[-1] for p in live]
    assert 1 <= len(live) < 6, lasts
    assert lasts == sorted(lasts) and lasts[-1] != "0.9"
    result = next(i for i, e in enumerate(seen) if isinstance(e, ToolResult))
    assert not any(isinstance(e, ToolProgress) for e in seen[result:])
    assert isinstance(seen[-1], TurnEnd)
    # The session keeps no notice once the call's result is logged.
    assert agent.session.live is not None and agent.session.live.after(0) is None
    assert not any(isinstance(e, ToolProgress) for e in logged)


async def test_a_reader_started_mid_call_sees_only_notices_from_then_on() -> None:
    async with open_runtime(model=counting_model(), tools=[COUNTING]) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        while not any(isinstance(e, ToolStart) for e in agent.session.events):
            await trio.sleep(0.1)
        await trio.sleep(0.5)  # the first burst is out
        events = [event async for event in prompt.events()]
    live = [e for e in events if isinstance(e, ToolProgress)]
    assert [p.output.splitlines()[-1] for p in live] == ["1.9", "2.9"]
