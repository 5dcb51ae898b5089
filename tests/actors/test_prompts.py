"""Prompts as values: each settles once with its turn's `Answer`; `events()` follows its turn."""

from __future__ import annotations

import gc
from typing import Any

import hypothesis
import hypothesis.strategies as st
import msgspec
import pytest
import trio
import trio.testing

from greenroom import AgentDisposed, Answer, Prompt, ToolCallRecord, open_runtime
from greenroom.actors.events import AGENT_STATUS, AGENT_TURN_START
from greenroom.actors.prompt import PromptEvents
from greenroom.actors.types import Agent
from greenroom.models import CallTool, Fail, Hang, Say, ScriptedModel, Think, Wait
from greenroom.protocol.events import (
    AssistantChunk,
    SessionEvent,
    SteeringMessage,
    StepEnd,
    ToolCall,
    ToolResult,
    ToolStart,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import ReasoningDelta, TextDelta, Usage
from greenroom.tools import Tool
from tests.agents_helpers import assert_enclosed, new_agent


class _Echo(msgspec.Struct):
    text: str


async def _echo(args: _Echo, _invocation: object) -> str:
    await trio.sleep(0.1)
    return f"echo: {args.text}"


ECHO = Tool("echo", "Echo the text back.", _Echo, _echo)


class _Other(msgspec.Struct):
    number: int


def shown(event: SessionEvent) -> bool:
    """What `Prompt.events` yields of a turn's events."""
    if isinstance(event, AssistantChunk):
        return isinstance(event.chunk, TextDelta | ReasoningDelta)
    return isinstance(event, ToolCall | ToolStart | ToolResult | StepEnd | TurnEnd)


def turn_events(events: list[SessionEvent] | tuple[SessionEvent, ...], turn: int, since: int = 0):
    """The events of `turn` at or after seq `since` that `events()` shows, in log order."""
    current = None
    found = []
    for event in events:
        if isinstance(event, TurnStart):
            current = event.turn
        if current == turn and event.seq >= since and shown(event):
            found.append(event)
        if isinstance(event, TurnEnd):
            current = None
    return found


async def collect(reader: PromptEvents, into: list[SessionEvent], delay: float = 0) -> None:
    async for event in reader:
        into.append(event)
        if delay:
            await trio.sleep(delay)


# -- answers --------------------------------------------------------------------------------


async def test_run_answers_with_the_turns_text_calls_and_usage() -> None:
    scripts = [
        [Think("hmm"), Say("let me look"), CallTool("echo", {"text": "hi"})],
        [Say("it said hi")],
    ]
    async with open_runtime(model=ScriptedModel(scripts, delay=0), tools=[ECHO]) as rt:
        agent = await new_agent(rt)
        answer = await agent.run("what does echo say?")
    assert answer == Answer(
        stop_reason="completed",
        turn=1,
        text="it said hi",
        tool_calls=(ToolCallRecord("call-1", "echo", '{"text": "hi"}', "echo: hi"),),
    )


async def test_usage_sums_every_step_of_the_turn() -> None:
    class Counted(ScriptedModel):
        async def _play(self, script):  # type: ignore[no-untyped-def, override]
            async for chunk in super()._play(script):
                if chunk.__struct_config__.tag == "finish":
                    yield Usage(input_tokens=10, output_tokens=3)
                yield chunk

    scripts = [[CallTool("echo", {"text": "x"})], [Say("done")]]
    async with open_runtime(model=Counted(scripts, delay=0), tools=[ECHO]) as rt:
        answer = await (await new_agent(rt)).run("go")
    assert answer.usage == Usage(input_tokens=20, output_tokens=6)


async def test_a_burst_shares_its_turns_answer_and_a_later_send_gets_its_own() -> None:
    async with open_runtime(model=ScriptedModel(delay=0.01)) as rt:
        agent = await new_agent(rt)
        one, two = agent.send("one"), agent.send("two")
        await trio.testing.wait_all_tasks_blocked()
        three = agent.send("three")
        first, second, third = await one, await two, await three
    assert first is second  # one turn, one answer
    assert (first.turn, third.turn) == (1, 2)
    assert first.text == "two"
    assert third.text == "three"


async def test_a_failed_turn_answers_error_with_its_message() -> None:
    async with open_runtime(model=ScriptedModel([[Fail("the model is down")]])) as rt:
        answer = await (await new_agent(rt)).run("go")
    assert (answer.stop_reason, answer.reason, answer.turn) == ("error", "the model is down", 1)


async def test_cancel_aborts_the_running_prompt_and_the_queued_ones_with_the_reason() -> None:
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]])) as rt:
        agent = await new_agent(rt)
        running = agent.send("one")
        await trio.sleep(1)
        queued = agent.send("two")
        assert agent.status == "running"
        agent.cancel("changed my mind")
        assert queued.settled  # dropped at the cancel, before any turn could take it
        assert await queued == Answer(stop_reason="aborted", reason="changed my mind")
        answer = await running
    assert (answer.stop_reason, answer.reason, answer.turn) == ("aborted", "changed my mind", 1)
    assert answer.text == ""  # its one step was cut: no assistant message was logged


