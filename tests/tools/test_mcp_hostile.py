"""Hostile MCP servers and hostile specs, as real processes on the real clock.

Whatever a session's server does (never answer, write garbage, exit in the
middle of a call, flood, answer without end) the agent goes on, its dispose
stays bounded, no process it started outlives it, and what is offered and
reported is what the server offers.
"""

from __future__ import annotations

import gc
import math
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.acp.params import RpcError, servers_from_acp
from greenroom.actors.events import AGENT_ERROR
from greenroom.actors.types import Agent
from greenroom.models.scripted import CallTool, Say, ScriptedModel
from greenroom.protocol.events import Completed, ToolCall
from greenroom.protocol.mcp import McpHttpServer, McpServerError, McpStdioServer
from greenroom.spill import DEFAULT_MAX_TOOL_RESULT as MAX_RESULT
from greenroom.tools.mcp import SessionMcp, tool_name
from greenroom.tools.mcp import client as mcp_client
from greenroom.tools.mcp.client import McpConnection
from greenroom.tools.mcp.servers import ServerSlot
from tests.tools.test_mcp import (
    alive,
    ends,
    free_port,
    http_server,
    pids,
    results,
    served,
    until,
    watch,
)
from tests.tools.test_orphans import launchers_of

pytestmark = pytest.mark.real_clock

LIMIT = 30.0
#: How long a dispose may take, a server ignoring its stdin's end and SIGTERM included.
DISPOSE_BOUND = 6.0


def hostile(
    name: str, *flags: str, record: Path | None = None, **changes: object
) -> McpStdioServer:
    spec = served(name, "hostile", *flags, record=record)
    return msgspec.structs.replace(spec, **changes) if changes else spec


def silent(record: Path, start_timeout: float) -> McpStdioServer:
    spec = served("quiet", "silent", record=record)
    return msgspec.structs.replace(spec, start_timeout=start_timeout)


def children(record: Path) -> list[int]:
    return [int(line.split()[1]) for line in record.read_text().splitlines() if "child " in line]


# -- the life's nesting ----------------------------------------------------------------


async def test_dispose_is_a_clean_exit_of_the_agents_life() -> None:
    """Stopping the servers must not corrupt Trio's cancel scopes (it used to, on every
    dispose: the life ended with a RuntimeError, which a nursery owner re-raised)."""
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h")]
            )
            await handle.dispose()
            assert [(e.outcome, e.exception) for e in rt.supervisor.exits] == [("normal", None)]
            async with trio.open_nursery() as owner:
                handle = await rt.agents.create(
                    agent_id="b", session_id="t", mcp_servers=[hostile("h")], owner=owner
                )
                await handle.dispose()
            assert rt.agents.list() == []


async def test_the_owner_closing_mid_session_is_a_clean_exit_too(tmp_path: Path) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            async with trio.open_nursery() as owner:
                await rt.agents.create(
                    agent_id="a",
                    session_id="s",
                    mcp_servers=[hostile("h", record=record)],
                    owner=owner,
                )
                owner.cancel_scope.cancel()
            assert rt.agents.list() == []
    assert not any(alive(pid) for pid in pids(record))


# -- starting --------------------------------------------------------------------------


async def test_a_server_that_never_answers_initialize_fails_at_its_start_timeout(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            statuses = watch(rt)
            errors: list[Exception] = []
            rt.hooks.on(AGENT_ERROR, lambda _a, _t, _s, exc: errors.append(exc))
            before = time.monotonic()
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[silent(record, 1.0)]
            )
            took = time.monotonic() - before
            assert 1.0 <= took < 5.0  # the timeout, and what a loaded machine adds to it
            (status,) = statuses
            assert (status.state, status.message) == (
                "failed",
                "McpServerError: did not start within 1 s",
            )
            (error,) = errors
            assert isinstance(error, McpServerError)
            # The session is live without the server; its restart starts again.
            await until(lambda: len(pids(record)) == 2, "it is started again")
            before = time.monotonic()
            await handle.dispose()
            assert time.monotonic() - before < DISPOSE_BOUND
            assert not any(alive(pid) for pid in pids(record))


