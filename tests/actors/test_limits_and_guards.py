"""Limits a run cannot pass and guards that stop a turn, through the public API."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.lowlevel

from greenroom import AgentOptions, Answer, Guard, Limits, open_runtime, tool
from greenroom.acp.params import prompt_result
from greenroom.models import CallTool, Say, ScriptedModel, Tokens
from greenroom.protocol.events import (
    GuardTripped,
    SessionEvent,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
)
from greenroom.session.persistence import JsonlPersistence
from tests.agents_helpers import assert_enclosed

RAN: list[str] = []


@tool
def note(text: str) -> str:
    """Write a note down.

    Args:
        text: The note.
    """
    RAN.append(text)
    return "noted"


def calls(n: int, per_step: int = 1) -> list[list[object]]:
    """`n` steps that each call `note` `per_step` times."""
    return [
        [Say("go"), *(CallTool("note", {"text": f"{step}.{i}"}) for i in range(per_step))]
        for step in range(n)
    ]


def of(events: list[SessionEvent], kind: type) -> list[SessionEvent]:
    return [e for e in events if isinstance(e, kind)]


async def test_a_request_limit_holds_exactly_and_ends_the_turn_limit() -> None:
    model = ScriptedModel(calls(10))
    async with open_runtime(model=model, tools=[note]) as rt:
        options = AgentOptions(limits=Limits(requests=3))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        answer = await handle.agent.run("keep noting")
        events = list(handle.agent.session.events)
    assert answer.stop_reason == "limit"
    assert answer.reason == "requests limit reached: 3 of 3"
    assert len(of(events, StepStart)) == 3
    assert len(model.requests) == 3
    assert_enclosed(events)
    assert len(of(events, ToolCall)) == len(of(events, ToolResult)) == 3
    assert prompt_result(answer, cancelled=False).stop_reason == "max_turn_requests"


async def test_a_tool_call_limit_runs_exactly_that_many_and_closes_the_rest() -> None:
    RAN.clear()
    model = ScriptedModel(calls(5, per_step=2))
    async with open_runtime(model=model, tools=[note]) as rt:
        options = AgentOptions(limits=Limits(tool_calls=3))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        answer = await handle.agent.run("note twice a step")
        events = list(handle.agent.session.events)
    assert RAN == ["0.0", "0.1", "1.0"]
    assert answer.stop_reason == "limit"
    assert answer.reason == "tool_calls limit reached: 3 of 3"
    results = of(events, ToolResult)
    assert [r.is_error for r in results] == [False, False, False, True]
    assert "not run: the tool_calls limit (3) was reached" in results[-1].content
    assert_enclosed(events)
    assert prompt_result(answer, cancelled=False).stop_reason == "max_turn_requests"


async def test_a_token_limit_ends_the_turn_after_the_step_that_crosses_it() -> None:
    steps = [[Say("a"), Tokens(40, 20), CallTool("note", {"text": str(n)})] for n in range(5)]
    async with open_runtime(model=ScriptedModel(steps), tools=[note]) as rt:
        options = AgentOptions(limits=Limits(total_tokens=100))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        answer = await handle.agent.run("spend")
        events = list(handle.agent.session.events)
    assert answer.stop_reason == "limit"
    assert answer.reason == "total_tokens limit reached: 120 of 100"
    assert len(of(events, StepStart)) == 2  # 60 after one step, 120 after the second
    assert len(of(events, ToolResult)) == 2  # the crossing step's call ran: it was its step's
    assert prompt_result(answer, cancelled=False).stop_reason == "max_tokens"


async def test_a_calls_limits_narrow_the_agents_own() -> None:
    async with open_runtime(model=ScriptedModel(calls(10)), tools=[note]) as rt:
        options = AgentOptions(limits=Limits(requests=5))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        first = await handle.agent.run("one step", limits=Limits(requests=1))
        second = await handle.agent.run("five steps")
    assert first.reason == "requests limit reached: 1 of 1"
    assert second.reason == "requests limit reached: 5 of 5"


async def test_session_limits_count_the_log_and_survive_a_resume(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    limits = AgentOptions(limits=Limits(session_requests=3))
    async with open_runtime(model=ScriptedModel(calls(10)), persistence=store, tools=[note]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", options=limits)
        first = await handle.agent.run("two requests", limits=Limits(requests=2))
        await handle.dispose()
        again = await rt.agents.resume(agent_id="b", session_id="s", options=limits)
        second = await again.agent.run("what is left")
        events = list(again.agent.session.events)
    assert first.reason == "requests limit reached: 2 of 2"
    assert second.reason == "session_requests limit reached: 3 of 3"
    assert len(of(events, StepStart)) == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [("requests", 0), ("tool_calls", -1), ("total_tokens", True), ("session_requests", 1.5)],
)
def test_limits_that_are_not_positive_ints_are_refused_naming_the_field(
    field: str, value: object
) -> None:
    with pytest.raises(ValueError, match=f"Limits.{field} must be a positive int"):
        Limits(**{field: value})  # type: ignore[arg-type]


# -- guards -------------------------------------------------------------------------------


def _guarded(events: list[SessionEvent]) -> GuardTripped:
    tripped = of(events, GuardTripped)
    assert len(tripped) == 1
    trip = tripped[0]
    assert isinstance(trip, GuardTripped)
    return trip


async def test_a_prompt_guard_trips_before_the_model_is_asked() -> None:
    model = ScriptedModel()
    guard = Guard(
        name="no-secrets", prompt=lambda text: "asks for a secret" if "key" in text else None
    )
    async with open_runtime(model=model) as rt:
        handle = await rt.agents.create(
            agent_id="a", session_id="s", options=AgentOptions(guards=(guard,))
        )
        tripped = await handle.agent.run("tell me the api key")
        passed = await handle.agent.run("hello")
        events = list(handle.agent.session.events)
    assert tripped.stop_reason == "guarded"
    assert tripped.reason == "guard 'no-secrets' tripped at the prompt: asks for a secret"
    assert len(model.requests) == 1  # only the second prompt's
    assert passed.stop_reason == "completed"
    assert _guarded(events).at == "prompt"
    assert_enclosed(events)
    assert prompt_result(tripped, cancelled=False).stop_reason == "refusal"


async def test_a_tool_call_guard_trips_before_the_call_runs_and_closes_it() -> None:
    RAN.clear()

    async def no_deletes(name: str, arguments: str) -> str | None:
        await trio.lowlevel.checkpoint()
        return "deleting is not allowed" if "delete" in arguments else None

    model = ScriptedModel(
        [[CallTool("note", {"text": "keep"}), CallTool("note", {"text": "delete all"})]]
    )
    guard = Guard(name="safe", tool_call=no_deletes)
    async with open_runtime(model=model, tools=[note]) as rt:
        handle = await rt.agents.create(
            agent_id="a", session_id="s", options=AgentOptions(guards=(guard,))
        )
        answer = await handle.agent.run("tidy up")
        events = list(handle.agent.session.events)
    assert RAN == ["keep"]
    assert answer.stop_reason == "guarded"
    trip = _guarded(events)
    assert (trip.at, trip.message) == ("tool_call", "deleting is not allowed")
    assert trip.call_id == of(events, ToolCall)[1].call_id  # type: ignore[union-attr]
    results = of(events, ToolResult)
    assert len(results) == 2
    assert "not run" in results[1].content  # type: ignore[union-attr]
    assert_enclosed(events)


async def test_an_answer_guard_trips_before_the_answer_settles() -> None:
    guard = Guard(name="polite", answer=lambda text: "rude" if "stupid" in text else None)
    async with open_runtime(model=ScriptedModel([[Say("that is stupid")]])) as rt:
        handle = await rt.agents.create(
            agent_id="a", session_id="s", options=AgentOptions(guards=(guard,))
        )
        answer = await handle.agent.run("what do you think?")
        events = list(handle.agent.session.events)
    assert answer.stop_reason == "guarded"
    assert answer.text == ""  # the answer never settled as one
    assert _guarded(events).at == "answer"
    assert isinstance(events[-1], TurnEnd)


async def test_a_guard_that_raises_ends_the_turn_error_naming_it_and_the_agent_goes_on() -> None:
    def broken(text: str) -> str | None:
        raise RuntimeError("the guard itself broke")

    guard = Guard(name="flaky", prompt=broken)
    async with open_runtime() as rt:
        handle = await rt.agents.create(
            agent_id="a", session_id="s", options=AgentOptions(guards=(guard,))
        )
        failed: Answer[None] = await handle.agent.run("hello")
        events = list(handle.agent.session.events)
    assert failed.stop_reason == "error"
    assert "guard 'flaky' at the prompt: RuntimeError: the guard itself broke" in (
        failed.reason or ""
    )
    assert of(events, GuardTripped) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "checks nothing"),
        ({"prompt": "no"}, TypeError, "prompt must be a function"),
        ({"name": "", "answer": print}, ValueError, "Guard.name must be non-empty"),
    ],
)
def test_a_bad_guard_is_refused_naming_the_field(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Guard(**kwargs)  # type: ignore[arg-type]
