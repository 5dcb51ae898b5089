"""Live output: a running call's progress (`ToolProgress`) in `Prompt.events()`, never logged.

The bash tests run real processes on the real clock; the merging tests run a
tool of their own in virtual time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import acp
import msgspec
import pytest
import trio
from acp import schema

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
from tests.acp_editor import Editor
from tests.acp_process import acp_process
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
    assert totals == sorted(totals)
    assert len(set(totals)) == len(totals)
    for progress in live:
        assert progress.call_id == "b1"
        assert progress.turn == 1
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
    command = (
        "end=$((SECONDS+2)); while [ $SECONDS -lt $end ]; do seq 1 20000; done | head -c 40000000"
    )
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
    assert all(b - a >= 0.099 for a, b in itertools.pairwise(times))
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
    assert lasts == sorted(lasts)
    assert lasts[-1] != "0.9"
    result = next(i for i, e in enumerate(seen) if isinstance(e, ToolResult))
    assert not any(isinstance(e, ToolProgress) for e in seen[result:])
    assert isinstance(seen[-1], TurnEnd)
    # The session keeps no notice once the call's result is logged.
    assert agent.session.live is not None
    assert agent.session.live.after(0) is None
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


# -- over ACP ------------------------------------------------------------------------------------

LINES = "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done"


def _editor_run(tmp_path: Path, editor: Editor, command: str, meta: dict[str, Any] | None) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()

    async def scenario() -> None:
        argv = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
        async with acp.spawn_agent_process(
            editor, *argv, env={"GREENROOM_HOME": str(home)}, cwd=work
        ) as (conn, process):
            capabilities = schema.ClientCapabilities(field_meta=meta)
            await conn.initialize(protocol_version=1, client_capabilities=capabilities)
            session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
            prompt = [acp.text_block(f"bash: {command}")]
            answer = await conn.prompt(session_id=session, prompt=prompt)
            assert answer.stop_reason == "end_turn"
        assert await asyncio.wait_for(process.wait(), 10) == 0

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))


def test_acp_shows_the_output_so_far_as_the_calls_content_while_it_runs(tmp_path: Path) -> None:
    editor = Editor()
    _editor_run(tmp_path, editor, LINES, None)
    updates = editor.tool_calls()
    final = next(i for i, u in enumerate(updates) if getattr(u, "status", None) == "completed")
    live = [
        u.content[0].content.text
        for u in updates[:final]
        if isinstance(u, schema.ToolCallProgress) and u.status == "in_progress" and u.content
    ]
    assert len(live) >= 3, live
    assert all(text.startswith("line 1\n") for text in live)
    assert "line 6" not in live[0]
    assert all(len(a) < len(b) for a, b in itertools.pairwise(live))
    done = updates[final]
    assert done.content[0].content.text.splitlines()[:6] == [f"line {i}" for i in range(1, 7)]
    assert not any(getattr(u, "status", None) == "in_progress" for u in updates[final:])


def test_acp_renders_a_terminal_when_the_client_opts_in(tmp_path: Path) -> None:
    editor = Editor()
    _editor_run(tmp_path, editor, LINES, {"terminal_output": True})
    updates = editor.tool_calls()
    start = updates[0]
    assert isinstance(start, schema.ToolCallStart)
    (terminal,) = start.content or []
    assert isinstance(terminal, schema.TerminalToolCallContent)
    call_id = start.tool_call_id
    assert terminal.terminal_id == call_id
    assert start.field_meta["terminal_info"]["terminal_id"] == call_id
    deltas = [
        u.field_meta["terminal_output"]
        for u in updates
        if isinstance(u, schema.ToolCallProgress)
        and u.field_meta
        and "terminal_output" in u.field_meta
    ]
    assert len(deltas) >= 3
    assert all(d["terminal_id"] == call_id for d in deltas)
    # Each delta is only what is new: together they are the output, each line once.
    shown = "".join(d["data"] for d in deltas)
    assert shown == "".join(f"line {i}\n" for i in range(1, 7))[: len(shown)]
    assert shown.count("line 1\n") == 1
    end = updates[-1]
    assert end.status == "completed"
    assert end.field_meta["terminal_exit"] == {
        "terminal_id": call_id,
        "exit_code": 0,
        "signal": None,
    }


@pytest.mark.real_clock
async def test_a_client_that_never_reads_does_not_grow_greenrooms_memory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    done = work / "done"  # in the session's directory: the command's sandbox writes there
    # 100 MB of output in about 5 s (1 MB, a pause, ...); then a mark that it ended.
    chunk = "head -c 1000000 /dev/zero | tr '\\\\0' a | fold -w 99"
    command = f"for i in $(seq 100); do {chunk}; sleep 0.05; done; touch {done}"
    with trio.fail_after(120):
        async with acp_process(tmp_path / "home", "--model", "scripted:0", cwd=work) as peer:
            session = await peer.new_session(str(work))
            await peer.request(
                "session/prompt",
                {"sessionId": session, "prompt": [{"type": "text", "text": f"bash: {command}"}]},
            )
            while not any(f.get("method") == "session/request_permission" for f in peer.frames):
                await peer._read()
            asked = next(f for f in peer.frames if f.get("method") == "session/request_permission")
            before = _rss(peer.process.pid)
            answer = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
            reply = {"jsonrpc": "2.0", "id": asked["id"], "result": answer}
            await peer.send_raw(json.dumps(reply).encode() + b"\n")
            # From here on nothing is read: greenroom's stdout pipe fills and stays full.
            peak = before
            while not done.exists():
                peak = max(peak, _rss(peer.process.pid))
                await trio.sleep(0.05)
            await trio.sleep(1)  # what comes after the command: its result, more progress
            peak = max(peak, _rss(peer.process.pid))
            assert peak - before < 40_000_000, (before, peak)
            # Read again: the prompt is answered, after a bounded number of snapshots.
            while not any(f.get("id") == 3 and "result" in f for f in peer.frames):
                await peer._read()
    updates = [f["params"]["update"] for f in peer.frames if f.get("method") == "session/update"]
    live = [
        u
        for u in updates
        if u["sessionUpdate"] == "tool_call_update"
        and u["status"] == "in_progress"
        and u.get("content")
    ]
    # What the pipe held when it filled, one in the writer, one queued: not one per tick.
    assert len(live) <= 16
    assert all(len(u["content"][0]["content"]["text"].encode()) <= PROGRESS_BYTES for u in live)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
