"""What an embedder sees of a turn that failed without reading its answer: a warning naming the
agent, its session and the error (the README's example once exited 0 with both turns failed)."""

from __future__ import annotations

import logging

import pytest

from greenroom import open_runtime
from greenroom.models import Fail, Say, ScriptedModel


async def test_a_failed_turn_is_a_warning_naming_the_agent_and_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ScriptedModel([[Fail("ConnectError: api.example.com unreachable")], [Say("fine")]])
    caplog.set_level(logging.WARNING, logger="greenroom.agent")
    async with open_runtime(model=model) as rt:
        handle = await rt.agents.create(agent_id="coder", session_id="s-coder")
        failed = await handle.agent.run("first")
        fine = await handle.agent.run("second")
    assert failed.stop_reason == "error"
    assert fine.stop_reason == "completed"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "agent 'coder' (session 's-coder'): turn 1 failed:"
        " ConnectError: api.example.com unreachable"
    ]
