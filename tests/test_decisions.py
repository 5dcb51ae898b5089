"""Decisions that wait: a permission or a question parks the turn in the log, answered later."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from greenroom import AgentOptions, open_runtime, tool
from greenroom.actors.decisions import DecisionRefused
from greenroom.actors.types import Defer
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import (
    DecisionMade,
    DecisionRequested,
    SessionEvent,
    ToolResult,
    TurnEnd,
)
from greenroom.tools.ask import ask_plugin

RAN: list[str] = []


@tool(kind="execute")
def deploy(target: str) -> str:
    """Deploy to a target.

    Args:
        target: Where to.
    """
    RAN.append(target)
    return f"deployed to {target}"


DEFER = AgentOptions(permissions=Defer())


def of(events: list[SessionEvent], kind: type) -> list[SessionEvent]:
    return [e for e in events if isinstance(e, kind)]


async def test_a_call_needing_permission_parks_until_the_embedder_decides() -> None:
    RAN.clear()
    model = ScriptedModel([[CallTool("deploy", {"target": "prod"})], [Say("done")]])
    async with open_runtime(model=model, tools=[deploy]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=DEFER)).agent
        prompt = agent.send("ship it")
        idle = agent.when_idle()
        await trio.sleep(1)
        assert agent.status == "waiting"
        (pending,) = prompt.pending
        assert (pending.kind, pending.tool, pending.arguments) == (
            "permission",
            "deploy",
            '{"target": "prod"}',
        )
        assert RAN == []
        with trio.move_on_after(60) as waited:
            await idle  # a waiting agent is not idle
        assert waited.cancelled_caught
        agent.decide(pending.decision_id, "allow_once")
        answer = await prompt
        events = list(agent.session.events)
    assert RAN == ["prod"]
    assert answer.text == "done"
    requested = of(events, DecisionRequested)
    made = of(events, DecisionMade)
    assert [e.decision_id for e in requested] == [pending.decision_id]
    assert [(e.answer, e.by) for e in made] == [("allow_once", "embedder")]
    assert requested[0].seq < made[0].seq < of(events, ToolResult)[0].seq


async def test_a_refusal_answer_refuses_the_call_and_bad_answers_are_refused_naming_why() -> None:
    RAN.clear()
    model = ScriptedModel([[CallTool("deploy", {"target": "prod"})], [Say("ok")]])
    async with open_runtime(model=model, tools=[deploy]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=DEFER)).agent
        prompt = agent.send("ship it")
        await trio.sleep(1)
        (pending,) = prompt.pending
        with pytest.raises(DecisionRefused, match="'maybe' is not an option"):
            agent.decide(pending.decision_id, "maybe")
        with pytest.raises(DecisionRefused, match="no open decision 'dec-nope'"):
            agent.decide("dec-nope", "allow_once")
        agent.decide(pending.decision_id, "reject_once", by="alice")
        with pytest.raises(DecisionRefused, match="answered already, by alice"):
            agent.decide(pending.decision_id, "allow_once")
        answer = await prompt
    assert RAN == []
    assert answer.tool_calls[0].is_error


async def test_a_question_parks_until_answered() -> None:
    model = ScriptedModel(
        [[CallTool("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]})]]
    )
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-ask", ask_plugin)
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=DEFER)).agent
        prompt = agent.send("paint it")
        await trio.sleep(1)
        (pending,) = prompt.pending
        assert (pending.kind, pending.question, pending.choices) == (
            "question",
            "Which colour?",
            ["red", "blue"],
        )
        with pytest.raises(DecisionRefused, match="none of the choices"):
            agent.decide(pending.decision_id, "green")
        agent.decide(pending.decision_id, "blue")
        answer = await prompt
    assert answer.tool_calls[0].result == "The user answered: blue"


class _OthersSteps(trio.abc.Instrument):
    """Counts the steps of every task but one (the test's own)."""

    def __init__(self, mine: trio.lowlevel.Task) -> None:
        self.mine = mine
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is not self.mine:
            self.steps += 1


async def test_a_parked_turn_takes_no_scheduler_pass() -> None:
    model = ScriptedModel([[CallTool("deploy", {"target": "prod"})]])
    async with open_runtime(model=model, tools=[deploy]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=DEFER)).agent
        prompt = agent.send("ship it")
        await trio.sleep(1)  # parked by now
        steps = _OthersSteps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            await trio.sleep(600)  # ten minutes of virtual time
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps == 0
        assert agent.status == "waiting"
        agent.cancel("enough")
        answer = await prompt
    assert answer.stop_reason == "aborted"


async def test_a_cancel_while_parked_aborts_the_turn_and_voids_the_decision() -> None:
    RAN.clear()
    model = ScriptedModel([[CallTool("deploy", {"target": "prod"})]])
    async with open_runtime(model=model, tools=[deploy]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=DEFER)).agent
        prompt = agent.send("ship it")
        await trio.sleep(1)
        (pending,) = prompt.pending
        agent.cancel("changed my mind")
        answer = await prompt
        with pytest.raises(DecisionRefused, match="no open decision"):
            agent.decide(pending.decision_id, "allow_once")
        events = list(agent.session.events)
    assert RAN == []
    assert (answer.stop_reason, answer.reason) == ("aborted", "changed my mind")
    assert of(events, DecisionMade) == []
    assert agent.session.decisions == {}
    assert "aborted" in of(events, ToolResult)[0].content  # type: ignore[union-attr]


async def test_a_dispose_while_parked_leaves_the_turn_open_in_the_log(tmp_path: Path) -> None:
    from greenroom.session.persistence import JsonlPersistence

    store = JsonlPersistence(tmp_path)
    model = ScriptedModel([[CallTool("deploy", {"target": "prod"})]])
    async with open_runtime(model=model, persistence=store, tools=[deploy]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", options=DEFER)
        prompt = handle.agent.send("ship it")
        await trio.sleep(1)
        (pending,) = prompt.pending
        await handle.dispose()
        answer = await prompt
    assert answer.stop_reason == "requires-action"
    assert answer.decisions == (pending,)
    _, stored = await store.load("s")
    assert of(stored, TurnEnd) == []  # parked: not closed
    assert of(stored, ToolResult) == []
    assert [e.decision_id for e in of(stored, DecisionRequested)] == [pending.decision_id]
