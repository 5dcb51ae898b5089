"""MCP servers owned by the session: real servers in real processes, on the real clock.

The published ``mcp-server-time`` (PyPI) and the SDK's own `MCPServer`
(``tests/mcp_servers.py``, over stdio and streamable HTTP) are the peers.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.actors.events import AGENT_ERROR
from greenroom.actors.types import Agent, PermissionRequest
from greenroom.models.scripted import CallTool, Say, ScriptedModel
from greenroom.protocol.events import Aborted, Completed, ToolCall, ToolResult, TurnEnd
from greenroom.protocol.mcp import (
    MAX_SERVERS,
    McpHttpServer,
    McpServerError,
    McpStatus,
    McpStdioServer,
    check_servers,
)
from greenroom.tools.mcp import MCP_STATUS, tool_name
from tests import TESTS

pytestmark = pytest.mark.real_clock

SERVERS = TESTS / "mcp_servers.py"
TIME_SERVER = str(Path(sys.executable).with_name("mcp-server-time"))
LIMIT = 30.0


def served(name: str, mode: str, *args: str, record: Path | None = None) -> McpStdioServer:
    """A test server; with a `record`, unsandboxed, since it writes the record where the test
    reads it (in a cgroup of its own all the same, where this process may make one)."""
    env = {"MCP_RECORD": str(record)} if record is not None else {}
    return McpStdioServer(
        name=name,
        command=sys.executable,
        args=[str(SERVERS), mode, *args],
        env=env,
        sandbox="full-access" if record is not None else None,
    )


def pids(record: Path) -> list[int]:
    if not record.exists():
        return []
    return [
        int(line.split()[1]) for line in record.read_text().splitlines() if line.startswith("pid ")
    ]


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def until(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    with trio.move_on_after(seconds):
        while not check():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out after {seconds} s waiting until {what}")


def results(agent: Agent) -> list[ToolResult]:
    return [e for e in agent.session.events if isinstance(e, ToolResult)]


def ends(agent: Agent) -> list[TurnEnd]:
    return [e for e in agent.session.events if isinstance(e, TurnEnd)]


def watch(rt: object) -> list[McpStatus]:
    statuses: list[McpStatus] = []
    rt.hooks.on(MCP_STATUS, lambda _agent, status: statuses.append(status))  # type: ignore[attr-defined]
    return statuses


async def test_a_published_server_over_stdio_through_a_whole_turn(tmp_path: Path) -> None:
    name = tool_name("time", "get_current_time")
    model = ScriptedModel([[CallTool(name, {"timezone": "Asia/Tokyo"})], [Say("it is late")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(
                agent_id="a",
                session_id="s",
                cwd=str(tmp_path),
                mcp_servers=[McpStdioServer(name="time", command=TIME_SERVER)],
            )
            agent = handle.agent
            agent.send("what time is it in Tokyo?")
            await agent.when_idle()
            offered = {tool.name: tool for tool in model.requests[0].tools}
            assert offered[name].parameters["required"] == ["timezone"]
            assert "convert_time" in "".join(offered)
            (call,) = [e for e in agent.session.events if isinstance(e, ToolCall)]
            assert (call.kind, call.title) == ("read", "get_current_time (time)")
            (result,) = results(agent)
            assert not result.is_error
            assert '"timezone": "Asia/Tokyo"' in result.content
            assert ends(agent)[-1].reason == Completed()


async def test_the_turns_cancel_ends_an_http_call_and_the_server_sees_it(tmp_path: Path) -> None:
    record = tmp_path / "record"
    model = ScriptedModel(
        [
            [CallTool(tool_name("web", "block"), {"tag": "t1"})],
            [CallTool(tool_name("web", "echo"), {"text": "still here"})],
        ]
    )
    with http_server(record) as url, trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            spec = McpHttpServer(name="web", url=url)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
            agent = handle.agent
            agent.send("block")
            await until(lambda: "started t1" in record.read_text(), "the call started")
            agent.cancel("stop it")
            await agent.when_idle()
            (result,) = results(agent)
            assert result.is_error
            assert result.error is not None
            assert result.error.code == "aborted"
            assert ends(agent)[-1].reason == Aborted("stop it")
            await until(lambda: "cancelled t1" in record.read_text(), "the server saw it")
            # The connection goes on: the next call is answered.
            agent.send("again")
            await agent.when_idle()
            assert results(agent)[-1].content == "echo: still here"


@contextmanager
def http_server(record: Path, port: int | None = None) -> Iterator[str]:
    """The test tools over streamable HTTP on loopback (on `port`, else a free one);
    yields the URL once it listens."""
    if port is None:
        port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SERVERS), "http", str(port)],
        env={**os.environ, "MCP_RECORD": str(record)},
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not _listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the HTTP server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def test_tools_follow_list_changed_and_results_keep_errors() -> None:
    t = "t"
    model = ScriptedModel(
        [
            [CallTool(tool_name(t, "grow"))],
            [Say("grown")],
            [CallTool(tool_name(t, "extra"))],
            [CallTool(tool_name(t, "fail"), {"message": "no luck"})],
            [CallTool(tool_name(t, "echo"), "[1, 2]")],
            [Say("done")],
        ]
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[served(t, "stdio")]
            )
            agent = handle.agent
            assert [(s.state, s.tools) for s in statuses] == [("ready", 7)]
            agent.send("grow")
            await agent.when_idle()
            await until(lambda: statuses[-1].tools == 8, "the new tool is offered")
            agent.send("use them")
            await agent.when_idle()
            assert tool_name(t, "extra") in {tool.name for tool in model.requests[-1].tools}
            extra, failed, bad = results(agent)[-3:]
            assert (extra.content, extra.is_error) == ("extra!", False)
            assert failed.is_error
            assert "no luck" in failed.content
            assert bad.is_error
            assert bad.error is not None
            assert bad.error.code == "invalid-arguments"
            assert ends(agent)[-1].reason == Completed()


class Refuse:
    def __init__(self) -> None:
        self.asked: list[PermissionRequest] = []

    async def decide(self, request: PermissionRequest) -> str:
        await trio.lowlevel.checkpoint()
        self.asked.append(request)
        return "reject_once"


async def test_a_tool_without_annotations_asks_before_it_runs() -> None:
    model = ScriptedModel(
        [
            [CallTool(tool_name("t", "write_note"), {"text": "x"})],
            [CallTool(tool_name("t", "echo"), {"text": "y"})],
        ]
    )
    policy = Refuse()
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model, permissions=policy) as rt:  # type: ignore[arg-type]
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[served("t", "stdio")]
            )
            handle.agent.send("note it")
            await handle.agent.when_idle()
            refused, echoed = results(handle.agent)
            (asked,) = policy.asked  # the read-only echo was not asked about
            assert (asked.tool, asked.kind) == (tool_name("t", "write_note"), "execute")
            assert refused.is_error
            assert "refused" in refused.content
            assert echoed.content == "echo: y"


async def test_a_servers_timeout_bounds_its_calls_and_tells_the_server(tmp_path: Path) -> None:
    record = tmp_path / "record"
    model = ScriptedModel([[CallTool(tool_name("t", "block"), {"tag": "slow"})], [Say("ok")]])
    spec = msgspec_replace(served("t", "stdio", record=record), timeout=0.5)
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
            handle.agent.send("block")
            await handle.agent.when_idle()
            (result,) = results(handle.agent)
            assert result.is_error
            assert "timed out after 0.5 s" in result.content
            assert ends(handle.agent)[-1].reason == Completed()
            await until(lambda: "cancelled slow" in record.read_text(), "the server saw it")


def msgspec_replace(spec: McpStdioServer, **changes: object) -> McpStdioServer:
    return msgspec.structs.replace(spec, **changes)


async def test_a_server_that_fails_its_start_is_reported_and_restarted(tmp_path: Path) -> None:
    marker = tmp_path / "started-once"
    model = ScriptedModel([[CallTool(tool_name("flaky", "echo"), {"text": "back"})]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            errors: list[Exception] = []
            rt.hooks.on(AGENT_ERROR, lambda _a, _t, _s, exc: errors.append(exc))
            handle = await rt.agents.create(
                agent_id="a",
                session_id="s",
                cwd=str(tmp_path),  # where its sandbox lets the server leave its marker
                mcp_servers=[served("flaky", "fail-once", str(marker))],
            )
            # The session is live while its server is down.
            assert [s.state for s in statuses] == ["failed"]
            assert "flaky" in statuses[0].describe()
            (error,) = errors
            assert isinstance(error, McpServerError)
            assert error.server == "flaky"
            await until(lambda: statuses[-1].state == "ready", "it is restarted")
            assert statuses[-1].message == "back after a restart"
            handle.agent.send("call it")
            await handle.agent.when_idle()
            assert results(handle.agent)[0].content == "echo: back"


async def test_a_server_killed_mid_session_comes_back_with_its_tools(tmp_path: Path) -> None:
    record = tmp_path / "record"
    model = ScriptedModel([[CallTool(tool_name("t", "echo"), {"text": "again"})]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[served("t", "stdio", record=record)]
            )
            (first,) = pids(record)
            os.kill(first, signal.SIGKILL)
            await until(lambda: statuses[-1].state == "failed", "the crash is reported")
            await until(lambda: statuses[-1].state == "ready", "it is restarted")
            second = pids(record)[-1]
            assert second != first
            assert alive(second)
            assert not alive(first)
            handle.agent.send("call it")
            await handle.agent.when_idle()
            assert results(handle.agent)[0].content == "echo: again"


async def test_a_server_that_keeps_failing_is_given_up_and_the_session_goes_on() -> None:
    dead = McpStdioServer(name="dead", command=sys.executable, args=["-c", "raise SystemExit(3)"])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=ScriptedModel(delay=0)) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[dead])
            await until(lambda: statuses[-1].state == "gave-up", "it is given up", 20)
            assert [s.state for s in statuses] == ["failed"] * 4 + ["gave-up"]
            handle.agent.send("hello")
            await handle.agent.when_idle()
            assert ends(handle.agent)[-1].reason == Completed()


async def test_dispose_leaves_no_server_process_even_one_ignoring_eof(tmp_path: Path) -> None:
    record = tmp_path / "record"
    servers = [
        served("one", "stdio", record=record),
        served("two", "stdio", record=record),
        served("stubborn", "ignore-eof", record=record),
    ]
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=servers)
            started = pids(record)
            assert len(started) == 3
            assert all(alive(pid) for pid in started)
            before = trio.current_time()
            await handle.dispose()
            took = trio.current_time() - before
            assert not any(alive(pid) for pid in started)
            assert took < 6.0  # EOF, 2 s, SIGTERM (ignored), 2 s, SIGKILL


async def test_the_owner_closing_stops_the_servers(tmp_path: Path) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[served("t", "stdio", record=record)]
            )
            (pid,) = pids(record)
            assert alive(pid)
    assert not alive(pid)


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ([McpStdioServer(name="", command="x")], "mcpServers[0].name: must not be empty"),
        (
            [McpStdioServer(name="a", command="x"), McpStdioServer(name="a", command="y")],
            "mcpServers[1].name: 'a' is given twice",
        ),
        ([McpStdioServer(name="a", command="")], "mcpServers[0].command: must not be empty"),
        (
            [McpStdioServer(name="a", command="x\x00")],
            "mcpServers[0].command: must not contain NUL",
        ),
        ([McpHttpServer(name="a", url="ftp://x")], "mcpServers[0].url: 'ftp://x' is not"),
        ([McpStdioServer(name="a", command="x", timeout=0)], "mcpServers[0].timeout: must be"),
        ([McpStdioServer(name="a", command="x", env={"A=B": "c"})], "mcpServers[0].env: 'A=B'"),
    ],
)
async def test_a_bad_server_spec_is_refused_before_anything_exists(
    servers: list[McpStdioServer | McpHttpServer], message: str
) -> None:
    async with open_runtime() as rt:
        with pytest.raises(ValueError, match=re.escape(message)):
            await rt.agents.create(agent_id="a", session_id="s", mcp_servers=servers)
        assert rt.agents.list() == []
        assert rt.sessions.get("s") is None


def test_tool_names_are_namespaced_safe_and_stable() -> None:
    assert tool_name("time", "get_current_time") == "mcp__time__get_current_time"
    assert tool_name("my server", "do.it") == "mcp__my_server__do_it"
    long = tool_name("s" * 40, "t" * 40)
    assert len(long) == 64
    assert long == tool_name("s" * 40, "t" * 40)
    assert long != tool_name("s" * 40, "t" * 39 + "u")


def test_a_session_may_have_max_servers_and_not_one_more() -> None:
    servers = [McpStdioServer(name=f"s{i}", command="x") for i in range(MAX_SERVERS + 1)]
    check_servers(servers[:MAX_SERVERS])
    with pytest.raises(ValueError, match=f"{MAX_SERVERS + 1} servers given"):
        check_servers(servers)