async def test_withdrawn_settles_withdrawn_and_the_rest_runs() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        kept, taken = agent.send("kept"), agent.send("taken back")
        assert agent.withdraw(taken.id)
        assert await taken == Answer(stop_reason="withdrawn")
        assert (await kept).text == "kept"


async def test_dispose_settles_the_running_and_the_queued_prompts_disposed() -> None:
    async with open_runtime(model=ScriptedModel([[Hang()]])) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        running = handle.agent.send("one")
        await trio.sleep(1)
        queued = handle.agent.send("two")
        await handle.dispose()
        assert running.settled
        assert queued.settled
        assert (await running).stop_reason == "disposed"
        assert (await running).turn == 1
        assert await queued == Answer(stop_reason="disposed")


async def test_a_steered_prompt_answers_with_the_turn_it_joined() -> None:
    async with open_runtime(model=ScriptedModel([[Say("a"), Wait(1)], [Say("b")]])) as rt:
        agent = await new_agent(rt)
        sent = agent.send("go")
        await trio.sleep(0.5)
        steered = agent.steer("also this")
        assert (await steered) is (await sent)
        assert (await sent).text == "b"
        idle_steer = agent.steer("while idle")  # not running: a send, its own turn
        assert (await idle_steer).turn == 2


async def test_a_settled_prompt_nobody_holds_is_garbage() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        agent.send("ping")
        await agent.when_idle()
        gc.collect()
        assert not [o for o in gc.get_objects() if isinstance(o, Prompt)]


async def test_awaiting_twice_and_a_cancelled_awaiter_leave_the_prompt_alone() -> None:
    async with open_runtime(model=ScriptedModel([[Say("slow"), Wait(5)]])) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        with trio.move_on_after(1):
            await prompt
        assert not prompt.settled
        assert agent.status == "running"
        answer = await prompt
        assert (await prompt) is answer
        assert answer.text == "slow"


async def test_a_disposed_agent_refuses_run() -> None:
    async with open_runtime() as rt:
        handle = await rt.agents.create(agent_id="gone", session_id="s")
        await handle.dispose()
        with pytest.raises(AgentDisposed, match="agent 'gone' is disposed"):
            await handle.agent.run("hello")


async def test_output_must_be_an_object_type_named_in_the_error() -> None:
    async with open_runtime() as rt:
        agent = await new_agent(rt)
        with pytest.raises(TypeError, match="output=int: a final answer must be a JSON object"):
            agent.send("go", output=int)
        with pytest.raises(TypeError, match="output=object: not a type msgspec"):
            agent.send("go", output=object)
        assert agent.inbox.queued == 0


# -- events() -----------------------------------------------------------------------------------


async def test_events_follow_the_prompts_turn_only_in_log_order() -> None:
    scripts = [
        [Say("first turn")],
        [Think("plan"), Say("calling"), CallTool("echo", {"text": "x"})],
        [Say("done")],
    ]
    async with open_runtime(model=ScriptedModel(scripts, delay=0.01), tools=[ECHO]) as rt:
        agent = await new_agent(rt)
        agent.send("before")
        await trio.testing.wait_all_tasks_blocked()
        prompt = agent.send("mine")  # queued behind the first turn
        fast: list[SessionEvent] = []
        slow: list[SessionEvent] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, prompt.events(), fast)
            nursery.start_soon(collect, prompt.events(), slow, 1.0)  # far slower than the turn
        answer = await prompt
        events = list(agent.session.events)
    expected = turn_events(events, 2)
    assert fast == expected
    assert slow == expected
    assert isinstance(expected[-1], TurnEnd)
    assert expected[-1].turn == 2 == answer.turn
    assert [type(e).__name__ for e in expected].count("ToolResult") == 1


