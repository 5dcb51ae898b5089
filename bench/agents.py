"""Agents: per-turn overhead, create + dispose, idle memory and cancel latency against raw Trio.

* turn: ``agent.send("ping"); await agent.when_idle()`` with a zero-latency
  `ScriptedModel` against a round trip through a raw echo task over two
  memory channels; the same with one call of a tool that returns at once
  (two model steps) against two round trips; and a turn after 4,000 prior
  turns against one after 10, both ours (a turn's cost must not grow with
  the session);
* run: ``await agent.run("ping")`` (the answer read) against the
  ``send`` + ``when_idle`` turn, and against the raw round trip;
* held prompt: traced bytes a settled prompt costs while held (never
  awaited, and awaited: its `Answer` made), measured as what dropping the
  held prompts frees;
* create + dispose: ``rt.agents.create(...)`` then ``handle.dispose()``,
  sequentially, against ``nursery.start`` of a task parked in its own
  `trio.CancelScope`, then cancelling that scope and waiting for the task;
* idle memory: traced bytes per idle agent (no turns) against a bare task
  parked in ``sleep_forever``, with `tracemalloc` (its own ``trio.run``); and
  per idle agent after one turn (its log, and the turns' scope it keeps);
* cancel: ``agent.cancel(); await agent.when_idle()`` with the model hung
  mid-turn against ``scope.cancel()`` of a parked task and waiting for it;
* spawn: ``parent.spawn(...)``, one turn of the child, its dispose, against
  ``rt.agents.create(...)``, one turn and dispose of a top-level agent;
* spec: ``rt.start(spec)``, one turn, dispose, against ``rt.agents.create``,
  one turn, dispose; and a turn of an agent with `Limits` and a prompt
  `Guard` against the same turn with neither (timed, and its calls counted);
* decisions: the traced memory of an agent whose turn is parked on a decision
  (`Defer`), beyond an idle agent; and the calls of a one-tool-call turn whose
  permission a policy answers at once (logged as a decision) against the same
  turn under `AllowAll` (not asked);
* cost profile: the one-step turn and the round trip counted, not timed
  (Python calls under ``sys.setprofile``, task steps by a Trio instrument,
  traced bytes kept), per op as the difference of runs of 2M and M ops: the
  turn's row says why its ratio moves from machine to machine (the baseline
  is scheduler-heavy, the turn call-heavy), and the calls row is the
  machine-independent ratio; and a one-step turn whose reply reports usage
  its model's price applies to, counted against the same turn of a model with
  no price (what pricing a step costs).

Every variant runs in a fresh ``trio.run``; the variants alternate inside
each repeat, with a ``gc.collect()`` before each.
"""

from __future__ import annotations

import datetime
import gc
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Final

import msgspec
import trio
import trio.lowlevel
import trio.testing

from bench.counting import Profile, profile
from bench.report import Row, compare
from greenroom import AgentOptions, AgentSpec, Guard, Limits
from greenroom.actors.types import Defer, PermissionDecision, PermissionRequest, Permissions
from greenroom.models import CallTool, Hang, Price, Prices, Say, ScriptedModel
from greenroom.protocol.events import AssistantChunk
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    Usage,
)
from greenroom.runtime import open_runtime
from greenroom.tools import Tool

SCENARIO = "agents"

#: The most checkpoints to wait for an agent to hang mid-turn before giving up.
_MAX_POLLS = 100_000

# -- (a) one-step text turn ---------------------------------------------------------------


async def _echo(
    inbound: trio.MemoryReceiveChannel[str], outbound: trio.MemorySendChannel[str]
) -> None:
    async for message in inbound:
        await outbound.send(message)


async def _raw_turns(m: int) -> float:
    """Microseconds per round trip through an echo task over two memory channels."""
    to_echo, echo_in = trio.open_memory_channel[str](1)
    echo_out, from_echo = trio.open_memory_channel[str](1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_echo, echo_in, echo_out)
        t0 = time.perf_counter()
        for _ in range(m):
            await to_echo.send("ping")
            await from_echo.receive()
        t1 = time.perf_counter()
        nursery.cancel_scope.cancel()
    return (t1 - t0) / m * 1e6


