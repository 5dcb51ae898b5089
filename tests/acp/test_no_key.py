"""``greenroom acp --model anthropic:M`` without its API key: the editor gets ``initialize`` (it
used to exit 2 before it), and a prompt to that model is refused with the reason (a new session
on it is refused -32000 until a login: tests/acp/test_login.py).

Driven by the official ACP Python SDK (asyncio), against a real ``greenroom acp`` process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import acp
import pytest

LIMIT = 30.0  # seconds


class Quiet:
    """A client that expects nothing of the agent but updates."""

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(self, **kwargs: Any) -> Any:
        raise AssertionError("nothing should ask permission")

    def on_connect(self, conn: Any) -> None:
        pass


async def _scenario(home: Path, work: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["GREENROOM_HOME"] = str(home)
    command = (
        *(sys.executable, "-m", "greenroom", "acp"),
        *("--model", "scripted", "--model", "anthropic:claude-x"),
    )
    async with acp.spawn_agent_process(Quiet(), *command, env=env, cwd=work) as (conn, process):
        init = await conn.initialize(protocol_version=1)
        assert init.protocol_version == 1
        session = await conn.new_session(cwd=str(work), mcp_servers=[])
        await conn.set_config_option(
            session_id=session.session_id, config_id="model", value="anthropic:claude-x"
        )
        with pytest.raises(acp.RequestError) as refused:
            await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("hi")])
        assert refused.value.code == -32603
        assert "ANTHROPIC_API_KEY" in str(refused.value.data or refused.value)
        assert process.returncode is None  # still serving


def test_a_missing_key_is_told_at_the_prompt_not_as_an_exit(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    asyncio.run(asyncio.wait_for(_scenario(tmp_path / "home", work), LIMIT))
