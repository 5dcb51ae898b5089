"""Slash commands over ACP, with the official SDK client (its schema models parse every
frame): the set after ``session/new`` and ``session/load`` and when it changes, and what
a prompt that begins with one runs. An MCP server's prompts (``tests/mcp_servers.py
prompts``, a real stdio process) become ``/<server>:<prompt>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import schema

from greenroom.acp.commands import arguments
from greenroom.tools.mcp import McpPrompt
from greenroom.tools.mcp.servers import McpPromptArgument
from tests import TESTS
from tests.acp_editor import Editor

LIMIT = 30.0
SERVERS = TESTS / "mcp_servers.py"


def prompts_server() -> schema.McpServerStdio:
    return schema.McpServerStdio(
        name="p", command=sys.executable, args=[str(SERVERS), "prompts"], env=[]
    )


async def _acp(tmp_path: Path, editor: Editor, body: Any) -> int:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir(exist_ok=True)
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    async with acp.spawn_agent_process(
        editor,
        *command,
        env={"GREENROOM_HOME": str(home)},
        cwd=work,
        transport_kwargs={"shutdown_timeout": 5.0},  # our bound on exit, not the SDK's 2 s
    ) as (conn, process):
        await conn.initialize(protocol_version=1, client_capabilities=schema.ClientCapabilities())
        await body(conn, str(work))
    return await asyncio.wait_for(process.wait(), 10)


def run(tmp_path: Path, editor: Editor, body: Any) -> None:
    assert asyncio.run(asyncio.wait_for(_acp(tmp_path, editor, body), LIMIT)) == 0


def say(words: str) -> list[Any]:
    return [acp.text_block(words)]


BUILT_IN = {
    "compact": "optional instructions",
    "mode": "default | accept-edits | read-only | full-access",
}


def test_the_built_in_commands_are_listed_after_new_and_run(tmp_path: Path) -> None:
    editor = Editor()

    async def body(conn: Any, work: str) -> None:
        session = (await conn.new_session(cwd=work, mcp_servers=[])).session_id
        answer = await conn.prompt(session_id=session, prompt=say("/mode read-only"))
        assert answer.stop_reason == "end_turn"
        with pytest.raises(acp.RequestError, match="unknown model 'nope'"):
            await conn.prompt(session_id=session, prompt=say("/model nope"))
        # An unknown /word is text for the model (the echo says it back).
        answer = await conn.prompt(session_id=session, prompt=say("/frobnicate the thing"))
        assert answer.stop_reason == "end_turn"

    run(tmp_path, editor, body)
    (commands,) = editor.command_sets()
    assert {k: commands[k] for k in BUILT_IN} == BUILT_IN
    assert commands["model"] == "scripted:0"
    modes = [u.current_mode_id for u in editor.updates if isinstance(u, schema.CurrentModeUpdate)]
    assert modes == ["read-only"]
    assert editor.said(notices=False) == "/frobnicate the thing"


def test_an_mcp_servers_prompts_are_commands_that_send_the_prompt(tmp_path: Path) -> None:
    editor = Editor()
    session = ""

    async def body(conn: Any, work: str) -> None:
        nonlocal session
        servers = [prompts_server()]
        session = (await conn.new_session(cwd=work, mcp_servers=servers)).session_id
        await editor.offers("p:review")
        prompt = say("/p:review path=a.py focus='the names'")
        answer = await conn.prompt(session_id=session, prompt=prompt)
        assert answer.stop_reason == "end_turn"
        with pytest.raises(acp.RequestError, match=r"missing argument.*path"):
            await conn.prompt(session_id=session, prompt=say("/p:review focus=x"))
        # The server adds a prompt and says so: the set is sent again with it.
        added = "tool: mcp__p__add_prompt " + json.dumps({"name": "hello"})
        await conn.prompt(session_id=session, prompt=say(added))
        await editor.offers("p:hello")
        answer = await conn.prompt(session_id=session, prompt=say("/p:hello"))
        assert answer.stop_reason == "end_turn"

    run(tmp_path, editor, body)
    sets = editor.command_sets()
    first = next(s for s in sets if "p:review" in s)
    last = sets[-1]
    assert first["p:review"] == "path=... [focus=...]"
    assert "p:hello" not in first
    assert last["p:hello"] is None  # no arguments, no hint
    said = editor.said(notices=False)
    assert "Please review a.py, looking at the names." in said
    assert "the hello prompt" in said

    # A load in a new process sends the set again, once its servers are up.
    loaded = Editor()

    async def load(conn: Any, work: str) -> None:
        await conn.load_session(cwd=work, session_id=session, mcp_servers=[prompts_server()])
        await loaded.offers("p:review")

    run(tmp_path, loaded, load)


def test_a_cancel_withdraws_a_server_prompt_being_got(tmp_path: Path) -> None:
    editor = Editor()

    async def body(conn: Any, work: str) -> None:
        session = (await conn.new_session(cwd=work, mcp_servers=[prompts_server()])).session_id
        await editor.offers("p:stall")
        by_session = asyncio.ensure_future(conn.prompt(session_id=session, prompt=say("/p:stall")))
        await asyncio.sleep(0.5)  # the server is asked, and never answers
        assert not by_session.done()
        await conn.cancel(session_id=session)
        assert (await asyncio.wait_for(by_session, 10)).stop_reason == "cancelled"
        # The session goes on; nothing of the withdrawn command was sent to the model.
        answer = await conn.prompt(session_id=session, prompt=say("still here"))
        assert answer.stop_reason == "end_turn"

    run(tmp_path, editor, body)
    assert editor.said(notices=False) == "still here"


def test_a_commands_arguments_are_read_by_name_or_whole() -> None:
    prompt = McpPrompt(
        "review",
        "",
        [McpPromptArgument("path", required=True), McpPromptArgument("focus")],
    )
    assert arguments(prompt, "path=a.py") == {"path": "a.py"}
    assert arguments(prompt, "path='a b.py' focus=x") == {"path": "a b.py", "focus": "x"}
    assert arguments(prompt, "src/a.py") == {"path": "src/a.py"}
    with pytest.raises(ValueError, match="unknown argument 'size'"):
        arguments(prompt, "path=a size=3")
    with pytest.raises(ValueError, match="missing argument"):
        arguments(prompt, "")
    with pytest.raises(ValueError, match="cannot read"):
        arguments(prompt, "path='open")
