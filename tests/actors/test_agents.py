"""The agent semantics of the seeds, each pinned under the autojump clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from greenroom import AgentDisposed, open_runtime
from greenroom.actors.events import (
    AGENT_DISPOSED,
    AGENT_STATUS,
    AGENT_STEP_END,
    AGENT_STREAM_CHUNK,
    AGENT_TURN_CONTINUATION,
    AGENT_TURN_START,
)
from greenroom.actors.registry import AgentIdInUse
from greenroom.actors.types import Agent
from greenroom.models import CallTool, End, Fail, Hang, Say, ScriptedModel, Wait
from greenroom.protocol.events import (
    COMPLETED,
    DISPOSED,
    REFUSED,
    Aborted,
    ContextMessage,
    Errored,
    InjectionTrigger,
    SessionEvent,
    SteeringMessage,
    StepStart,
    ToolCall,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import ModelRequest, StreamChunk, TextDelta, UserTurn
from greenroom.session import SESSION_EVENT, Session, SessionIdInUse
from greenroom.session.persistence import JsonlPersistence
from greenroom.supervisor import Supervisor
from tests.agents_helpers import (
    assert_enclosed,
    kinds,
    new_agent,
    steps_of,
    turn_ends,
    user_messages_by_turn,
)
from tests.persistence_helpers import Delegating, DelegatingLog

# -- 1. batching ---------------------------------------------------------------


async def test_a_burst_is_one_turn_and_a_send_during_a_turn_waits_for_the_next() -> None:
    async with open_runtime(model=ScriptedModel(delay=0.02)) as rt:
        agent = await new_agent(rt)

        def late_send(agent_: Agent, turn: int, step: int) -> None:
            if turn == 1:
                agent_.send("four")

        rt.hooks.on(AGENT_STEP_END, late_send)
        ids = [agent.send(text).id for text in ("one", "two", "three")]
        assert len(set(ids)) == 3
        await agent.when_idle()
        events = agent.session.events
        assert user_messages_by_turn(events) == {1: ["one", "two", "three"], 2: ["four"]}
        assert turn_ends(events) == [(1, COMPLETED), (2, COMPLETED)]
        assert_enclosed(events)
        assert agent.status == "idle"


async def test_withdraw_takes_back_only_a_prompt_no_turn_took() -> None:
    async with open_runtime(model=ScriptedModel([[Say("working"), Wait(1)]])) as rt:
        agent = await new_agent(rt)
        running = agent.send("one").id
        await trio.sleep(0.5)
        assert agent.status == "running"
        later, withdrawn, last = (agent.send(t).id for t in ("two", "three", "four"))
        assert agent.withdraw(withdrawn)
        assert not agent.withdraw(withdrawn)  # gone already
        assert not agent.withdraw(running)  # its turn took it: cancel stops that
        await agent.when_idle()
        assert user_messages_by_turn(agent.session.events) == {1: ["one"], 2: ["two", "four"]}
        logged = {e.message_id for e in agent.session.events if isinstance(e, UserMessage)}
        assert logged == {running, later, last}
        assert turn_ends(agent.session.events) == [(1, COMPLETED), (2, COMPLETED)]


async def test_withdrawing_what_an_idle_agent_had_queued_releases_when_idle() -> None:
    async with open_runtime(model=ScriptedModel()) as rt:
        agent = await new_agent(rt)
        message = agent.send("one").id
        idle = agent.when_idle()  # registered while something is queued
        assert agent.withdraw(message)
        await idle
        assert agent.session.events == []
        assert agent.status == "idle"


async def test_a_withdraw_as_the_turn_starts_runs_no_turn() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        sent: list[str] = []

        def withdraw_in_window_2(agent_: Agent, status: str) -> None:
            if status == "running" and sent:
                agent_.withdraw(sent.pop())

        rt.hooks.on(AGENT_STATUS, withdraw_in_window_2)
        sent.append(agent.send("one").id)
        await agent.when_idle()
        assert agent.session.events == []  # no turn/end without its turn/start
        agent.send("two")
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, COMPLETED)]


async def test_a_refused_turn_stays_in_the_log_and_out_of_the_models_history(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [[Say("fine")], [Say("I can"), CallTool("bash", {"command": "rm"}), End("refusal")]],
        delay=0,
    )
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=model, persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        for text in ("hello", "do the bad thing"):
            agent.send(text)
            await agent.when_idle()
        before = model.requests[-1].messages
        agent.send("something else")
        await agent.when_idle()
        events = agent.session.events
        assert turn_ends(events) == [(1, COMPLETED), (2, REFUSED), (3, COMPLETED)]
        assert not [e for e in events if isinstance(e, ToolCall)]  # a refusal's call never runs
        assert user_messages_by_turn(events)[2] == ["do the bad thing"]
        assert [m.content for m in model.requests[-1].messages if isinstance(m, UserTurn)] == [
            "hello",
            "something else",
        ]
        assert [m.content for m in before if isinstance(m, UserTurn)] == [  # snapshot kept
            "hello",
            "do the bad thing",
        ]
        await handle.dispose()
        resumed = await rt.agents.resume(agent_id="a", session_id="s")
        history = resumed.agent.session.messages()
        assert "do the bad thing" not in str(list(history))
        assert "I can" not in str(list(history))
        await resumed.dispose()


async def test_context_that_arrived_during_a_refused_turn_stays_in_the_history() -> None:
    model = ScriptedModel([[Say("no"), Wait(1), End("refusal")]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        agent.send("bad")
        await trio.sleep(0.5)
        agent.inject("background task bash-1 finished: exit 0")  # lands in the open turn
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, REFUSED)]
        agent.send("what happened to the build?")
        await agent.when_idle()
        seen = [m.content for m in model.requests[-1].messages if isinstance(m, UserTurn)]
        assert seen == [
            '<context source="user">background task bash-1 finished: exit 0</context>',
            "what happened to the build?",
        ]


async def test_a_cancel_as_a_refusal_ends_its_step_wins_at_window_4() -> None:
    async with open_runtime(model=ScriptedModel([[Say("no"), End("refusal")]])) as rt:
        agent = await new_agent(rt)
        rt.hooks.on(AGENT_STEP_END, lambda agent_, turn, step: agent_.cancel("late"))
        agent.send("bad")
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, Aborted("late"))]


# -- 2. steer --------------------------------------------------------------------


async def test_steer_while_running_joins_the_turn_between_steps() -> None:
    model = ScriptedModel([[Say("working"), Wait(1)], [Say("steered")]])
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)

        def steer_once(agent_: Agent, turn: int, step: int, chunk: StreamChunk) -> None:
            if step == 1 and isinstance(chunk, TextDelta):
                agent_.steer("look left")

        rt.hooks.on(AGENT_STREAM_CHUNK, steer_once)
        agent.send("go")
        await agent.when_idle()
        events = agent.session.events
        assert turn_ends(events) == [(1, COMPLETED)]
        assert steps_of(events, 1) == 2
        steering = [e for e in events if isinstance(e, SteeringMessage)]
        assert [(s.turn, s.content) for s in steering] == [(1, "look left")]
        second_step = next(e for e in events if isinstance(e, StepStart) and e.step == 2)
        assert steering[0].seq < second_step.seq
        assert model.requests[1].messages[-1] == UserTurn(
            '<steering source="user">look left</steering>'
        )


async def test_steer_while_idle_behaves_like_send() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        agent.steer("hello")
        await agent.when_idle()
        assert user_messages_by_turn(agent.session.events) == {1: ["hello"]}


# -- 3. inject -------------------------------------------------------------------


async def test_inject_while_idle_writes_its_own_one_shot_turn_without_the_model() -> None:
    model = ScriptedModel(delay=0)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        agent.inject("the build is green")
        events = agent.session.events
        assert kinds(events) == ["turn/start", "context/message", "turn/end"]
        start = events[0]
        assert isinstance(start, TurnStart)
        assert isinstance(start.trigger, InjectionTrigger)
        assert not model.requests
        agent.send("what changed?")
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, COMPLETED), (2, COMPLETED)]
        assert model.requests[0].messages[0] == UserTurn(
            '<context source="user">the build is green</context>'
        )


async def test_inject_inside_an_open_turn_joins_that_turn() -> None:
    model = ScriptedModel([[Say("a"), Wait(1), CallTool("missing")], [Say("b")]])
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await trio.sleep(0.5)
        agent.inject("side note")
        await agent.when_idle()
        events = agent.session.events
        assert_enclosed(events)
        assert turn_ends(events) == [(1, COMPLETED)]
        context = [e for e in events if isinstance(e, ContextMessage)]
        assert len(context) == 1
        assert UserTurn('<context source="user">side note</context>') in model.requests[1].messages


# -- 4-9. cancel --------------------------------------------------------------------


async def test_cancel_on_an_idle_agent_is_a_no_op_and_the_next_prompt_runs() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        agent.cancel()
        agent.send("still here")
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, COMPLETED)]


async def test_send_then_cancel_before_pickup_runs_nothing_and_releases_waiters() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        idle = agent.when_idle()  # registered before the send: idle, nothing queued
        agent.send("never")
        waiting = agent.when_idle()  # registered with a prompt queued
        agent.cancel()
        with trio.fail_after(1):
            await waiting
            await idle
        await trio.testing.wait_all_tasks_blocked()
        assert agent.session.events == []
        assert agent.status == "idle"


async def test_cancel_mid_step_aborts_the_model_call_with_the_reason() -> None:
    model = ScriptedModel([[Say("partial"), Hang()], [Say("partial"), Hang()]])
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        agent.send("one")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel("mid-step")
        await agent.when_idle()
        agent.send("two")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
        agent.send("three")
        await agent.when_idle()
        events = agent.session.events
        assert turn_ends(events) == [
            (1, Aborted("mid-step")),
            (2, Aborted("cancelled")),
            (3, COMPLETED),
        ]
        assert_enclosed(events)
        assert kinds(events)[:6] == [
            "turn/start",
            "user/message",
            "step/start",
            "assistant/chunk",
            "step/end",
            "turn/end",
        ]


async def test_cancel_from_a_turn_start_listener_drops_every_step() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        rt.hooks.on(AGENT_TURN_START, lambda a, turn: a.cancel("at turn start"))
        agent.send("go")
        await agent.when_idle()
        events = agent.session.events
        assert kinds(events) == ["turn/start", "user/message", "turn/end"]
        assert turn_ends(events) == [(1, Aborted("at turn start"))]


async def test_cancel_from_a_running_status_listener_drops_the_turn() -> None:
    model = ScriptedModel(delay=0)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        remove = rt.hooks.on(
            AGENT_STATUS, lambda a, status: a.cancel() if status == "running" else None
        )
        agent.send("go")
        await agent.when_idle()
        assert agent.session.events == []
        assert not model.requests
        assert agent.status == "idle"
        remove()
        agent.send("again")
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, COMPLETED)]


async def test_a_running_listener_that_cancels_then_queues_runs_the_replacement() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)

        def replace(a: Agent, status: str) -> None:
            if status == "running" and a.session.last_turn == 0:
                a.cancel()
                a.send("replacement")

        rt.hooks.on(AGENT_STATUS, replace)
        agent.send("original")
        await agent.when_idle()
        assert user_messages_by_turn(agent.session.events) == {1: ["replacement"]}


async def test_cancel_in_the_continuation_window_runs_no_further_step() -> None:
    model = ScriptedModel([[CallTool("missing")], [Say("never")]])
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)

        async def cancel_here(go_on: bool, a: Agent, turn: int) -> bool:
            a.cancel("continuation")
            return go_on

        rt.hooks.intercept(AGENT_TURN_CONTINUATION, cancel_here)
        agent.send("go")
        await agent.when_idle()
        events = agent.session.events
        assert steps_of(events, 1) == 1
        assert turn_ends(events) == [(1, Aborted("continuation"))]
        assert len(model.requests) == 1


async def test_a_continuation_handler_that_cancels_and_stops_ends_the_turn_aborted() -> None:
    model = ScriptedModel([[Say("done")]])
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)

        async def cancel_and_stop(go_on: bool, a: Agent, turn: int) -> bool:
            a.cancel("stopped by the handler")
            return False

        rt.hooks.intercept(AGENT_TURN_CONTINUATION, cancel_and_stop)
        agent.send("go")
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, Aborted("stopped by the handler"))]


async def test_cancel_between_when_idle_and_a_new_send_never_batches() -> None:
    async with open_runtime(model=ScriptedModel(delay=0.02)) as rt:
        agent = await new_agent(rt)
        ended: list[float] = []
        rt.hooks.on(SESSION_EVENT, lambda s, e: ended.append(1) if isinstance(e, TurnEnd) else None)
        agent.send("A")
        idle = agent.when_idle()
        agent.cancel()
        agent.send("B")
        await idle
        assert ended == [1]  # B's turn had ended when when_idle() returned
        assert user_messages_by_turn(agent.session.events) == {1: ["B"]}
        assert turn_ends(agent.session.events) == [(1, COMPLETED)]


async def test_cancel_clears_steering_and_does_not_requeue_it() -> None:
    model = ScriptedModel([[Say("x"), Hang()]])
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        agent.steer("left")
        agent.cancel()
        await agent.when_idle()
        await trio.sleep(1)
        events = agent.session.events
        assert not any(isinstance(e, SteeringMessage) for e in events)
        assert turn_ends(events) == [(1, Aborted("cancelled"))]
        assert "left" not in str(events)


async def test_steering_left_by_a_failed_step_leads_the_next_turn() -> None:
    model = ScriptedModel([[Say("x"), Wait(1), Fail("boom")]])
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await trio.sleep(0.5)
        agent.steer("also this")
        await agent.when_idle()
        events = agent.session.events
        assert turn_ends(events) == [(1, Errored(step=1, message="boom")), (2, COMPLETED)]
        assert user_messages_by_turn(events)[2] == ["also this"]


# -- 10-11. dispose and owners -----------------------------------------------------


async def test_dispose_mid_turn_closes_the_turn_then_unregisters_then_detaches() -> None:
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]])) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        sibling = await rt.agents.create(agent_id="b", session_id="t")
        order: list[str] = []

        def on_event(session: Session, event: SessionEvent) -> None:
            if isinstance(event, TurnEnd) and session.id == "s":
                order.append(f"turn/end {event.reason.__struct_config__.tag}")

        def on_disposed(agent: Agent) -> None:
            order.append("unregistered")
            assert rt.sessions.get("s") is not None  # the session is still in the store
            raise RuntimeError("a listener that breaks")

        rt.hooks.on(SESSION_EVENT, on_event)
        rt.hooks.on(AGENT_DISPOSED, on_disposed)
        handle.agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        await handle.dispose()
        assert order == ["turn/end disposed", "unregistered"]
        assert rt.agents.get("a") is None
        assert rt.sessions.get("s") is None
        assert handle.agent.status == "disposed"
        assert turn_ends(handle.agent.session.events) == [(1, DISPOSED)]
        # The sibling is untouched and still works.
        assert rt.agents.get("b") is sibling.agent
        sibling.agent.send("hi")
        await sibling.agent.when_idle()
        assert turn_ends(sibling.agent.session.events) == [(1, COMPLETED)]


async def test_concurrent_dispose_callers_await_one_teardown(tmp_path: Path) -> None:
    gate = trio.Event()
    flushes: list[str] = []

    class GatedFlush(DelegatingLog):
        async def flush(self) -> None:
            flushes.append("s")
            with trio.CancelScope(shield=True):  # a sink shields its waits: a cancel cannot cut it
                await gate.wait()
            await self.inner.flush()

    persistence = Delegating(JsonlPersistence(tmp_path))
    persistence.log_type = GatedFlush
    async with open_runtime(
        model=ScriptedModel([[Say("x"), Hang()]]), persistence=persistence
    ) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        returned: list[str] = []

        async def dispose(label: str) -> None:
            await handle.dispose()
            returned.append(label)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(dispose, "first")
            nursery.start_soon(dispose, "second")
            await trio.sleep(5)
            assert returned == []
            assert rt.agents.get("a") is not None  # unregistering waits for the flush
            gate.set()
        assert sorted(returned) == ["first", "second"]
        assert flushes == ["s"]
        await handle.dispose()  # a later call returns at once


async def test_closing_the_runtime_disposes_agents_in_reverse_creation_order() -> None:
    disposed: list[str] = []
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]])) as rt:
        first = await rt.agents.create(agent_id="first", session_id="s1")
        await rt.agents.create(agent_id="second", session_id="s2")
        rt.hooks.on(AGENT_DISPOSED, lambda a: disposed.append(a.id))
        first.agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        sessions = rt.sessions
    assert disposed == ["second", "first"]
    assert turn_ends(first.agent.session.events) == [(1, DISPOSED)]
    assert sessions.list() == []


async def test_a_nursery_owner_closing_takes_the_same_ordered_path() -> None:
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]])) as rt:
        order: list[str] = []
        rt.hooks.on(
            SESSION_EVENT,
            lambda s, e: order.append("turn/end") if isinstance(e, TurnEnd) else None,
        )
        rt.hooks.on(
            AGENT_DISPOSED,
            lambda a: order.append(f"unregistered {[s.id for s in rt.sessions.list()]}"),
        )
        async with trio.open_nursery() as nursery:
            handle = await rt.agents.create(agent_id="a", session_id="s", owner=nursery)
            handle.agent.send("go")
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert order == ["turn/end", "unregistered ['s']"]  # still in the store
        assert rt.agents.list() == []
        assert rt.sessions.list() == []
        assert turn_ends(handle.agent.session.events) == [(1, DISPOSED)]


async def test_a_supervisor_owner_closing_takes_the_same_ordered_path() -> None:
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]])) as rt:
        async with Supervisor(name="team") as team:
            handle = await rt.agents.create(agent_id="a", session_id="s", owner=team)
            assert [c.name for c in team.tree().children] == ["agent:a"]
            handle.agent.send("go")
            await trio.testing.wait_all_tasks_blocked()
        assert rt.agents.list() == []
        assert rt.sessions.list() == []
        assert turn_ends(handle.agent.session.events) == [(1, DISPOSED)]
        assert team.exits[-1].outcome == "shutdown"


# -- 12. ids ------------------------------------------------------------------------


async def test_duplicate_ids_are_rejected_before_anything_is_created() -> None:
    async with open_runtime() as rt:
        await rt.agents.create(agent_id="a", session_id="s")
        with pytest.raises(AgentIdInUse, match="agent 'a' is already registered"):
            await rt.agents.create(agent_id="a", session_id="fresh")
        assert rt.sessions.get("fresh") is None  # no orphan session
        with pytest.raises(SessionIdInUse, match="session 's' is already live"):
            await rt.agents.create(agent_id="b", session_id="s")
        assert rt.agents.get("b") is None
        assert [a.id for a in rt.agents.list()] == ["a"]


async def test_racing_creates_cannot_both_publish_the_same_ids() -> None:
    async with open_runtime() as rt:
        outcomes: list[str] = []

        async def create(agent_id: str, session_id: str) -> None:
            try:
                await rt.agents.create(agent_id=agent_id, session_id=session_id)
                outcomes.append(f"{agent_id}/{session_id} ok")
            except (AgentIdInUse, SessionIdInUse) as exc:
                outcomes.append(str(exc))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "x", "s1")
            nursery.start_soon(create, "x", "s1")
            nursery.start_soon(create, "p", "s2")
            nursery.start_soon(create, "q", "s2")
        refused = sorted(o for o in outcomes if o.endswith("already"))
        assert refused == [
            "agent 'x' is being created or resumed already",
            "session 's2' is being created or resumed already",
        ]
        winners = sorted(o for o in outcomes if o.endswith(" ok"))
        assert winners in (["p/s2 ok", "x/s1 ok"], ["q/s2 ok", "x/s1 ok"])
        assert sorted(a.id for a in rt.agents.list()) == sorted(["x", winners[0][0]])
        assert sorted(s.id for s in rt.sessions.list()) == ["s1", "s2"]


async def test_resume_without_persistence_is_a_clear_error() -> None:
    async with open_runtime() as rt:
        with pytest.raises(RuntimeError, match="no session persistence is configured"):
            await rt.agents.resume(agent_id="a", session_id="s")


# -- bad input ------------------------------------------------------------------------


async def test_a_disposed_agent_refuses_prompts_naming_itself() -> None:
    async with open_runtime() as rt:
        handle = await rt.agents.create(agent_id="gone", session_id="s")
        await handle.dispose()
        agent = handle.agent
        for verb in (agent.send, agent.steer, agent.inject):
            with pytest.raises(AgentDisposed, match="agent 'gone' is disposed"):
                verb("hello")
        agent.cancel()  # a no-op, never an error
        await agent.when_idle()


async def test_empty_or_non_text_content_is_rejected() -> None:
    async with open_runtime() as rt:
        agent = await new_agent(rt)
        with pytest.raises(ValueError, match="agent 'a': content must be non-empty text"):
            agent.send("   ")
        with pytest.raises(TypeError, match=r"agent 'a': content must be text \(str\), got bytes"):
            agent.send(b"hi")  # type: ignore[arg-type]
        assert agent.session.events == []


class _Broken:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        if self.mode == "raise":
            raise ConnectionError("endpoint went away")
        yield TextDelta("ok ")
        yield {"not": "a chunk"}  # type: ignore[misc]


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("raise", "model adapter raised ConnectionError: endpoint went away"),
        ("garbage", "model yielded an invalid chunk: {'not': 'a chunk'}"),
    ],
)
async def test_a_broken_model_ends_the_turn_error_and_the_agent_stays_usable(
    mode: str, message: str
) -> None:
    async with open_runtime(model=_Broken(mode)) as rt:
        agent = await new_agent(rt)
        agent.send("hi")
        await agent.when_idle()
        assert turn_ends(agent.session.events) == [(1, Errored(step=1, message=message))]
        agent.send("again")
        await agent.when_idle()
        assert [t for t, _ in turn_ends(agent.session.events)] == [1, 2]
        assert agent.status == "idle"


async def test_an_id_is_free_again_as_soon_as_dispose_returns() -> None:
    async with open_runtime() as rt:
        for _ in range(5):
            handle = await rt.agents.create(agent_id="a", session_id="s")
            await handle.dispose()
        assert rt.agents.list() == []
        assert rt.supervisor.tree().children == []


async def test_a_create_whose_caller_is_cancelled_leaves_nothing_and_no_lock() -> None:
    async with open_runtime() as rt:
        with trio.fail_after(5):
            with trio.CancelScope() as scope:
                scope.cancel()
                await rt.agents.create(agent_id="a", session_id="s")
            assert scope.cancelled_caught
            assert rt.agents.list() == []
            assert rt.sessions.list() == []
            assert rt.supervisor.tree().children == []
            handle = await rt.agents.create(agent_id="a", session_id="s")  # the lock is free
            assert rt.agents.get("a") is handle.agent


async def test_a_cancel_between_two_turns_leaves_the_agent_idle() -> None:
    for checkpoints in range(4):
        async with open_runtime(model=ScriptedModel(delay=0.02)) as rt:
            agent = await new_agent(rt)
            ended = trio.Event()

            def on_event(session: Session, event: SessionEvent, ended: trio.Event = ended) -> None:
                if isinstance(event, TurnEnd) and event.turn == 1:
                    ended.set()

            rt.hooks.on(SESSION_EVENT, on_event)
            agent.send("one two")
            await trio.sleep(0.01)
            agent.send("queued behind turn one")
            await ended.wait()
            for _ in range(checkpoints):
                await trio.lowlevel.checkpoint()
            agent.cancel("stop")
            with trio.fail_after(5):
                await agent.when_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "idle"
            assert_enclosed(agent.session.events)


async def test_context_injected_while_a_tool_runs_lands_after_its_result() -> None:
    import msgspec

    from greenroom.actors.types import ToolInvocation
    from greenroom.models import CallTool
    from greenroom.protocol.events import ContextMessage, ToolCall, ToolResult
    from greenroom.protocol.model import AssistantTurn, ToolTurn, UserTurn
    from greenroom.tools import Tool

    class Args(msgspec.Struct):
        pass

    async def slow(args: Args, call: ToolInvocation) -> str:
        assert call.agent is not None
        call.agent.inject("a background task finished")
        await trio.sleep(1)
        return "done"

    model = ScriptedModel([[CallTool("slow", {})], [Say("ok")]])
    async with open_runtime(model=model, tools=[Tool("slow", "waits", Args, slow)]) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await agent.when_idle()
        kinds = [type(e) for e in agent.session.events]
        assert kinds.index(ToolCall) < kinds.index(ToolResult) < kinds.index(ContextMessage)
        history = model.requests[1].messages
        assert [type(m) for m in history] == [UserTurn, AssistantTurn, ToolTurn, UserTurn]