async def _create_cancelled_once_started(
    rt: Any, record: Path, **create: Any
) -> tuple[trio.CancelScope, float]:
    """``rt.agents.create(**create)``, cancelled once its server's process is up (its pid
    recorded), however long a loaded machine takes to start it; the scope, and when the
    cancel came."""
    cancelled_at = math.inf

    async def cancel_once_started() -> None:
        nonlocal cancelled_at
        await until(lambda: pids(record) != [], "the server was started", LIMIT)
        cancelled_at = time.monotonic()
        scope.cancel()

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_started)
            await rt.agents.create(**create)
    return scope, cancelled_at


async def test_a_cancelled_create_leaves_nothing(tmp_path: Path) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            statuses = watch(rt)
            waited, _ = await _create_cancelled_once_started(
                rt, record, agent_id="a", session_id="s", mcp_servers=[silent(record, 2.0)]
            )
            assert waited.cancelled_caught
            assert rt.agents.list() == []
            assert rt.sessions.get("s") is None
            assert [alive(pid) for pid in pids(record)] == [False]
            await trio.sleep(1.0)  # no restart comes later
            assert len(pids(record)) == 1
            assert statuses == []  # stopped by the cancel before it could fail


async def test_a_cancelled_create_does_not_wait_for_the_servers_start_timeout(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            before = time.monotonic()
            with trio.move_on_after(0.5):
                await rt.agents.create(
                    agent_id="a", session_id="s", mcp_servers=[silent(record, 20.0)]
                )
            # Far under the start timeout, with room for a loaded machine (2 s was not).
            assert time.monotonic() - before < 10.0


async def test_a_cancelled_create_under_a_nursery_leaves_nothing(tmp_path: Path) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            async with trio.open_nursery() as owner:
                waited, cancelled_at = await _create_cancelled_once_started(
                    rt,
                    record,
                    agent_id="a",
                    session_id="s",
                    mcp_servers=[silent(record, 20.0)],
                    owner=owner,
                )
                assert waited.cancelled_caught
                assert time.monotonic() - cancelled_at < DISPOSE_BOUND
            assert rt.agents.list() == []
            assert rt.sessions.get("s") is None
            assert [alive(pid) for pid in pids(record)] == [False]


async def test_the_runtime_closing_while_a_server_starts_is_bounded(tmp_path: Path) -> None:
    record = tmp_path / "record"
    refused: list[BaseException] = []

    async def create(rt: object) -> None:
        try:
            await rt.agents.create(  # type: ignore[attr-defined]
                agent_id="a", session_id="s", mcp_servers=[silent(record, 20.0)]
            )
        except RuntimeError as exc:
            refused.append(exc)

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            async with open_runtime() as rt:
                nursery.start_soon(create, rt)
                await until(lambda: pids(record) != [], "the server was started")
                before = time.monotonic()
            assert time.monotonic() - before < DISPOSE_BOUND
    assert len(refused) == 1
    assert not any(alive(pid) for pid in pids(record))


async def test_dispose_while_a_server_is_being_restarted(tmp_path: Path) -> None:
    """Its first start fails at once; the restart hangs in initialize when dispose comes."""
    record = tmp_path / "record"
    spec = served("slow", "fail-once", str(tmp_path / "marker"), "silent", record=record)
    spec = msgspec.structs.replace(spec, start_timeout=20.0)
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
            assert [s.state for s in statuses] == ["failed"]
            await until(lambda: len(pids(record)) == 2, "it is started again")
            before = time.monotonic()
            await handle.dispose()
            assert time.monotonic() - before < DISPOSE_BOUND
            assert [s.state for s in statuses] == ["failed"]  # the stop is not a failure
            assert not any(alive(pid) for pid in pids(record))


# -- what a server writes --------------------------------------------------------------


async def test_lines_that_are_not_json_rpc_are_skipped() -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "echo"), {"text": "hi"})], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", "garbage")]
            )
            assert [(s.state, s.tools) for s in statuses] == [("ready", 10)]
            handle.agent.send("echo")
            await handle.agent.when_idle()
            assert results(handle.agent)[0].content == "echo: hi"


async def test_bytes_that_are_not_utf8_do_not_deafen_the_connection(tmp_path: Path) -> None:
    """The SDK's transport stopped reading for good at such a byte: the call waited forever
    while the server was shown ready."""
    record = tmp_path / "record"
    model = ScriptedModel(
        [
            [CallTool(tool_name("h", "garble"))],
            [CallTool(tool_name("h", "echo"), {"text": "still"})],
            [Say("ok")],
        ]
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)]
            )
            handle.agent.send("garble")
            with trio.fail_after(5):
                await handle.agent.when_idle()
            garbled, echoed = results(handle.agent)
            assert (garbled.content, garbled.is_error) == ("done", False)
            assert echoed.content == "echo: still"
            assert len(pids(record)) == 1  # not even restarted


