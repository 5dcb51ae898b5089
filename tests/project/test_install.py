"""The newcomer's path: install greenroom as ``make demo`` does, into a fresh virtualenv, and
run the README's ``greenroom acp --model openai:MODEL`` against a loopback model server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from tests import ROOT
from tests.acp_process import acp_process
from tests.sse_server import Served, sse_server
from tests.wire import openai_text


@pytest.mark.real_clock
async def test_a_fresh_install_serves_a_real_model(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    with trio.fail_after(600):
        await trio.run_process([sys.executable, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        await trio.run_process([*pip, "--disable-pip-version-check", "-e", str(ROOT)])
        async with sse_server([Served(pieces=openai_text("Hello from the model."))]) as server:
            env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.url}
            async with acp_process(
                tmp_path / "home",
                "--model",
                "openai:gpt-test",
                env=env,
                greenroom=[str(venv / "bin" / "greenroom")],
            ) as agent:
                session = await agent.new_session(str(tmp_path))
                answer = await agent.prompt(session, "hi")
                assert answer["result"] == {
                    "stopReason": "end_turn",
                    "usage": {"totalTokens": 128, "inputTokens": 120, "outputTokens": 8},
                }
                chunks = [
                    f["params"]["update"]["content"]["text"]
                    for f in agent.frames
                    if f.get("method") == "session/update"
                    and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                ]
                assert "".join(chunks) == "Hello from the model."
                assert await agent.close() == 0
            assert server.requests[0].body["model"] == "gpt-test"
