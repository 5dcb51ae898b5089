"""`Prompt.on_settled`: the answer handed over synchronously as the agent settles a prompt."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from greenroom import Answer, open_runtime
from greenroom.actors.events import AGENT_TURN_END, AGENT_TURN_START
from greenroom.actors.types import Agent
from greenroom.models import Hang, Say, ScriptedModel
from greenroom.protocol.events import TurnEndReason
from tests.agents_helpers import new_agent


async def test_the_callback_gets_the_answer_before_the_turn_end_is_reported() -> None:
    seen: list[object] = []
    async with open_runtime(model=ScriptedModel(delay=0.01)) as rt:
        agent = await new_agent(rt)

        def turn_end(_agent: Agent, turn: int, _reason: TurnEndReason) -> None:
            seen.append(("turn-end", turn))

        def turn_start(_agent: Agent, turn: int) -> None:
            seen.append(("turn-start", turn))

        rt.hooks.on(AGENT_TURN_END, turn_end)
        rt.hooks.on(AGENT_TURN_START, turn_start)
        one, two = agent.send("one"), agent.send("two")
        one.on_settled(seen.append)
        two.on_settled(seen.append)
        await trio.testing.wait_all_tasks_blocked()  # the first turn takes both
        three = agent.send("three")
        three.on_settled(seen.append)
        answer = await three
        first = await one
    assert seen == [
        ("turn-start", 1),
        first,
        first,
        ("turn-end", 1),
        ("turn-start", 2),
        answer,
        ("turn-end", 2),
    ]
    assert (first.text, answer.text) == ("two", "three")


async def test_a_settled_prompt_calls_back_at_once_and_a_dropped_one_as_it_is_dropped() -> None:
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]])) as rt:
        agent = await new_agent(rt)
        running = agent.send("one")
        await trio.sleep(1)
        queued = agent.send("two")
        got: list[Answer[Any]] = []
        queued.on_settled(got.append)
        agent.cancel("changed my mind")
        assert got == [Answer(stop_reason="aborted", reason="changed my mind")]
        await running
        running.on_settled(got.append)
        assert got[1] == await running


async def test_a_second_callback_is_refused() -> None:
    async with open_runtime(model=ScriptedModel([[Hang()]])) as rt:
        prompt = (await new_agent(rt)).send("one")
        prompt.on_settled(lambda _answer: None)
        with pytest.raises(RuntimeError, match="already has a settle callback"):
            prompt.on_settled(lambda _answer: None)


async def test_a_raising_callback_is_logged_and_the_agent_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(_answer: Answer[Any]) -> None:
        raise ValueError("boom")

    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        one, two = agent.send("one"), agent.send("two")
        one.on_settled(broken)
        with caplog.at_level(logging.ERROR, logger="greenroom.actors"):
            assert (await two).stop_reason == "completed"  # settled beside the broken one
        assert (await one).stop_reason == "completed"
        assert (await agent.run("again")).text == "again"
    assert "settle callback raised" in caplog.text