async def test_a_giant_result_is_read_in_linear_time_and_cut_for_the_model() -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "giant"), {"mb": 25})], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h")]
            )
            before = time.monotonic()
            handle.agent.send("giant")
            await handle.agent.when_idle()
            assert time.monotonic() - before < 5.0  # the SDK's reader took ~4 s for 25 MB
            (result,) = results(handle.agent)
            assert not result.is_error
            assert result.content.startswith("g" * 1000)
            marker = f"[{25_000_000 - MAX_RESULT} of 25000000 characters were cut here;"
            assert marker in result.content


async def test_a_line_past_the_bound_ends_the_connection_not_the_process(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record"
    model = ScriptedModel(
        [
            [CallTool(tool_name("h", "giant"), {"mb": 40})],
            [CallTool(tool_name("h", "echo"), {"text": "back"})],
            [Say("ok")],
        ]
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)]
            )
            handle.agent.send("giant")
            await until(lambda: statuses[-1].state == "failed", "the connection ended")
            assert "wrote a line longer than 33554432 bytes" in statuses[-1].message
            await until(lambda: statuses[-1].state == "ready", "it is restarted")
            await handle.agent.when_idle()
            giant = results(handle.agent)[0]
            assert giant.is_error
            assert giant.error is not None
            assert giant.error.code == "mcp-unavailable"
            assert ends(handle.agent)[-1].reason == Completed()


async def test_requests_and_bad_notifications_from_a_server_are_harmless() -> None:
    model = ScriptedModel(
        [
            [CallTool(tool_name("h", "asks"))],
            [CallTool(tool_name("h", "malformed"))],
            [CallTool(tool_name("h", "echo"), {"text": "x"})],
            [Say("ok")],
        ]
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h")]
            )
            handle.agent.send("go")
            await handle.agent.when_idle()
            asked, malformed, echoed = results(handle.agent)
            assert (asked.content, asked.is_error) == ("done", False)
            # A result of the wrong shape is the server's protocol error, naming it.
            assert malformed.is_error
            assert malformed.content.startswith("MCP server 'h': malformed answered a bad result")
            assert malformed.error is not None
            assert malformed.error.code == "mcp-error"
            assert echoed.content == "echo: x"
            assert [s.state for s in statuses] == ["ready"]


# -- exits -----------------------------------------------------------------------------


async def test_a_server_exiting_mid_call_ends_the_call_and_comes_back(tmp_path: Path) -> None:
    record = tmp_path / "record"
    model = ScriptedModel(
        [
            [CallTool(tool_name("h", "die"))],
            [Say("it died")],
            [CallTool(tool_name("h", "echo"), {"text": "again"})],
            [Say("ok")],
        ]
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)]
            )
            handle.agent.send("die")
            await handle.agent.when_idle()
            (died,) = results(handle.agent)
            assert died.is_error
            assert "closed its connection during die" in died.content
            assert ends(handle.agent)[-1].reason == Completed()
            await until(lambda: len(statuses) == 3, "it is restarted")
            assert [s.state for s in statuses] == ["ready", "failed", "ready"]
            assert statuses[-1].message == "back after a restart"
            first, _ = pids(record)
            assert not alive(first)
            handle.agent.send("again")
            await handle.agent.when_idle()
            assert results(handle.agent)[-1].content == "echo: again"


async def test_nothing_a_server_left_in_its_group_outlives_it(tmp_path: Path) -> None:
    """The server exits at the end of its stdin; the SDK then signalled nobody, and the
    child it had started (ignoring SIGTERM) ran on."""
    record = tmp_path / "record"
    model = ScriptedModel([[CallTool(tool_name("h", "spawn"))], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)]
            )
            handle.agent.send("spawn")
            await handle.agent.when_idle()
            (child,) = children(record)
            assert alive(child)
            await handle.dispose()
            try:
                # SIGKILLed, an orphan may take a moment to be gone.
                await until(lambda: not alive(child), "the child is gone", 1.0)
                assert not any(alive(pid) for pid in pids(record))
            finally:
                if alive(child):
                    os.kill(child, signal.SIGKILL)


