"""Random interleavings of send / steer / inject / cancel / dispose keep the invariants."""

from __future__ import annotations

import itertools

import hypothesis
import hypothesis.strategies as st
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.actors.events import AGENT_STATUS
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
                pending.add(agent.send(arg))
            elif op == "steer":
                assert isinstance(arg, str)
                pending.add(agent.steer(arg))
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