async def _run_turns(m: int) -> float:
    """Microseconds per one-step text turn as ``await agent.run(...)``, the answer read."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        t0 = time.perf_counter()
        for _ in range(m):
            answer = await agent.run("ping")
        t1 = time.perf_counter()
    if answer.turn != m or answer.text != "ping":
        raise RuntimeError(f"expected turn {m} answering 'ping', got {answer!r}")
    return (t1 - t0) / m * 1e6


async def _our_turns(m: int) -> float:
    """Microseconds per one-step text turn of one agent with a zero-latency model."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        t1 = time.perf_counter()
        turns = agent.session.last_turn
    if turns != m:
        raise RuntimeError(f"expected {m} turns in the session log, found {turns}")
    return (t1 - t0) / m * 1e6


class _NoArgs(msgspec.Struct):
    pass


async def _noop(_args: _NoArgs, _invocation: object) -> str:
    await trio.lowlevel.checkpoint()
    return "ok"


_NOOP = Tool("noop", "Return at once.", _NoArgs, _noop)


async def _raw_two_trips(m: int) -> float:
    """Microseconds per two round trips through the echo task."""
    return 2 * await _raw_turns(m)


async def _our_tool_turns(m: int) -> float:
    """Microseconds per turn of one tool call (then an answer), with a zero-latency model."""
    scripts = [s for _ in range(m) for s in ([CallTool("noop")], [Say("done")])]
    async with open_runtime(model=ScriptedModel(scripts, delay=0), tools=[_NOOP]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        return (time.perf_counter() - t0) / m * 1e6


# -- (a') a one-step turn whose reply reports usage: priced, or of a model with no price ---

_REPORTED: Final = (
    TextDelta("ping"),
    Usage(1000, 100, cache_read_tokens=500, reasoning_tokens=20),
    Finish("stop"),
)
#: The bench's own row (never the shipped figures): one of several, as a real table has.
_PRICES: Final = Prices(
    {
        name: Price(
            input=Decimal("2.50"),
            cached_input=Decimal("1.25"),
            cache_write=Decimal("2.50"),
            output=Decimal("10"),
            reasoning=Decimal("10"),
            as_of=datetime.date(2026, 1, 1),
            source="the bench",
        )
        for name in ("bench-model", "bench-model-mini", "bench", "other-model")
    }
)


class _Reporting:
    """A zero-latency model whose every reply is one word and a usage report."""

    async def _reply(self) -> AsyncIterator[StreamChunk]:
        for chunk in _REPORTED:
            yield chunk

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply()


async def _reported_turns(model_name: str, m: int) -> float:
    options = AgentOptions(model=model_name)
    async with open_runtime(model=_Reporting(), prices=_PRICES) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s", options=options)).agent
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        if agent.session.last_turn != m:
            raise RuntimeError(f"expected {m} turns, found {agent.session.last_turn}")
    return 0.0


async def _priced_turns(m: int) -> float:
    return await _reported_turns("bench-model", m)


async def _unpriced_turns(m: int) -> float:
    return await _reported_turns("no-such-model", m)


async def _turns_after(prior: int, m: int) -> float:
    """Microseconds per one-step turn of an agent whose session already has `prior` turns."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        for _ in range(prior):
            agent.send("ping")
            await agent.when_idle()
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        return (time.perf_counter() - t0) / m * 1e6


async def _after_10(m: int) -> float:
    return await _turns_after(10, m)


async def _after_4000(m: int) -> float:
    return await _turns_after(4_000, m)


# -- (b) create + dispose ---------------------------------------------------------------------


async def _scoped(
    exited: trio.Event,
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Park in an own CancelScope (handed back by ``started``); set `exited` on the way out."""
    try:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await trio.sleep_forever()
    finally:
        exited.set()


async def _raw_lifecycle(n: int) -> float:
    """Microseconds per ``nursery.start`` of a scoped task, then cancel and wait for it."""
    async with trio.open_nursery() as nursery:
        t0 = time.perf_counter()
        for _ in range(n):
            exited = trio.Event()
            scope: trio.CancelScope = await nursery.start(_scoped, exited)
            scope.cancel()
            await exited.wait()
        t1 = time.perf_counter()
    return (t1 - t0) / n * 1e6


async def _our_lifecycle(n: int) -> float:
    """Microseconds per ``rt.agents.create`` then ``handle.dispose()``, one agent at a time."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        t0 = time.perf_counter()
        for i in range(n):
            handle = await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}")
            await handle.dispose()
        t1 = time.perf_counter()
        # The supervisor forgets a disposed agent's child in its own task, after dispose returns.
        await trio.testing.wait_all_tasks_blocked()
        left = len(rt.agents.list()), len(rt.sessions.list()), len(rt.supervisor.tree().children)
    if any(left):
        raise RuntimeError(f"after dispose: (agents, sessions, supervisor children) = {left}")
    return (t1 - t0) / n * 1e6


async def _top_level_turn(n: int) -> float:
    """Microseconds per create + one turn + dispose of a top-level agent."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        t0 = time.perf_counter()
        for i in range(n):
            handle = await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}")
            handle.agent.send("ping")
            await handle.agent.when_idle()
            await handle.dispose()
        return (time.perf_counter() - t0) / n * 1e6