async def test_a_server_killed_while_its_agent_is_disposed(tmp_path: Path) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a",
                session_id="s",
                mcp_servers=[served("stubborn", "ignore-eof", record=record)],
            )
            (pid,) = pids(record)
            before = time.monotonic()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.dispose)
                await trio.sleep(0.3)  # its stdin is closed; it ignores that
                os.kill(pid, signal.SIGKILL)
            assert time.monotonic() - before < 2.0
            assert [s.state for s in statuses] == ["ready"]
            assert [e.outcome for e in rt.supervisor.exits] == ["normal"]
            assert not alive(pid)


def calls(agent: Agent) -> list[ToolCall]:
    return [e for e in agent.session.events if isinstance(e, ToolCall)]


#: A tool argument larger than any pipe holds: its write blocks while the server does not read.
A_MEGABYTE = "x" * 1_000_000


async def test_a_server_that_stops_reading_holds_neither_a_cancel_nor_its_stop(
    tmp_path: Path,
) -> None:
    """A server that stopped reading its stdin, given 1 MB of arguments: the write of the
    call blocked, and the SDK's notifications/cancelled waited behind it (shielded, 5 s),
    so a cancel took 5 s, and a dispose 5 s more than its stop."""
    record = tmp_path / "record"
    call = CallTool(tool_name("deaf", "take"), {"text": A_MEGABYTE})
    model = ScriptedModel([[call], [call]])
    spec = served("deaf", "stops-reading", "stubborn", record=record)
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
            agent = handle.agent
            agent.send("take it")
            await until(lambda: len(calls(agent)) == 1, "the call began")
            await trio.sleep(0.3)  # its write is stuck in the pipe
            before = time.monotonic()
            agent.cancel("stop")
            await agent.when_idle()
            assert time.monotonic() - before < 0.5
            assert results(agent)[-1].error.code == "aborted"  # type: ignore[union-attr]
            agent.send("again")  # queued behind the first call's unread megabyte
            await until(lambda: len(calls(agent)) == 2, "the call began")
            await trio.sleep(0.3)
            (pid,) = pids(record)
            before = time.monotonic()
            await handle.dispose()  # the turn's cancel, then the server's stop
            assert time.monotonic() - before < DISPOSE_BOUND
            assert not alive(pid)