async def test_events_start_at_the_call() -> None:
    async with open_runtime(model=ScriptedModel([[Say("a"), Wait(1), Say("b")]])) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        await trio.sleep(0.5)
        since = agent.session.next_seq
        seen: list[SessionEvent] = []
        await collect(prompt.events(), seen)
        assert seen == turn_events(list(agent.session.events), 1, since)
        assert [e.chunk for e in seen if isinstance(e, AssistantChunk)] == [TextDelta("b")]
        late: list[SessionEvent] = []
        await collect(prompt.events(), late)  # its turn ended before the call
        assert late == []


async def test_events_of_a_prompt_no_turn_takes_end_when_it_settles() -> None:
    async with open_runtime(model=ScriptedModel([[Hang()]])) as rt:
        agent = await new_agent(rt)
        agent.send("busy")
        await trio.sleep(1)
        queued = agent.send("queued")
        seen: list[SessionEvent] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, queued.events(), seen)
            await trio.sleep(1)
            assert agent.withdraw(queued.id)
        assert seen == []
        agent.cancel()


async def test_a_reader_gets_each_event_as_it_is_logged() -> None:
    async with open_runtime(model=ScriptedModel([[Say("a"), Wait(5), Say("b")]])) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        started = trio.current_time()
        async for event in prompt.events():
            if isinstance(event, AssistantChunk) and event.chunk == TextDelta("a"):
                break
        assert trio.current_time() - started < 5  # not at the turn's end
        assert not prompt.settled
        agent.cancel()


async def test_a_cancelled_reader_goes_on_from_its_position() -> None:
    async with open_runtime(model=ScriptedModel([[Say("a"), Wait(1), Say("b"), Wait(1)]])) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        reader = prompt.events()
        seen: list[SessionEvent] = []
        with trio.move_on_after(0.5):
            async for event in reader:
                seen.append(event)
        async for event in reader:
            seen.append(event)
        assert seen == turn_events(list(agent.session.events), 1)


async def test_a_reader_cancelled_with_events_waiting_loses_none() -> None:
    async with open_runtime(model=ScriptedModel([[Say("a"), Say("b")]])) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        reader = prompt.events()
        await prompt  # every event of the turn is in the log now
        for _ in range(3):
            with trio.CancelScope() as scope:
                scope.cancel()
                await reader.__anext__()
            assert scope.cancelled_caught
        seen = [event async for event in reader]
        assert seen == turn_events(list(agent.session.events), 1)


async def test_a_steered_prompts_events_are_those_of_the_turn_it_joins() -> None:
    async with open_runtime(model=ScriptedModel([[Say("a"), Wait(1)], [Say("b")]])) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await trio.sleep(0.5)
        since = agent.session.next_seq
        steered = agent.steer("and this")
        seen: list[SessionEvent] = []
        await collect(steered.events(), seen)
        assert seen == turn_events(list(agent.session.events), 1, since)
        assert any(isinstance(e, AssistantChunk) and e.chunk == TextDelta("b") for e in seen)


class _Steps(trio.abc.Instrument):
    """Counts the steps one task takes (each a scheduler pass that ran it); past `most`, it
    cancels `scope`, so that a task that spins fails the test instead of hanging it (under
    the autojump clock a spinning task stops virtual time)."""

    def __init__(self, scope: trio.CancelScope, most: int) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.steps = 0
        self._scope = scope
        self._most = most

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps > self._most:
                self._scope.cancel()