_SPEC = AgentSpec(name="a", model="default")  # the runtime's model, by its id


async def _spec_turn(n: int) -> float:
    """Microseconds per ``rt.start(spec)`` + one turn + dispose."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        t0 = time.perf_counter()
        for i in range(n):
            handle = await rt.start(_SPEC, f"s{i}")
            await handle.agent.run("ping")
            await handle.dispose()
        return (time.perf_counter() - t0) / n * 1e6


async def _create_turn(n: int) -> float:
    """Microseconds per ``rt.agents.create`` + one turn (``run``) + dispose."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        t0 = time.perf_counter()
        for i in range(n):
            handle = await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}")
            await handle.agent.run("ping")
            await handle.dispose()
        return (time.perf_counter() - t0) / n * 1e6


_BOUNDED = AgentOptions(
    limits=Limits(requests=10, tool_calls=10, total_tokens=10**9, session_requests=10**9),
    guards=(Guard(name="plain", prompt=lambda text: None),),
)


async def _bounded_turns(m: int) -> float:
    """Microseconds per one-step text turn of an agent with limits and a prompt guard."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", options=_BOUNDED)
        agent = handle.agent
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        t1 = time.perf_counter()
        turns = agent.session.last_turn
    if turns != m:
        raise RuntimeError(f"expected {m} turns in the session log, found {turns}")
    return (t1 - t0) / m * 1e6


async def _child_turn(n: int) -> float:
    """Microseconds per spawn + one turn + dispose of a child of one live parent."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        parent = await rt.agents.create(agent_id="parent", session_id="parent")
        t0 = time.perf_counter()
        for i in range(n):
            child = await parent.spawn(agent_id=f"c{i}", session_id=f"c{i}")
            child.agent.send("ping")
            await child.agent.when_idle()
            await child.dispose()
        took = (time.perf_counter() - t0) / n * 1e6
        await parent.dispose()
        return took


# -- (c) idle memory ------------------------------------------------------------------------


# -- (e) decisions: a permission asked and answered in process; a parked turn's memory ------


class _Allow:
    """A policy that answers at once: every permission it is asked is a decision."""

    async def decide(self, request: PermissionRequest) -> PermissionDecision:
        return "allow_once"


_ASKED: Final = Tool("deploy", "Deploy.", _NoArgs, _noop, kind="execute")


async def _permission_turns(m: int, permissions: Permissions | None) -> float:
    """Microseconds per turn of one call of an ``execute`` tool (then an answer)."""
    scripts = [s for _ in range(m) for s in ([CallTool("deploy")], [Say("done")])]
    model = ScriptedModel(scripts, delay=0)
    async with open_runtime(model=model, tools=[_ASKED], permissions=permissions) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        return (time.perf_counter() - t0) / m * 1e6


async def _asked_turns(m: int) -> float:
    return await _permission_turns(m, _Allow())


async def _unasked_turns(m: int) -> float:
    return await _permission_turns(m, None)


class _AlwaysCalls:
    """A zero-latency model whose every reply calls ``deploy``."""

    async def _reply(self) -> AsyncIterator[StreamChunk]:
        yield ToolCallChunk("call-1", "deploy", "{}")
        yield Finish("tool-calls")

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply()