async def test_what_a_server_leaves_unread_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp_client, "MAX_UNREAD", 2_500_000)
    record = tmp_path / "record"
    call = CallTool(tool_name("deaf", "take"), {"text": A_MEGABYTE})
    model = ScriptedModel([[call], [call], [call], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            spec = served("deaf", "stops-reading", record=record)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
            agent = handle.agent
            for turn in (1, 2):
                agent.send("take it")
                await until(lambda n=turn: len(calls(agent)) == n, "the call began")
                await trio.sleep(0.3)
                agent.cancel("stop")
                await agent.when_idle()
            agent.send("once more")  # 3 MB would wait unread: the server stopped reading
            await agent.when_idle()
            refused = results(agent)[-1]
            assert refused.is_error
            assert "MCP server 'deaf'" in refused.content
            assert ends(agent)[-1].reason == Completed()  # the turn went on
            await until(lambda: len(pids(record)) == 2, "the server was started again")
    failed = [s for s in statuses if s.state == "failed"]
    assert failed
    assert "stopped reading its stdin (2,000," in failed[0].message


# -- tool lists ------------------------------------------------------------------------


async def test_a_flood_of_list_changed_lists_a_few_times_and_reports_nothing(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record"
    model = ScriptedModel([[CallTool(tool_name("h", "flood"), {"n": 20_000})], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)]
            )
            handle.agent.send("flood")
            await handle.agent.when_idle()
            assert results(handle.agent)[0].content == "done"
            await trio.sleep(0.5)
            assert [(s.state, s.tools) for s in statuses] == [("ready", 10)]  # nothing changed
    # Notices that arrive while a list is asked for are folded into the next one: 20,000 of
    # them are a handful of lists (counted by the server, not timed: a loaded machine is slow).
    lists = [line for line in record.read_text().splitlines() if line.startswith("listed ")]
    assert 1 < len(lists) <= 20


async def test_a_tool_the_server_no_longer_offers_is_not_offered() -> None:
    gone = tool_name("h", "gone")
    model = ScriptedModel(
        [[CallTool(tool_name("h", "shrink"))], [Say("shrunk")], [CallTool(gone)], [Say("ok")]]
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h")]
            )
            handle.agent.send("shrink")
            await handle.agent.when_idle()
            await until(lambda: statuses[-1].tools == 9, "the list is shorter")
            handle.agent.send("call the gone one")
            await handle.agent.when_idle()
            assert gone not in {tool.name for tool in model.requests[-1].tools}
            unknown = results(handle.agent)[-1]
            assert unknown.error is not None
            assert unknown.error.code == "unknown-tool"


async def test_a_changed_list_that_never_comes_fails_the_server(tmp_path: Path) -> None:
    """Else the tools it said had changed (``gone`` among them) stayed offered for good."""
    record = tmp_path / "record"
    model = ScriptedModel([[CallTool(tool_name("h", "shrink"))], [Say("ok")]])
    # Its first start must fit in the timeout too: 5 s holds on a loaded machine (1 s did not).
    spec = hostile("h", "relist-hangs", record=record, start_timeout=5.0)
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
            handle.agent.send("shrink")
            await handle.agent.when_idle()
            await until(lambda: statuses[-1].state == "failed", "it failed")
            assert statuses[-1].message == (
                "McpServerError: did not list its changed tools within 5 s"
            )
            await until(lambda: statuses[-1].state == "ready", "it is restarted")
            assert len(pids(record)) == 2


async def test_a_tool_list_without_end_fails_the_server(tmp_path: Path) -> None:
    record = tmp_path / "record"
    model = ScriptedModel([[CallTool(tool_name("h", "flood"), {"n": 1})], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", "endless", record=record)]
            )
            handle.agent.send("flood")
            await handle.agent.when_idle()
            await until(lambda: statuses[-1].state == "failed", "it failed")
            assert statuses[-1].message == "McpServerError: listed more than 100 pages of tools"
            await until(lambda: statuses[-1].state == "ready", "it is restarted")


async def test_odd_tool_names_are_offered_safe_and_what_is_counted_is_offered() -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "ünï"))], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[hostile("h", "names")]
            )
            handle.agent.send("call it")
            await handle.agent.when_idle()
            offered = [t.name for t in model.requests[0].tools if t.name.startswith("mcp__")]
            # 'a.b' and 'a b' meet in one name: the first listed keeps it.
            assert offered.count("mcp__h__a_b") == 1
            a_b = next(t for t in model.requests[0].tools if t.name == "mcp__h__a_b")
            assert a_b.description == "'a.b'"
            assert all(len(name) <= 64 for name in offered)
            assert statuses[-1].tools == len(offered) == 13
            assert results(handle.agent)[0].content == "done"


# -- HTTP ------------------------------------------------------------------------------


async def test_an_http_server_that_died_is_reported_and_reconnected(tmp_path: Path) -> None:
    """Its calls failed with the server shown ready, and every later one too: nothing
    ended the connection, so it was never initialized again."""
    record = tmp_path / "record"
    web = "web"
    model = ScriptedModel(
        [
            [CallTool(tool_name(web, "block"), {"tag": "t1"})],
            [Say("it died")],
            [CallTool(tool_name(web, "echo"), {"text": "back"})],
            [Say("ok")],
        ]
    )
    port = free_port()
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            with http_server(record, port) as url:
                spec = McpHttpServer(name=web, url=url)
                handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
                handle.agent.send("block")
                await until(lambda: "started t1" in record.read_text(), "the call started")
                os.kill(pids(record)[0], signal.SIGKILL)
                await handle.agent.when_idle()
                (died,) = results(handle.agent)
                assert died.is_error
                assert ends(handle.agent)[-1].reason == Completed()
                await until(lambda: statuses[-1].state == "failed", "it is reported")
            with http_server(record, port):
                await until(lambda: statuses[-1].state == "ready", "it is back", 20)
                assert statuses[-1].message == "back after a restart"
                handle.agent.send("again")
                await handle.agent.when_idle()
                assert results(handle.agent)[-1].content == "echo: back"
                await handle.dispose()


