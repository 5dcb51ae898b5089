"""Decisions that wait: a permission or a question parks the turn in the log, answered later."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from greenroom import AgentOptions, open_runtime, tool
from greenroom.actors.decisions import DecisionRefused
from greenroom.actors.types import Defer
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import (
    DecisionMade,
    DecisionRequested,
    SessionEvent,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnResumed,
)
from greenroom.session.persistence import PersistenceError
from greenroom.tools.ask import ask_plugin
from tests.persistence_helpers import Delegating, DelegatingLog

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


async def test_a_question_parked_by_a_dispose_is_asked_again_at_resume(tmp_path: Path) -> None:
    """The ask_user call had started (asking is all it does): it is asked again, not cut."""
    from greenroom.session.persistence import JsonlPersistence

    store = JsonlPersistence(tmp_path)
    ask = CallTool("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]})
    model = ScriptedModel([[ask]])
    async with open_runtime(model=model, persistence=store) as rt:
        await rt.plug("tool-ask", ask_plugin)
        handle = await rt.agents.create(agent_id="a", session_id="s", options=DEFER)
        prompt = handle.agent.send("paint it")
        await trio.sleep(1)
        (first,) = prompt.pending
        await handle.dispose()
    model = ScriptedModel([[Say("painted")]])
    async with open_runtime(model=model, persistence=store) as rt:
        await rt.plug("tool-ask", ask_plugin)
        handle = await rt.agents.resume(agent_id="a", session_id="s", options=DEFER)
        assert handle.resumed is not None
        await trio.sleep(1)
        assert handle.agent.status == "waiting"
        (again,) = handle.agent.session.decisions.values()
        handle.agent.decide(again.decision_id, "blue")
        answer = await handle.resumed
        events = list(handle.agent.session.events)
    assert again.call_id == first.call_id
    assert answer.text == "painted"
    assert len(model.requests) == 1  # the step that asked is not asked for again
    (result,) = of(events, ToolResult)
    assert result.content == "The user answered: blue"  # type: ignore[union-attr]


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
    """The asked call never started: its result says not run, not aborted."""
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
    (result,) = of(events, ToolResult)
    assert result.content.startswith("not run: the turn was cancelled (changed my mind)")  # type: ignore[union-attr]
    assert result.error.code == "not-run"  # type: ignore[union-attr]


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


class _HeldAfterAsking(DelegatingLog):
    """A log whose write-ahead after a ``decision/requested`` waits for `gate` (a slow
    store under load)."""

    gate: trio.Event
    asked = False

    def append(self, event: SessionEvent) -> None:
        self.asked = self.asked or isinstance(event, DecisionRequested)
        super().append(event)

    async def write_ahead(self) -> None:
        if self.asked:
            await self.gate.wait()
        await super().write_ahead()


async def test_a_decision_is_shown_only_once_the_log_holds_it(tmp_path: Path) -> None:
    """`prompt.pending` and `rt.decisions()` show a decision once its write-ahead
    returned: a process killed while it is being written cannot have shown it (a
    decision shown, then lost, could be answered by no one)."""
    from greenroom.session.persistence import JsonlPersistence

    _HeldAfterAsking.gate = trio.Event()
    store = Delegating(JsonlPersistence(tmp_path))
    store.log_type = _HeldAfterAsking
    model = ScriptedModel([[CallTool("deploy", {"target": "prod"})], [Say("done")]])
    async with open_runtime(model=model, persistence=store, tools=[deploy]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=DEFER)).agent
        prompt = agent.send("ship it")
        await trio.sleep(1)
        assert list(agent.session.decisions)  # appended, not yet written
        assert prompt.pending == []
        assert await rt.decisions() == []
        _HeldAfterAsking.gate.set()
        await trio.sleep(1)
        (pending,) = prompt.pending
        assert [d.request for d in await rt.decisions()] == [pending]
        agent.decide(pending.decision_id, "allow_once")
        assert (await prompt).text == "done"


@tool(kind="execute", concurrent=True)
def release(target: str) -> str:
    """Release to a target, at once with the others of its step.

    Args:
        target: Where to.
    """
    RAN.append(target)
    return f"released to {target}"


class _HeldAfterTheSecond(DelegatingLog):
    """A log whose write-ahead after a second ``decision/requested`` waits for `gate`."""

    gate: trio.Event
    asked = 0

    def append(self, event: SessionEvent) -> None:
        self.asked += isinstance(event, DecisionRequested)
        super().append(event)

    async def write_ahead(self) -> None:
        if self.asked > 1:
            await self.gate.wait()
        await super().write_ahead()


async def test_a_requires_action_answer_shows_only_the_decisions_the_log_holds(
    tmp_path: Path,
) -> None:
    """Two calls ask at once; the first's wait passes while the second's decision is still
    being written: the prompt is answered ``requires-action`` with the first alone (a kill
    then would lose the second), and `prompt.pending` shows the second once written."""
    from greenroom.session.persistence import JsonlPersistence

    RAN.clear()
    _HeldAfterTheSecond.gate = trio.Event()
    store = Delegating(JsonlPersistence(tmp_path))
    store.log_type = _HeldAfterTheSecond
    calls = [CallTool("release", {"target": "prod"}), CallTool("release", {"target": "test"})]
    model = ScriptedModel([calls, [Say("done")]])
    options = AgentOptions(permissions=Defer(), decision_wait=30)
    async with open_runtime(model=model, persistence=store, tools=[release]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=options)).agent
        prompt = agent.send("ship it")
        answer = await prompt
        assert answer.stop_reason == "requires-action"
        assert len(agent.session.decisions) == 2  # both appended
        (first,) = answer.decisions
        assert prompt.pending == [first]
        _HeldAfterTheSecond.gate.set()
        await trio.sleep(1)
        assert prompt.pending == list(agent.session.decisions.values())
        for request in prompt.pending:
            agent.decide(request.decision_id, "allow_once")
        await agent.when_idle()
    assert sorted(RAN) == ["prod", "test"]


class _FailsAfterTheSecond(_HeldAfterTheSecond):
    """A log whose first write-ahead after a second ``decision/requested`` fails (a full
    disk, freed after)."""

    failed = False

    async def write_ahead(self) -> None:
        if self.asked > 1 and not self.failed:
            self.failed = True
            raise PersistenceError("disk full")
        await self.inner.write_ahead()


async def test_a_write_ahead_failing_beside_a_waiting_call_fails_the_turn(
    tmp_path: Path,
) -> None:
    """Two calls ask at once and the second's decision cannot be written: the step fails
    and the turn ends errored, the first call's wait cut with it. It is not parked (as a
    disposal leaves it): the agent takes its next prompt as usual."""
    from greenroom.session.persistence import JsonlPersistence

    RAN.clear()
    store = Delegating(JsonlPersistence(tmp_path))
    store.log_type = _FailsAfterTheSecond
    calls = [CallTool("release", {"target": "prod"}), CallTool("release", {"target": "test"})]
    model = ScriptedModel([calls, [Say("again")]])
    async with open_runtime(model=model, persistence=store, tools=[release]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=DEFER)).agent
        prompt = agent.send("ship it")
        answer = await prompt
        assert answer.stop_reason == "error"
        assert "disk full" in str(answer.reason)
        assert prompt.pending == []
        assert await rt.decisions() == []
        assert agent.session.open_turn is None
        assert (await agent.send("and now?")).text == "again"
        events = list(agent.session.events)
    assert RAN == []
    ends = [type(e.reason).__name__ for e in of(events, TurnEnd)]  # type: ignore[attr-defined]
    assert ends == ["Errored", "Completed"]
    called = [e.call_id for e in of(events, ToolCall)]  # type: ignore[attr-defined]
    assert [e.call_id for e in of(events, ToolResult)] == called  # type: ignore[attr-defined]
    assert len(called) == 2


def stores(tmp_path: Path) -> dict[str, object]:
    from greenroom.session.persistence import JsonlPersistence, SqlitePersistence

    return {
        "jsonl": JsonlPersistence(tmp_path / "jsonl"),
        "sqlite": SqlitePersistence(str(tmp_path / "s.db")),
    }


async def park(store: object, session: str = "s") -> DecisionRequested:
    """A turn parked on deploy's permission, its agent disposed: the log holds it open."""
    model = ScriptedModel([[CallTool("deploy", {"target": "prod"})]])
    async with open_runtime(model=model, persistence=store, tools=[deploy]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id=session, options=DEFER)
        prompt = handle.agent.send("ship it")
        await trio.sleep(1)
        (pending,) = prompt.pending
        await handle.dispose()
    return pending


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_a_parked_turn_is_asked_again_at_resume_and_goes_on_without_repeating_a_step(
    tmp_path: Path, kind: str
) -> None:
    RAN.clear()
    store = stores(tmp_path)[kind]
    pending = await park(store)
    model = ScriptedModel([[Say("deployed it")]])
    async with open_runtime(model=model, persistence=store, tools=[deploy]) as rt:
        handle = await rt.agents.resume(
            agent_id="a", session_id="s", options=DEFER
        )  # "close": still parked
        agent, resumed = handle.agent, handle.resumed
        assert resumed is not None
        await trio.sleep(1)
        assert agent.status == "waiting"
        assert [d.decision_id for d in resumed.pending] == [pending.decision_id]
        agent.decide(pending.decision_id, "allow_once", by="bob")
        answer = await resumed
        events = list(agent.session.events)
    assert RAN == ["prod"]  # once
    assert answer.text == "deployed it"
    assert len(model.requests) == 1  # the parked step's reply was never asked for again
    (carried,) = of(events, TurnResumed)
    assert (carried.waiting, carried.rerun, carried.interrupted) == ([pending.call_id], [], [])
    assert [(e.decision_id, e.by) for e in of(events, DecisionMade)] == [
        (pending.decision_id, "bob")
    ]
    assert len(of(events, DecisionRequested)) == 1  # the same decision, not a new one


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_an_answer_given_while_stored_is_taken_at_resume_and_asks_no_one(
    tmp_path: Path, kind: str
) -> None:
    RAN.clear()
    store = stores(tmp_path)[kind]
    pending = await park(store)
    async with open_runtime(persistence=store, tools=[deploy]) as rt:
        (listed,) = await rt.decisions()
        assert (listed.session_id, listed.request) == ("s", pending)
        await rt.decide("s", pending.decision_id, "allow_once", by="carol")
        assert await rt.decisions() == []  # answered: no one's to answer now
        with pytest.raises(DecisionRefused, match="answered already, by carol"):
            await rt.decide("s", pending.decision_id, "reject_once", by="dave")
        _, stored = await store.load("s")  # type: ignore[attr-defined]
        assert of(stored, DecisionMade) == []  # the log has one writer: its holder
    model = ScriptedModel([[Say("deployed")]])
    async with open_runtime(model=model, persistence=store, tools=[deploy]) as rt:
        handle = await rt.agents.resume(
            agent_id="a", session_id="s"
        )  # no Defer: it would ask no one
        assert handle.resumed is not None
        answer = await handle.resumed
        events = list(handle.agent.session.events)
    assert RAN == ["prod"]
    assert answer.text == "deployed"
    assert [(e.answer, e.by) for e in of(events, DecisionMade)] == [("allow_once", "carol")]


