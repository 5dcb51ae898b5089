"""Random interleavings of send / steer / inject / cancel / dispose keep the invariants."""

from __future__ import annotations

import itertools

import hypothesis
import hypothesis.strategies as st
import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.actors.events import AGENT_STATUS
from greenroom.actors.types import SpawnLimits, SpawnRefused
from greenroom.models import ScriptedModel
from greenroom.protocol.events import SteeringMessage, UserMessage
from tests.agents_helpers import assert_enclosed

TEXTS = st.sampled_from(["alpha beta", "gamma", "delta epsilon zeta"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), TEXTS),
        st.tuples(st.just("steer"), TEXTS),
        st.tuples(st.just("inject"), TEXTS),
        st.tuples(st.just("cancel"), st.none()),
        st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.01, 0.03, 0.1])),
        st.tuples(st.just("dispose"), st.none()),
    ),
    max_size=30,
)


def live_tasks() -> int:
    count = 0
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


@hypothesis.settings(
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture], max_examples=80
)
@hypothesis.given(ops=OPS)
async def test_random_interleavings_keep_the_invariants(
    ops: list[tuple[str, object]], autojump_clock: trio.testing.MockClock
) -> None:
    tasks_before = live_tasks()
    statuses: list[str] = []
    async with open_runtime(model=ScriptedModel(delay=0.02)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        rt.hooks.on(AGENT_STATUS, lambda a, status: statuses.append(status))
        pending: set[str] = set()  # sent or steered, not yet logged
        dropped: set[str] = set()  # pending when a cancel landed: must never run
        disposed = False
        for op, arg in ops:
            logged = {
                e.message_id
                for e in agent.session.events
                if isinstance(e, UserMessage | SteeringMessage)
            }
            pending -= logged
            if op == "send":
                assert isinstance(arg, str)
                pending.add(agent.send(arg).id)
            elif op == "steer":
                assert isinstance(arg, str)
                pending.add(agent.steer(arg).id)
            elif op == "inject":
                assert isinstance(arg, str)
                agent.inject(arg)
            elif op == "cancel":
                agent.cancel()
                dropped |= pending
                pending.clear()
            elif op == "sleep":
                assert isinstance(arg, float)
                await trio.sleep(arg)
            else:
                await handle.dispose()
                disposed = True
                break
        if not disposed:
            await agent.when_idle()
            await handle.dispose()
        events = agent.session.events
        assert_enclosed(events)
        assert agent.session.open_turn is None
        ran = {e.message_id for e in events if isinstance(e, UserMessage | SteeringMessage)}
        assert not (ran & dropped), "a prompt pending at a cancel ran after it"
        if not disposed:
            assert pending <= ran, "a prompt sent after the last cancel was lost"
        assert "disposed" in statuses
        assert statuses[statuses.index("disposed") :] == ["disposed"]
        assert all(a != b for a, b in itertools.pairwise(statuses))
        assert rt.agents.list() == []
        assert rt.sessions.list() == []
    assert live_tasks() == tasks_before


LIMITS = SpawnLimits()  # the runtime's default: a family past it is refused

FAMILY_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("spawn"), st.integers(0, 3), st.none()),
        st.tuples(st.just("send"), st.integers(0, 3), TEXTS),
        st.tuples(st.just("steer"), st.integers(0, 3), TEXTS),
        st.tuples(st.just("cancel"), st.integers(0, 3), st.none()),
        st.tuples(st.just("dispose"), st.integers(0, 3), st.none()),
        st.tuples(st.just("sleep"), st.none(), st.sampled_from([0.0, 0.01, 0.03, 0.1])),
    ),
    max_size=30,
)


@hypothesis.settings(
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture], max_examples=60
)
@hypothesis.given(ops=FAMILY_OPS)
# Past each limit: a chain deeper than max_depth, more than max_children at once.
@hypothesis.example(ops=[("spawn", i, None) for i in range(LIMITS.max_depth + 1)])
@hypothesis.example(ops=[("spawn", 0, None)] * (LIMITS.max_children + 1) + [("dispose", 1, None)])
async def test_random_interleavings_over_a_family_keep_the_invariants(
    ops: list[tuple[str, int | None, object]], autojump_clock: trio.testing.MockClock
) -> None:
    """Over a parent and its children: every agent's invariants hold, a cancel reaches
    the canceller's descendants, and no child outlives its parent."""
    tasks_before = live_tasks()
    async with open_runtime(model=ScriptedModel(delay=0.02)) as rt:
        root = await rt.agents.create(agent_id="a0", session_id="s0")
        handles = [root]
        parent_of: dict[int, int] = {}
        pending: dict[int, set[str]] = {0: set()}
        dropped: set[str] = set()

        def depth(index: int) -> int:
            return 0 if index not in parent_of else 1 + depth(parent_of[index])

        def descendants(index: int) -> list[int]:
            found = [index]
            for child, parent in parent_of.items():
                if parent == index:
                    found += descendants(child)
            return found

        for op, target, arg in ops:
            for index, handle in enumerate(handles):
                logged = {
                    e.message_id
                    for e in handle.agent.session.events
                    if isinstance(e, UserMessage | SteeringMessage)
                }
                pending[index] -= logged
            if op == "sleep":
                assert isinstance(arg, float)
                await trio.sleep(arg)
                continue
            assert target is not None
            index = target % len(handles)
            handle = handles[index]
            if handle.agent.status == "disposed":
                continue
            if op == "spawn":
                n = len(handles)
                live = [c for c, p in parent_of.items() if p == index]
                live = [c for c in live if handles[c].agent.status != "disposed"]
                if depth(index) >= LIMITS.max_depth or len(live) >= LIMITS.max_children:
                    with pytest.raises(SpawnRefused):
                        await handle.spawn(agent_id=f"a{n}", session_id=f"s{n}")
                    assert rt.agents.get(f"a{n}") is None
                    continue
                handles.append(await handle.spawn(agent_id=f"a{n}", session_id=f"s{n}"))
                parent_of[n] = index
                pending[n] = set()
            elif op == "send":
                assert isinstance(arg, str)
                pending[index].add(handle.agent.send(arg).id)
            elif op == "steer":
                assert isinstance(arg, str)
                pending[index].add(handle.agent.steer(arg).id)
            elif op == "cancel":
                handle.agent.cancel()
                for reached in descendants(index):
                    dropped |= pending[reached]
                    pending[reached].clear()
            else:
                await handle.dispose()
                for gone in descendants(index):
                    assert handles[gone].agent.status == "disposed", "a child outlived its parent"
                    assert rt.agents.get(f"a{gone}") is None
        await root.dispose()
        for handle in handles:
            events = handle.agent.session.events
            assert_enclosed(events)
            assert handle.agent.session.open_turn is None
            ran = {e.message_id for e in events if isinstance(e, UserMessage | SteeringMessage)}
            assert not (ran & dropped), "a prompt pending at a cancel ran after it"
        assert rt.agents.list() == []
        assert rt.sessions.list() == []
    assert live_tasks() == tasks_before
