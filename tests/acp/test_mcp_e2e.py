"""End to end: an editor (the official ACP SDK client) gives ``greenroom acp`` MCP servers.

The servers are real processes started by greenroom; every path by which a
session ends (``session/close``, the end of stdin, SIGTERM) must leave none.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import acp
import pytest
import trio
from acp import schema

from greenroom.tools.mcp import tool_name
from tests.acp.test_e2e import Recorder, text
from tests.acp_process import acp_process
from tests.tools.test_mcp import SERVERS, TIME_SERVER, alive, pids

LIMIT = 30.0
#: The SDK's grace after closing stdin before it terminates us: our bound on exit (5 s).
EXIT = {"shutdown_timeout": 5.0}


def _spawn(recorder: Recorder, home: Path) -> Any:
    """``greenroom acp`` under the SDK client, given our exit bound (`EXIT`) to end in."""
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    return acp.spawn_agent_process(
        recorder, *command, env={"GREENROOM_HOME": str(home)}, cwd=home, transport_kwargs=EXIT
    )


def _served(name: str, record: Path) -> schema.McpServerStdio:
    return schema.McpServerStdio(
        name=name,
        command=sys.executable,
        args=[str(SERVERS), "stdio"],
        env=[schema.EnvVariable(name="MCP_RECORD", value=str(record))],
    )


async def _ready(conn: Any, recorder: Recorder, session: str, name: str) -> None:
    """Until the session's server `name` is ready: session/new waits 2 s for its servers,
    and a server not ready by then is told slow right after the answer, then ready."""
    await conn.list_sessions()  # answered after the notices that follow new's answer
    if f"{name!r} is not ready" in recorder.text(session):
        while f"{name!r} is ready" not in recorder.text(session):
            await asyncio.sleep(0.02)


async def _gone(pid: int) -> None:
    while alive(pid):
        await asyncio.sleep(0.02)


def test_an_editors_mcp_server_is_called_and_rendered(tmp_path: Path) -> None:
    async def scenario() -> None:
        recorder = Recorder()
        async with _spawn(recorder, tmp_path) as (conn, _):
            init = await conn.initialize(protocol_version=1)
            assert init.agent_capabilities is not None
            mcp = init.agent_capabilities.mcp_capabilities
            assert mcp is not None
            assert mcp.http is True
            time_server = schema.McpServerStdio(name="time", command=TIME_SERVER, args=[], env=[])
            session = (
                await conn.new_session(cwd=str(tmp_path), mcp_servers=[time_server])
            ).session_id
            await _ready(conn, recorder, session, "time")
            asked = "tool: mcp__time__get_current_time " + json.dumps({"timezone": "UTC"})
            answer = await conn.prompt(session_id=session, prompt=text(asked))
            assert answer.stop_reason == "end_turn"
            updates = [u for s, u in recorder.updates if s == session]
            (start,) = [u for u in updates if isinstance(u, schema.ToolCallStart)]
            assert start.title == "get_current_time (time)"
            assert start.kind == "read"
            done = [
                u
                for u in updates
                if isinstance(u, schema.ToolCallProgress) and u.status == "completed"
            ]
            (finished,) = done
            assert finished.tool_call_id == start.tool_call_id
            shown = json.dumps([c.model_dump() for c in finished.content or []])
            assert "UTC" in shown
            assert "datetime" in shown

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))


def test_a_server_that_fails_to_start_is_told_to_the_editor(tmp_path: Path) -> None:
    async def scenario() -> None:
        recorder = Recorder()
        async with _spawn(recorder, tmp_path) as (conn, _):
            await conn.initialize(protocol_version=1)
            missing = schema.McpServerStdio(
                name="missing", command=str(tmp_path / "no-such-server"), args=[], env=[]
            )
            session = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[missing])).session_id
            # Under load the start may outlast the session's 2 s wait: told "not ready"
            # first, then the failure.
            while "MCP server 'missing' failed" not in recorder.text(session):
                await asyncio.sleep(0.02)
            # The session goes on without the server's tools.
            answer = await conn.prompt(session_id=session, prompt=text("still here"))
            assert answer.stop_reason == "end_turn"

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))


def test_no_server_outlives_its_session_by_close_eof_or_sigterm(tmp_path: Path) -> None:
    record = tmp_path / "record"

    async def scenario() -> None:
        recorder = Recorder()
        # session/close, then the end of stdin.
        async with _spawn(recorder, tmp_path) as (conn, process):
            await conn.initialize(protocol_version=1)
            closed = await _new(conn, tmp_path, "closed", record)
            (closed_pid,) = pids(record)
            await conn.close_session(session_id=closed)
            await asyncio.wait_for(_gone(closed_pid), 6)
            await _new(conn, tmp_path, "at-eof", record)
            eof_pid = pids(record)[-1]
            assert alive(eof_pid)
        assert await asyncio.wait_for(process.wait(), 10) == 0
        assert not alive(eof_pid)
        # SIGTERM.
        async with _spawn(recorder, tmp_path) as (conn, process):
            await conn.initialize(protocol_version=1)
            await _new(conn, tmp_path, "at-sigterm", record)
            term_pid = pids(record)[-1]
            assert alive(term_pid)
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 10) == 0
            assert not alive(term_pid)

    asyncio.run(asyncio.wait_for(scenario(), 2 * LIMIT))


async def _new(conn: Any, cwd: Path, name: str, record: Path) -> str:
    """A session with the server `name`, once that server has started (recorded its pid:
    session/new does not wait more than 2 s for it)."""
    started = len(pids(record))
    answer = await conn.new_session(cwd=str(cwd), mcp_servers=[_served(name, record)])
    while len(pids(record)) == started:
        await asyncio.sleep(0.02)
    return str(answer.session_id)


def _update(session: str, kind: str, text: str = "") -> Callable[[dict[str, Any]], bool]:
    """An update of `session` of `kind` (``sessionUpdate``) that holds `text`."""

    def check(frame: dict[str, Any]) -> bool:
        if frame.get("method") != "session/update" or frame["params"]["sessionId"] != session:
            return False
        return frame["params"]["update"]["sessionUpdate"] == kind and text in json.dumps(frame)

    return check


@pytest.mark.real_clock
async def test_a_server_that_stops_reading_holds_neither_the_cancel_nor_the_exit(
    tmp_path: Path,
) -> None:
    """Measured on `greenroom acp` before: with 1 MB of arguments to a server that stopped
    reading its stdin, session/cancel was answered after 5.0 s and the process exited 7.2 s
    after the end of its input."""
    record = tmp_path / "record"
    server = {
        "name": "deaf",
        "command": sys.executable,
        "args": [str(SERVERS), "stops-reading"],
        "env": [{"name": "MCP_RECORD", "value": str(record)}],
    }
    arguments = json.dumps({"text": "x" * 1_000_000})
    with trio.fail_after(LIMIT):
        async with acp_process(tmp_path, "--model", "scripted:0") as agent:
            answer = await agent.call("session/new", {"cwd": str(tmp_path), "mcpServers": [server]})
            session = answer["result"]["sessionId"]
            await agent.call("session/list", {})  # answered after the notices new's answer led
            told = [f for f in agent.frames if "'deaf' is not ready" in json.dumps(f)]
            if told:  # a slow start: it is told when ready
                await agent.until(_update(session, "agent_message_chunk", "'deaf' is ready"))
            (pid,) = pids(record)
            prompt = [{"type": "text", "text": f"tool: {tool_name('deaf', 'take')} {arguments}"}]
            asked = await agent.request("session/prompt", {"sessionId": session, "prompt": prompt})
            await agent.until(_update(session, "tool_call"))
            await trio.sleep(0.3)  # the call's megabyte is stuck in the server's stdin
            before = time.monotonic()
            cancel = {
                "jsonrpc": "2.0",
                "method": "session/cancel",
                "params": {"sessionId": session},
            }
            await agent.send_raw(json.dumps(cancel).encode() + b"\n")
            assert (await agent.response(asked))["result"] == {"stopReason": "cancelled"}
            assert time.monotonic() - before < 0.5
            before = time.monotonic()
            assert await agent.close() == 0
            assert time.monotonic() - before < 5.0
            assert not alive(pid)