async def test_a_reader_of_a_queued_prompt_parks_until_a_turn_takes_it() -> None:
    """Behind a long turn that keeps logging, a reader of the prompt queued after it is not
    run once until that turn ends and the next takes its prompt."""
    chunks = [item for _ in range(50) for item in (Say("x"), Wait(1))]
    async with open_runtime(model=ScriptedModel([chunks, [Say("mine")]])) as rt:
        agent = await new_agent(rt)
        agent.send("long")
        await trio.sleep(0.5)
        queued = agent.send("queued")
        seen: list[SessionEvent] = []
        with trio.CancelScope() as bounded:
            steps = _Steps(bounded, most=100)
            trio.lowlevel.add_instrument(steps)
            try:
                async with trio.open_nursery() as nursery:

                    async def read(task_status: trio.TaskStatus[None]) -> None:
                        steps.task = trio.lowlevel.current_task()
                        task_status.started()
                        await collect(queued.events(), seen)  # parks in this first step

                    await nursery.start(read)
                    await trio.sleep(10)  # ten of the long turn's chunks are logged meanwhile
                    assert steps.steps == 0  # not run once since it parked
                    await queued
            finally:
                trio.lowlevel.remove_instrument(steps)
        assert not bounded.cancelled_caught, f"the reader spun ({steps.steps} steps)"
        assert seen == turn_events(list(agent.session.events), 2)
        assert any(isinstance(e, AssistantChunk) and e.chunk == TextDelta("mine") for e in seen)


# -- every prompt settles once, with the right stop reason ----------------------------------

TEXTS = st.sampled_from(["alpha beta", "gamma", "delta epsilon zeta"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), TEXTS),
        st.tuples(st.just("send"), st.sampled_from([_Echo, _Other])),  # asking for an output
        st.tuples(st.just("steer"), TEXTS),
        st.tuples(st.just("withdraw"), st.integers(0, 30)),
        st.tuples(st.just("cancel"), st.sampled_from(["stop", "enough"])),
        st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.01, 0.03, 0.1])),
        st.tuples(st.just("read"), st.integers(0, 30)),
        st.tuples(st.just("dispose"), st.none()),
    ),
    max_size=30,
)


def fates(events: list[SessionEvent]) -> tuple[dict[str, int], dict[int, TurnEnd]]:
    """Which turn logged each message id, and each turn's end."""
    turn_of: dict[str, int] = {}
    ends: dict[int, TurnEnd] = {}
    current = 0
    for event in events:
        if isinstance(event, TurnStart):
            current = event.turn
        elif isinstance(event, UserMessage | SteeringMessage):
            turn_of[event.message_id] = current
        elif isinstance(event, TurnEnd):
            ends[event.turn] = event
    return turn_of, ends