async def _parked_memory(n: int) -> float:
    """Traced bytes per agent whose turn is parked on a permission (`Defer`): its prompt,
    its turn's events and its open decision included."""
    defer = AgentOptions(permissions=Defer())
    async with open_runtime(model=_AlwaysCalls(), tools=[_ASKED]) as rt:
        before = _traced()
        for i in range(n):
            agent = (
                await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}", options=defer)
            ).agent
            agent.send("ping")
        await trio.testing.wait_all_tasks_blocked()
        if agent.status != "waiting":
            raise RuntimeError(f"the agent is {agent.status}, not parked")
        after = _traced()
    return (after - before) / n


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def _raw_memory(n: int) -> float:
    """Traced bytes per bare task parked in ``sleep_forever``."""
    async with trio.open_nursery() as nursery:
        before = _traced()
        for _ in range(n):
            nursery.start_soon(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        after = _traced()
        nursery.cancel_scope.cancel()
    return (after - before) / n


async def _our_memory(n: int) -> float:
    """Traced bytes per idle agent (created, no turns)."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        before = _traced()
        for i in range(n):
            await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}")
        await trio.testing.wait_all_tasks_blocked()
        after = _traced()
    return (after - before) / n


async def _our_memory_after_turn(n: int) -> float:
    """Traced bytes per idle agent that has taken one turn: its log's events, and the
    turns' scope it keeps while idle, included."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        before = _traced()
        for i in range(n):
            handle = await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}")
            await handle.agent.run("ping")
        del handle
        await trio.testing.wait_all_tasks_blocked()
        after = _traced()
    return (after - before) / n