async def test_a_stored_decision_refuses_bad_answers_naming_why(tmp_path: Path) -> None:
    store = stores(tmp_path)["jsonl"]
    pending = await park(store)
    async with open_runtime(persistence=store, tools=[deploy]) as rt:
        with pytest.raises(DecisionRefused, match="'later' is not an option"):
            await rt.decide("s", pending.decision_id, "later")
        with pytest.raises(DecisionRefused, match="no decision 'dec-x'"):
            await rt.decide("s", "dec-x", "allow_once")
        with pytest.raises(DecisionRefused, match=r"no decision '\.\./\.\./etc/passwd'"):
            await rt.decide("s", "../../etc/passwd", "allow_once")
        from greenroom.session.persistence import SessionNotFound

        with pytest.raises(SessionNotFound):
            await rt.decide("nope", pending.decision_id, "allow_once")
        # cancelled while parked: its decision dies with the turn
        handle = await rt.agents.resume(agent_id="a", session_id="s", options=DEFER)
        assert handle.resumed is not None
        await trio.sleep(1)
        handle.agent.cancel("no")
        answer = await handle.resumed
        assert answer.stop_reason == "aborted"
        await handle.dispose()
        with pytest.raises(DecisionRefused, match="void: its turn ended unanswered"):
            await rt.decide("s", pending.decision_id, "allow_once")