@hypothesis.settings(
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture], max_examples=80
)
@hypothesis.given(ops=OPS)
# A reader that starts while its turn's tool runs (its tool/start the log's last event).
@hypothesis.example(ops=[("send", "gamma"), ("sleep", 0.03), ("read", 0), ("sleep", 0.1)])
# Steering into a turn that asked for an output (the steer has none of its own).
@hypothesis.example(ops=[("send", _Echo), ("sleep", 0.03), ("steer", "alpha beta"), ("sleep", 0.1)])
# A reader of a prompt queued behind a running turn (seeds 1 and 103 shrank to it): it spun
# on the log the running turn grew, and virtual time never moved.
@hypothesis.example(ops=[("send", "alpha beta"), ("send", _Echo), ("read", 0), ("sleep", 0.01)])
async def test_random_interleavings_settle_every_prompt_once_with_its_fate(
    ops: list[tuple[str, object]], autojump_clock: trio.testing.MockClock
) -> None:
    """send / steer / withdraw / cancel / dispose at random: every prompt settles, exactly
    once (its answer never changes), as the log says: the turn that logged it answers it
    with that turn's end; one no turn logged was withdrawn, aborted by a cancel with its
    reason, or disposed. Every `events()` reader sees exactly its turn's events from its
    call on, in log order."""
    model = ScriptedModel([[Say("x"), Wait(0.02), CallTool("echo", {"text": "y"})]] * 10)
    async with open_runtime(model=model, tools=[ECHO]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        prompts: list[Prompt[Any]] = []
        withdrawn: set[str] = set()
        cancels: dict[str, str] = {}  # message id -> reason of the cancel that dropped it
        reads: list[tuple[Prompt[Any], int, list[SessionEvent]]] = []
        async with trio.open_nursery() as readers:
            for op, arg in ops:
                if op == "send" and isinstance(arg, type):
                    prompts.append(agent.send(f"a {arg.__name__}", output=arg))
                elif op == "send":
                    assert isinstance(arg, str)
                    prompts.append(agent.send(arg))
                elif op == "steer":
                    assert isinstance(arg, str)
                    prompts.append(agent.steer(arg))
                elif op == "withdraw" and prompts:
                    assert isinstance(arg, int)
                    prompt = prompts[arg % len(prompts)]
                    if agent.withdraw(prompt.id):
                        withdrawn.add(prompt.id)
                elif op == "cancel":
                    assert isinstance(arg, str)
                    unsettled = [p.id for p in prompts if not p.settled]
                    agent.cancel(arg)
                    for message_id in unsettled:
                        cancels.setdefault(message_id, arg)
                elif op == "sleep":
                    assert isinstance(arg, float)
                    await trio.sleep(arg)
                elif op == "read" and prompts:
                    assert isinstance(arg, int)
                    prompt = prompts[-1 - arg % min(2, len(prompts))]  # the likeliest to run
                    seen: list[SessionEvent] = []
                    reads.append((prompt, agent.session.next_seq, seen))
                    readers.start_soon(collect, prompt.events(), seen)
                elif op == "dispose":
                    break
            await handle.dispose()
        events = list(agent.session.events)
    assert_enclosed(events)
    turn_of, ends = fates(events)
    # Steering asks for no output of its own: it joins whatever turn runs (its answer is
    # that turn's), so only queued prompts are held apart by their outputs.
    steered = {e.message_id for e in events if isinstance(e, SteeringMessage)}
    outputs: dict[int, set[type | None]] = {}
    for prompt in prompts:
        if prompt.id in turn_of and prompt.id not in steered:
            outputs.setdefault(turn_of[prompt.id], set()).add(prompt.output)
    assert all(len(kinds) == 1 for kinds in outputs.values()), "outputs shared a turn"
    for prompt in prompts:
        assert prompt.settled, f"{prompt!r} never settled"
        answer = await prompt
        assert (await prompt) is answer, "a prompt's answer changed"
        turn = turn_of.get(prompt.id)
        if turn is not None:
            end = ends[turn]
            assert answer.turn == turn
            expected = type(end.reason).__struct_config__.tag
            assert answer.stop_reason == expected, (prompt, end)
            if answer.stop_reason == "aborted":
                assert answer.reason == getattr(end.reason, "reason", None)
        elif prompt.id in withdrawn:
            assert answer == Answer(stop_reason="withdrawn")
        elif prompt.id in cancels:
            assert answer == Answer(stop_reason="aborted", reason=cancels[prompt.id])
        else:
            assert answer == Answer(stop_reason="disposed")
    for prompt, since, seen in reads:
        turn = turn_of.get(prompt.id)
        assert seen == ([] if turn is None else turn_events(events, turn, since))


async def test_a_turn_start_listener_that_cancels_aborts_the_prompt_it_took() -> None:
    async with open_runtime(model=ScriptedModel()) as rt:
        agent = await new_agent(rt)

        def cancel_at_start(agent_: Agent, turn: int) -> None:
            agent_.cancel("at the start")

        rt.hooks.on(AGENT_TURN_START, cancel_at_start)
        answer = await agent.run("go")
    assert (answer.stop_reason, answer.reason, answer.turn) == ("aborted", "at the start", 1)


async def test_a_withdraw_in_window_2_settles_withdrawn_without_a_turn() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        prompts: list[Prompt[None]] = []

        def withdraw_as_it_starts(agent_: Agent, status: str) -> None:
            if status == "running" and prompts:
                agent_.withdraw(prompts.pop().id)

        rt.hooks.on(AGENT_STATUS, withdraw_as_it_starts)
        prompt = agent.send("one")
        prompts.append(prompt)
        assert await prompt == Answer(stop_reason="withdrawn")
        assert agent.session.events == []


async def test_text_yields_the_turns_text_deltas_only() -> None:
    model = ScriptedModel(
        [[Think("hmm"), Say("Hel"), CallTool("echo", {"text": "x"})], [Say("lo")]]
    )
    async with open_runtime(model=model, tools=[ECHO]) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("go")
        texts = [text async for text in prompt.text()]
        answer = await prompt
    assert texts == ["Hel", "lo"]
    assert answer.text == "lo"


async def test_text_of_a_withdrawn_prompt_ends_empty() -> None:
    async with open_runtime(model=ScriptedModel([[Say("a"), Wait(1)]])) as rt:
        agent = await new_agent(rt)
        agent.send("first")
        second = agent.send("second", output=_Echo)  # a turn of its own, queued
        reader = second.text()
        assert agent.withdraw(second.id)
        assert [text async for text in reader] == []