async def test_an_http_server_that_forgot_the_session_is_reconnected(tmp_path: Path) -> None:
    """A new server process on the same address answers 404 to the old session's calls."""
    record = tmp_path / "record"
    web = "web"
    call = CallTool(tool_name(web, "echo"), {"text": "x"})
    model = ScriptedModel([[call], [Say("one")], [call], [Say("two")], [call], [Say("three")]])
    port = free_port()
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            with http_server(record, port) as url:
                spec = McpHttpServer(name=web, url=url)
                handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
                handle.agent.send("one")
                await handle.agent.when_idle()
            with http_server(record, port):
                handle.agent.send("two")
                await handle.agent.when_idle()
                assert results(handle.agent)[-1].is_error
                await until(lambda: len(statuses) == 3, "it is back")
                assert [s.state for s in statuses] == ["ready", "failed", "ready"]
                assert "forgot its session (HTTP 404)" in statuses[1].message
                handle.agent.send("three")
                await handle.agent.when_idle()
                assert results(handle.agent)[-1].content == "echo: x"
                await handle.dispose()


# -- specs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["my server", "my_server"], "mcpServers[1].name: 'my_server' would name its tools like"),
        (["a__b", "a"], "mcpServers[1].name: 'a' would name its tools like mcpServers[0]"),
        (["x", "x "], "mcpServers[1].name: 'x ' would name its tools like mcpServers[0] ('x')"),
        (["日本", "中国"], "mcpServers[1].name: '中国' would name its tools like"),
    ],
)
async def test_servers_whose_tools_could_be_named_alike_are_refused(
    names: list[str], message: str
) -> None:
    """Else one server's tools silently replaced the other's (``a``'s ``b__c`` and
    ``a__b``'s ``c`` are both ``mcp__a__b__c``) while each was reported with all of its."""
    servers = [McpStdioServer(name=name, command="x") for name in names]
    async with open_runtime() as rt:
        with pytest.raises(ValueError, match=re.escape(message)):
            await rt.agents.create(agent_id="a", session_id="s", mcp_servers=servers)
        assert rt.agents.list() == []


async def test_names_that_only_look_alike_are_accepted() -> None:
    servers = [
        McpStdioServer(name=name, command=sys.executable, args=["-c", ""])
        for name in ("github", "github_enterprise", "a_b", "a-b", "a")
    ]
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=servers)
            await handle.dispose()


def test_acp_servers_whose_tools_could_be_named_alike_are_invalid_params() -> None:
    entries: list[dict[str, object]] = [
        {"name": name, "command": "x", "args": [], "env": []} for name in ("my server", "my_server")
    ]
    with pytest.raises(RpcError) as refused:
        servers_from_acp(entries)  # type: ignore[arg-type]
    assert refused.value.code == -32602
    assert refused.value.message == (
        "invalid params: mcpServers[1].name: 'my_server' would name its tools like"
        " mcpServers[0] ('my server') does"
    )


# -- many sessions ---------------------------------------------------------------------


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> list[int]:
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(entry))
    return found


async def test_sessions_created_and_disposed_in_a_loop_leave_nothing() -> None:
    call = CallTool(tool_name("h", "echo"), {"text": "x"})
    model = ScriptedModel([[call], [Say("ok")]] * 8)
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:

            async def session(index: int) -> None:
                handle = await rt.agents.create(
                    agent_id=f"a{index}", session_id=f"s{index}", mcp_servers=[hostile("h")]
                )
                handle.agent.send("echo")
                await handle.agent.when_idle()
                assert results(handle.agent)[0].content == "echo: x"
                await handle.dispose()

            await session(0)  # the SDK's first imports and caches
            gc.collect()
            descriptors, processes = _descriptors(), _children()
            for index in range(1, 8):
                await session(index)
            gc.collect()
            assert _descriptors() == descriptors
            # The runtime's sandbox launcher is its one child process, started at the first.
            assert _children() == processes == launchers_of(os.getpid())
            # Nothing of the sessions' servers stays: on a loaded machine a task of the last
            # one may still be letting go of it as its dispose returns, so it gets a moment.
            for _ in range(50):
                gc.collect()
                kept = [
                    type(o).__name__
                    for o in gc.get_objects()
                    if isinstance(o, SessionMcp | ServerSlot | McpConnection)
                ]
                if not kept:
                    break
                await trio.sleep(0.1)
            assert kept == []
            assert {e.outcome for e in rt.supervisor.exits} == {"normal"}