async def test_two_answers_at_once_one_wins_the_other_is_told_who(tmp_path: Path) -> None:
    store = stores(tmp_path)["sqlite"]
    pending = await park(store)
    outcomes: dict[str, str] = {}
    async with open_runtime(persistence=store) as rt:

        async def answer(by: str, what: str) -> None:
            try:
                await rt.decide("s", pending.decision_id, what, by=by)
                outcomes[by] = "won"
            except DecisionRefused as refused:
                outcomes[by] = str(refused)

        async with trio.open_nursery() as both:
            both.start_soon(answer, "erin", "allow_once")
            both.start_soon(answer, "frank", "reject_once")
    (winner,) = [by for by, outcome in outcomes.items() if outcome == "won"]
    (loser,) = [outcome for outcome in outcomes.values() if outcome != "won"]
    assert f"answered already, by {winner}" in loser


async def test_a_decision_whose_tool_is_gone_at_resume_ends_with_an_error_naming_it(
    tmp_path: Path,
) -> None:
    RAN.clear()
    store = stores(tmp_path)["jsonl"]
    await park(store)
    model = ScriptedModel([[Say("ok")]])
    async with open_runtime(model=model, persistence=store) as rt:  # no deploy tool now
        handle = await rt.agents.resume(agent_id="a", session_id="s", options=DEFER)
        assert handle.resumed is not None
        answer = await handle.resumed
    assert RAN == []
    (call,) = answer.tool_calls
    assert call.is_error
    assert "deploy" in str(call.result)
    assert answer.text == "ok"


