"""Sub-agents attacked: races of spawn, cancel and disposal, hostile models and callers."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import trio

from greenroom import Runtime, open_runtime
from greenroom.acp.connection import AcpConnection
from greenroom.actors.events import AGENT_STATUS, SUBAGENT_STARTED
from greenroom.actors.types import Agent, SpawnRefused
from greenroom.models import Hang, Say
from greenroom.protocol.events import DISPOSED, Aborted, SessionHeader, TurnEnd
from greenroom.session.persistence import JsonlPersistence, SessionLog
from greenroom.tools.subagents import task_plugin
from tests.acp_peer import bridge
from tests.actors.test_subagents import Routed, ends, record, results, task
from tests.persistence_helpers import Delegating


class GatedCreate(Delegating):
    """`create` of a session other than the first waits for `gate`: a spawn held in flight."""

    def __init__(self, inner: JsonlPersistence, *, free: set[str]) -> None:
        super().__init__(inner)
        self.free = free
        self.gate = trio.Event()
        self.waiting = trio.Event()

    async def create(self, header: SessionHeader) -> SessionLog:
        if header.id not in self.free:
            self.waiting.set()
            await self.gate.wait()
        return await super().create(header)


async def test_a_parent_disposed_while_a_spawn_is_in_flight_outlives_no_child(
    tmp_path: Path,
) -> None:
    store = GatedCreate(JsonlPersistence(tmp_path), free={"p"})
    model = Routed({"parent": [[Hang()]], "child:": [[Hang()]]})
    async with open_runtime(model=model, persistence=store) as rt:  # type: ignore[arg-type]
        seen = record(rt)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        outcome: list[object] = []

        async def spawn() -> None:
            try:
                outcome.append(await parent.spawn(agent_id="c", session_id="c"))
            except Exception as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(spawn)
            await store.waiting.wait()
            parent.agent.send("parent: hang")
            await trio.sleep(1)
            async with trio.open_nursery() as disposing:
                disposing.start_soon(parent.dispose)
                await trio.sleep(1)
                store.gate.set()
            # The parent's dispose has returned: no child of it is live, none will be.
            assert rt.agents.list() == []
        (refused,) = outcome
        assert isinstance(refused, SpawnRefused), refused
        assert "being disposed" in str(refused)
        assert rt.agents.list() == []
        assert [sid for sid, e in seen if isinstance(e, TurnEnd)] == ["p"]
        assert parent.agent.status == "disposed"
        assert parent.agent.session.events[-1] == ends(parent.agent.session)[-1]
        assert ends(parent.agent.session)[-1].reason == DISPOSED


async def test_a_cancel_as_the_task_call_starts_its_child_reaches_the_child() -> None:
    model = Routed({"parent": [[task("child: hang")], [Say("after")]], "child:": [[Hang()]]})
    async with open_runtime(model=model) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        rt.hooks.on(SUBAGENT_STARTED, lambda parent, _call, _child: parent.cancel("now"))
        parent = await rt.agents.create(agent_id="p", session_id="p")
        children: list[Agent] = []
        rt.hooks.on(SUBAGENT_STARTED, lambda _p, _c, child: children.append(child))
        before = trio.current_time()
        parent.agent.send("parent: go")
        await parent.agent.when_idle()
        # The cancel is prompt: it does not wait out the child's closing grace.
        assert trio.current_time() - before < 1
        assert ends(parent.agent.session)[-1].reason == Aborted("now")
        (child,) = children
        assert [e.reason for e in ends(child.session)] in ([], [Aborted("now")])
        (result,) = results(parent.agent.session)
        assert result.error is not None
        assert result.error.code == "aborted"


def _connections(runtime: Runtime) -> list[AcpConnection]:
    """The connections serving `runtime` (an earlier test's may not be collected yet)."""
    return [o for o in gc.get_objects() if isinstance(o, AcpConnection) and o.runtime is runtime]


async def test_acp_forgets_a_task_calls_child_that_ended_without_a_turn(tmp_path: Path) -> None:
    model = Routed({"parent": [[task("child: never runs")], [Say("after")]]})
    async with bridge(tmp_path, model) as b:  # type: ignore[arg-type]
        await b.runtime.plug("tool-task", task_plugin)
        session = await b.peer.new_session(str(tmp_path))
        parent = b.runtime.agents.by_session(session)
        assert parent is not None

        def cancel_as_the_child_starts(agent: Agent, status: str) -> None:
            if agent.session.header.parent_session == session and status == "running":
                parent.cancel("in window 2")  # the child's turn is dropped before it starts

        b.runtime.hooks.on(AGENT_STATUS, cancel_as_the_child_starts)
        children: list[Agent] = []
        b.runtime.hooks.on(SUBAGENT_STARTED, lambda _p, _c, child: children.append(child))
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "parent"}]}
        answer = await b.peer.call("session/prompt", prompt)
        assert answer["result"]["stopReason"] == "cancelled"
        (child,) = children
        assert child.status == "disposed"
        assert ends(child.session) == []
        (connection,) = _connections(b.runtime)
        assert not connection.subagents


async def test_spawn_refuses_tools_given_as_one_string() -> None:
    async with open_runtime() as rt:
        parent = await rt.agents.create(agent_id="p", session_id="p")
        # A str is a Sequence[str]: "read" would allow the tools "r", "e", "a" and "d".
        with pytest.raises(TypeError, match="tools"):
            await parent.spawn(agent_id="c", session_id="c", tools="read")
        assert parent.agent.session.id == "p"
        assert [a.id for a in rt.agents.list()] == ["p"]


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"agent_id": "c", "session_id": "c", "tool": ["read"]}, "unexpected.*'tool'"),
        ({"agent_id": "c"}, "missing.*'session_id'"),
    ],
)
async def test_spawn_names_a_keyword_it_does_not_take_or_lacks(
    given: dict[str, object], named: str
) -> None:
    async with open_runtime() as rt:
        parent = await rt.agents.create(agent_id="p", session_id="p")
        with pytest.raises(TypeError, match=named):
            await parent.spawn(**given)  # type: ignore[arg-type]
        assert [a.id for a in rt.agents.list()] == ["p"]


@pytest.mark.parametrize("at_turn", [True, False, -1, 2, 10**30, "1", 1.0, 1.5])
async def test_fork_refuses_a_turn_the_log_does_not_have(tmp_path: Path, at_turn: int) -> None:
    store = JsonlPersistence(tmp_path)
    async with open_runtime(persistence=store) as rt:
        original = await rt.agents.create(agent_id="o", session_id="o")
        original.agent.send("one")
        await original.agent.when_idle()
        with pytest.raises(ValueError, match="cannot fork it at turn"):
            await rt.agents.fork("o", "f", at_turn=at_turn)
        assert [s.header.id for s in await store.list()] == ["o"]