async def _held_prompts(n: int, awaited: bool) -> float:
    """Traced bytes per settled prompt held in a list (what dropping the list frees)."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        held = []
        for _ in range(n):
            prompt = agent.send("ping")
            if awaited:
                await prompt
            else:
                await agent.when_idle()
            held.append(prompt)
        if not all(prompt.settled for prompt in held):
            raise RuntimeError("a prompt of an idle agent is not settled")
        holding = _traced()
        del held, prompt
        return (holding - _traced()) / n


async def _held_settled(n: int) -> float:
    return await _held_prompts(n, awaited=False)


async def _held_awaited(n: int) -> float:
    return await _held_prompts(n, awaited=True)


def _run_traced(variant: Callable[[int], Awaitable[float]], n: int) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        return trio.run(variant, n)
    finally:
        tracemalloc.stop()


# -- (d) cancel to idle ---------------------------------------------------------------------


async def _raw_cancel(k: int) -> float:
    """Median microseconds from ``scope.cancel()`` of a parked task to its exit being seen."""
    samples: list[float] = []
    async with trio.open_nursery() as nursery:
        for _ in range(k):
            exited = trio.Event()
            scope: trio.CancelScope = await nursery.start(_scoped, exited)
            await trio.testing.wait_all_tasks_blocked()
            t0 = time.perf_counter()
            scope.cancel()
            await exited.wait()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


async def _our_cancel(k: int) -> float:
    """Median microseconds from ``agent.cancel()`` (model hung mid-turn) to ``when_idle()``."""
    model = ScriptedModel([[Say("x"), Hang()]] * k, delay=0)
    samples: list[float] = []
    async with open_runtime(model=model) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        events = agent.session.events
        for _ in range(k):
            agent.send("ping")
            for _ in range(_MAX_POLLS):
                if agent.status == "running" and isinstance(events[-1], AssistantChunk):
                    break
                await trio.lowlevel.checkpoint()
            else:
                raise RuntimeError(f"agent never hung mid-turn: {agent!r}, last {events[-1]!r}")
            t0 = time.perf_counter()
            agent.cancel()
            await agent.when_idle()
            samples.append(time.perf_counter() - t0)
            status: str = agent.status  # read afresh: mypy narrowed it to "running" above
            if status != "idle":
                raise RuntimeError(f"after cancel + when_idle the agent is {status!r}")
    return statistics.median(samples) * 1e6


# -- (f) cost profile of the turn and of its baseline ---------------------------------------


def _profile_note(turn: Profile, trip: Profile) -> str:
    return (
        f"counted per op: the turn {turn.calls:.0f} Python calls, {turn.steps:.1f} task"
        f" steps, {turn.kept:.0f} B kept (its log); the round trip {trip.calls:.0f} calls,"
        f" {trip.steps:.1f} steps, {trip.kept:.0f} B kept. The baseline is scheduler-heavy"
        " (Trio's run loop: task steps, epoll), the turn call- and allocation-heavy (fewer"
        " steps, more calls, msgspec events kept): the time ratio follows the interpreter's"
        " and allocator's speed relative to the scheduler's (a CPython built without"
        " PGO/LTO, or with --enable-shared, raises it); the calls row does not move"
    )


# -- the scenario ---------------------------------------------------------------------------


def _alternate(
    variants: Sequence[Callable[[int], Awaitable[float]]],
    size: int,
    repeats: int,
    runner: Callable[[Callable[[int], Awaitable[float]], int], float] = trio.run,
) -> dict[str, list[float]]:
    """One value per repeat per variant, each in a fresh run, the variants alternating."""
    results: dict[str, list[float]] = {v.__name__: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            gc.collect()
            results[variant.__name__].append(runner(variant, size))
    return results


def run(repeats: int, quick: bool) -> list[Row]:
    m = 300 if quick else 2_000  # turns
    n_life = 500 if quick else 10_000  # create + dispose
    n_mem = 500 if quick else 10_000  # idle agents
    k = 100 if quick else 500  # cancels

    turns = _alternate((_raw_turns, _our_turns, _run_turns), m, repeats)
    tool_turns = _alternate((_raw_two_trips, _our_tool_turns), m, repeats)
    growth = _alternate((_after_10, _after_4000), m, repeats)
    life = _alternate((_raw_lifecycle, _our_lifecycle), n_life, repeats)
    memory = _alternate(
        (_raw_memory, _our_memory, _our_memory_after_turn, _parked_memory),
        n_mem,
        min(repeats, 3),
        _run_traced,
    )
    held = _alternate((_held_settled, _held_awaited), m, min(repeats, 3), _run_traced)
    cancel = _alternate((_raw_cancel, _our_cancel), k, repeats)
    spawn = _alternate((_top_level_turn, _child_turn), n_life // 4, repeats)
    starts = _alternate((_create_turn, _spec_turn), n_life // 4, repeats)
    bounded = _alternate((_our_turns, _bounded_turns), m, repeats)
    counted = min(m, 300)  # the counts do not vary; the profiler slows each op ~3x
    turn, trip = profile(_our_turns, counted), profile(_raw_turns, counted)
    guarded = profile(_bounded_turns, counted)
    priced, unpriced = profile(_priced_turns, counted), profile(_unpriced_turns, counted)
    asked, unasked = profile(_asked_turns, counted), profile(_unasked_turns, counted)
    return [
        compare(
            SCENARIO,
            f"one-step text turn, scripted delay=0 (M={m})",
            "us",
            turns["_our_turns"],
            baseline="memory-channel round trip",
            raw=turns["_raw_turns"],
            max_ratio=2.0,
            note=_profile_note(turn, trip),
        ),
        compare(
            SCENARIO,
            f"Python calls per one-step text turn, counted (M={counted})",
            "calls",
            [turn.calls],
            baseline="per memory-channel round trip",
            raw=[trip.calls],
        ),
        compare(
            SCENARIO,
            f"Python calls per one-step turn reporting usage, priced, counted (M={counted})",
            "calls",
            [priced.calls],
            baseline="the same turn, its model without a price",
            raw=[unpriced.calls],
            max_ratio=1.05,
            note="the difference is the step's price: Requests.priced, Prices.priced, find"
            " and its separator check, Price.cost",
        ),
        compare(
            SCENARIO,
            f"await agent.run(text) one-step turn (M={m})",
            "us",
            turns["_run_turns"],
            baseline="send + when_idle turn",
            raw=turns["_our_turns"],
            max_ratio=1.1,
        ),
        compare(
            SCENARIO,
            f"await agent.run(text) one-step turn vs raw (M={m})",
            "us",
            turns["_run_turns"],
            baseline="memory-channel round trip",
            raw=turns["_raw_turns"],
            max_ratio=2.5,
        ),
        compare(
            SCENARIO,
            f"one-tool-call turn, scripted delay=0 (M={m})",
            "us",
            tool_turns["_our_tool_turns"],
            baseline="two memory-channel round trips",
            raw=tool_turns["_raw_two_trips"],
            max_ratio=2.0,
        ),
        compare(
            SCENARIO,
            f"one-step turn after 4,000 prior turns (M={m})",
            "us",
            growth["_after_4000"],
            baseline="the same turn after 10 prior turns",
            raw=growth["_after_10"],
            max_ratio=1.1,
        ),
        compare(
            SCENARIO,
            f"create + dispose per agent (N={n_life})",
            "us",
            life["_our_lifecycle"],
            baseline="nursery.start+CancelScope, cancel, wait",
            raw=life["_raw_lifecycle"],
            max_ratio=3.0,
        ),
        compare(
            SCENARIO,
            f"traced memory per idle agent (N={n_mem})",
            "B",
            memory["_our_memory"],
            baseline="bare task in sleep_forever",
            raw=memory["_raw_memory"],
            max_value=3500,
            note="its turn driver, compactor, decisions, history list and loop frame are made"
            " at the first work: an agent that never had work holds none",
        ),
        compare(
            SCENARIO,
            f"traced memory per idle agent after one turn, its log included (N={n_mem})",
            "B",
            memory["_our_memory_after_turn"],
            baseline="an idle agent that never took a turn",
            raw=memory["_our_memory"],
        ),
        compare(
            SCENARIO,
            f"traced memory per agent whose turn is parked on a decision (N={n_mem})",
            "B",
            [p - i for p, i in zip(memory["_parked_memory"], memory["_our_memory"], strict=True)],
            max_value=1024,
            note="beyond an idle agent that never took a turn: the prompt, the turn's events"
            " so far, the open decision, the turns' scope, the driver, and the parked task's"
            " 12 frames (~4.2 KB: drive to the decision's park; the goal needs them unwound,"
            " and the log alone is more than 1 KB, see the next row)",
        ),
        compare(
            SCENARIO,
            f"traced memory per agent whose turn is parked, beyond one after a turn (N={n_mem})",
            "B",
            [
                p - i
                for p, i in zip(
                    memory["_parked_memory"], memory["_our_memory_after_turn"], strict=True
                )
            ],
            note="beyond an idle agent that took one one-step turn (its log, driver and"
            " turns' scope kept): what parking itself costs, the frames the larger part",
        ),
        compare(
            SCENARIO,
            f"Python calls per one-tool-call turn whose permission is asked, counted (M={counted})",
            "calls",
            [asked.calls],
            baseline="the same turn, not asked (AllowAll)",
            raw=[unasked.calls],
            note=f"{asked.calls - unasked.calls:+.0f} calls to ask a policy and log the decision",
        ),
        compare(
            SCENARIO,
            f"traced memory per held settled prompt, never awaited (N={m})",
            "B",
            held["_held_settled"],
            max_value=300,
        ),
        compare(
            SCENARIO,
            f"traced memory per held settled prompt, awaited: with its Answer (N={m})",
            "B",
            held["_held_awaited"],
        ),
        compare(
            SCENARIO,
            f"cancel() to when_idle(), model hung (median of K={k})",
            "us",
            cancel["_our_cancel"],
            baseline="CancelScope.cancel() to task exit",
            raw=cancel["_raw_cancel"],
            max_ratio=2.0,
        ),
        compare(
            SCENARIO,
            f"rt.start(spec) + one turn + dispose (N={n_life // 4})",
            "us",
            starts["_spec_turn"],
            baseline="agents.create + one turn + dispose",
            raw=starts["_create_turn"],
            max_ratio=1.2,
        ),
        compare(
            SCENARIO,
            f"one-step turn with limits and a prompt guard (M={m})",
            "us",
            bounded["_bounded_turns"],
            baseline="the same turn with neither",
            raw=bounded["_our_turns"],
            max_ratio=1.2,
        ),
        compare(
            SCENARIO,
            f"Python calls per one-step turn with limits and a prompt guard (M={counted})",
            "calls",
            [guarded.calls],
            baseline="per turn with neither",
            raw=[turn.calls],
            note=f"{guarded.calls - turn.calls:+.0f} calls; the goal is at most +5",
        ),
        compare(
            SCENARIO,
            f"spawn + one child turn + dispose (N={n_life // 4})",
            "us",
            spawn["_child_turn"],
            baseline="create + one turn + dispose, top level",
            raw=spawn["_top_level_turn"],
            max_ratio=1.3,
        ),
    ]
