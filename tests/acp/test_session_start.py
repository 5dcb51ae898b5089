"""A session starts at once whatever its MCP servers do (issue 28 item 5).

``session/new`` and ``load`` answer within `SERVER_WAIT` (2 s); a server not
ready by then goes on starting, the editor is told that it is slow and,
later, that it is ready, and its tools are offered from the next model step
on. The embedder's ``create(wait_for_servers=...)`` makes the same choice.
Real server processes (``tests/mcp_servers.py``), so the real clock.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import acp
import pytest
import trio
from acp import schema

from greenroom import open_runtime
from greenroom.acp.starts import SERVER_WAIT
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import ToolResult
from greenroom.protocol.mcp import McpStatus, McpStdioServer
from greenroom.tools.mcp import MCP_STATUS
from tests import TESTS
from tests.acp_editor import Editor

SERVERS = TESTS / "mcp_servers.py"
LIMIT = 60.0


def served(name: str, *mode: str) -> schema.McpServerStdio:
    return schema.McpServerStdio(
        name=name, command=sys.executable, args=[str(SERVERS), *mode], env=[]
    )


async def _acp(tmp_path: Path, editor: Editor, body: Any) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir(exist_ok=True)
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    # A server that ignores the end of its stdin costs greenroom's teardown its grace.
    async with acp.spawn_agent_process(
        editor,
        *command,
        env={"GREENROOM_HOME": str(home)},
        cwd=work,
        transport_kwargs={"shutdown_timeout": 15.0},
    ) as (conn, process):
        await conn.initialize(protocol_version=1, client_capabilities=schema.ClientCapabilities())
        await body(conn, str(work))
    assert await asyncio.wait_for(process.wait(), 15) == 0


def test_a_server_that_never_answers_does_not_hold_session_new(tmp_path: Path) -> None:
    editor = Editor()

    async def body(conn: Any, work: str) -> None:
        began = time.monotonic()
        answer = await conn.new_session(cwd=work, mcp_servers=[served("mute", "silent")])
        took = time.monotonic() - began
        assert SERVER_WAIT <= took < SERVER_WAIT + 5.0  # not the server's 30 s start_timeout
        await asyncio.wait_for(editor.told("'mute' is not ready after 2 s"), 5)
        # The session works meanwhile.
        reply = await conn.prompt(session_id=answer.session_id, prompt=[acp.text_block("hi")])
        assert reply.stop_reason == "end_turn"

    asyncio.run(asyncio.wait_for(_acp(tmp_path, editor, body), LIMIT))
    assert "its tools join once it is ready" in editor.said()


def test_a_slow_server_joins_when_ready_and_the_editor_is_told(tmp_path: Path) -> None:
    editor = Editor()

    async def body(conn: Any, work: str) -> None:
        began = time.monotonic()
        answer = await conn.new_session(cwd=work, mcp_servers=[served("slow", "slow-start", "8")])
        assert time.monotonic() - began < SERVER_WAIT + 5.0  # before the server could be up
        session = answer.session_id
        await asyncio.wait_for(editor.told("'slow' is ready"), 30)
        asked = "tool: mcp__slow__echo " + json.dumps({"text": "late"})
        reply = await conn.prompt(session_id=session, prompt=[acp.text_block(asked)])
        assert reply.stop_reason == "end_turn"

    asyncio.run(asyncio.wait_for(_acp(tmp_path, editor, body), LIMIT))
    said = editor.said()
    assert said.index("'slow' is not ready after 2 s") < said.index("after a slow start")
    results = [
        c.content.text
        for u in editor.updates
        if isinstance(u, schema.ToolCallProgress) and u.status == "completed"
        for c in u.content or []
        if isinstance(c, schema.ContentToolCallContent)
    ]
    assert results == ["echo: late"]


@pytest.mark.real_clock
async def test_create_can_go_live_without_waiting_its_tools_join_later() -> None:
    slow = McpStdioServer(
        name="slow", command=sys.executable, args=[str(SERVERS), "slow-start", "3"]
    )
    model = ScriptedModel(
        [[Say("first")], [CallTool("mcp__slow__echo", {"text": "x"}, call_id="e")], [Say("ok")]],
        delay=0,
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            states: list[McpStatus] = []
            rt.hooks.on(MCP_STATUS, lambda _agent, status: states.append(status))
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[slow], wait_for_servers=0
            )
            assert [s.state for s in states] == ["starting"]  # live before its server is up
            agent = handle.agent
            await agent.run("before")
            first = {t.name for t in model.requests[0].tools}
            while not any(s.state == "ready" for s in states):
                await trio.sleep(0.1)
            await agent.run("after")
    assert "mcp__slow__echo" not in first
    assert [(s.state, s.message) for s in states] == [
        ("starting", "not ready after 0 s; it goes on starting"),
        ("ready", "after a slow start"),
    ]
    result = next(e for e in agent.session.events if isinstance(e, ToolResult))
    assert result.content == "echo: x"