async def test_a_wait_deadline_settles_the_prompt_requires_action_and_the_turn_waits_on() -> None:
    from greenroom import AgentSpec
    from greenroom.actors.events import AGENT_TURN_END

    RAN.clear()
    spec = AgentSpec(
        name="ops",
        model=ScriptedModel([[CallTool("deploy", {"target": "prod"})], [Say("done")]]),
        tools=[deploy],
        permissions=Defer(),
        decision_wait=30,
    )
    ended: list[object] = []
    async with open_runtime() as rt:
        rt.hooks.on(AGENT_TURN_END, lambda agent, turn, reason: ended.append(reason))
        handle = await rt.start(spec, "s")
        start = trio.current_time()
        answer = await handle.agent.send("ship it")
        assert trio.current_time() - start == pytest.approx(30, abs=1)
        assert answer.stop_reason == "requires-action"
        (pending,) = answer.decisions
        assert handle.agent.status == "waiting"
        assert ended == []  # the turn waits on
        handle.agent.decide(pending.decision_id, "allow_once")
        await handle.agent.when_idle()
    assert RAN == ["prod"]
    assert [type(r).__name__ for r in ended] == ["Completed"]


def test_spec_refuses_a_bad_decision_wait_and_policy() -> None:
    from greenroom import AgentSpec

    with pytest.raises(ValueError, match="decision_wait must be a finite number"):
        AgentSpec(name="x", decision_wait=-1)
    with pytest.raises(ValueError, match="decision_wait"):
        AgentSpec(name="x", decision_wait=float("inf"))
    with pytest.raises(TypeError, match="permissions must be a policy"):
        AgentSpec(name="x", permissions="yes")  # type: ignore[arg-type]


def test_sessions_show_prints_decisions_and_marks_a_parked_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from greenroom.cli import main
    from greenroom.session.persistence import JsonlPersistence

    store = JsonlPersistence(tmp_path / "jsonl")

    async def parked_then_answered() -> str:
        pending = await park(store)
        async with open_runtime(persistence=store) as rt:
            await rt.decide("s", pending.decision_id, "allow_once", by="carol")
        return pending.decision_id

    decision = trio.run(parked_then_answered, clock=trio.testing.MockClock(autojump_threshold=0))
    assert main(["sessions", "show", "s", "--store", f"jsonl:{tmp_path / 'jsonl'}"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert f'  permission asked for deploy {{"target": "prod"}}  [{decision}]' in shown
    assert shown[-3:] == [
        "parked: the open turn waits on 1 decision(s)",
        f"  {decision}: answered allow_once by carol,",
        "    logged when the session is next taken live",
    ]
