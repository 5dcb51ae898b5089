"""Hand-off on request (PostgreSQL): `resume(..., take_over="ask", wait=S)` asks the holder.

Two nodes in this process, each its own runtime over its own `PostgresPersistence`
(node names ``a`` and ``b``), on the suite's throwaway server: real LISTEN/NOTIFY,
real leases, on the real clock (each bounded by ``trio.fail_after``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.acp import serve_connection
from greenroom.protocol.events import Completed, SessionEvent, TurnEnd, UserMessage
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta
from greenroom.session.persistence import Holder, SessionLocked
from greenroom.session.persistence.postgres import PostgresPersistence
from greenroom.session.transcript import describe_stored
from tests.acp_peer import Peer
from tests.agents_helpers import assert_enclosed

pytestmark = pytest.mark.real_clock

LIMIT = 60


class Gated:
    """Answers ``ok``; while `gate` is set to an unset event, each reply waits for it."""

    def __init__(self) -> None:
        self.gate: trio.Event | None = None
        self.asked = trio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.asked.set()
        if self.gate is not None:
            await self.gate.wait()
        yield TextDelta("ok")
        yield Finish("stop")


@contextmanager
def node(dsn: str, name: str, **options: object) -> Iterator[PostgresPersistence]:
    store = PostgresPersistence(dsn, node=name, **options)  # type: ignore[arg-type]
    try:
        yield store
    finally:
        store.close()


async def stored(dsn: str) -> list[SessionEvent]:
    with node(dsn, "reader") as store:
        _, events = await store.load("s")
    return events


def user_texts(events: list[SessionEvent]) -> list[str]:
    return [e.content for e in events if isinstance(e, UserMessage)]


async def test_an_idle_holder_lets_go_at_once_and_the_asker_goes_on(postgres_dsn: str) -> None:
    with trio.fail_after(LIMIT), node(postgres_dsn, "a") as a, node(postgres_dsn, "b") as b:
        async with open_runtime(persistence=a) as rt_a, open_runtime(persistence=b) as rt_b:
            held = await rt_a.agents.create(agent_id="x", session_id="s")
            await held.agent.run("on a")
            with pytest.raises(SessionLocked, match="host a"):  # the default still refuses
                await rt_b.agents.resume(agent_id="y", session_id="s")
            asked = trio.current_time()
            taken = await rt_b.agents.resume(agent_id="y", session_id="s", take_over="ask", wait=10)
            assert trio.current_time() - asked < 5
            assert held.agent.status == "disposed"
            assert rt_a.agents.by_session("s") is None
            answer = await taken.agent.run("on b")
            assert answer.stop_reason == "completed"
            (listed,) = await a.list()  # the lease row, as `greenroom sessions list` shows it
            assert listed.holder == Holder(os.getpid(), "b")
            assert describe_stored(listed).endswith(f"held by pid {os.getpid()} on b")
    events = await stored(postgres_dsn)
    assert_enclosed(events)
    assert user_texts(events) == ["on a", "on b"]
    with node(postgres_dsn, "reader") as reader:
        (listed,) = await reader.list()
    assert listed.holder is None  # released at the runtime's end


async def test_a_busy_holder_lets_go_after_its_turn(postgres_dsn: str) -> None:
    with trio.fail_after(LIMIT), node(postgres_dsn, "a") as a, node(postgres_dsn, "b") as b:
        model = Gated()
        async with (
            open_runtime(model=model, persistence=a) as rt_a,
            open_runtime(persistence=b) as rt_b,
        ):
            held = await rt_a.agents.create(agent_id="x", session_id="s")
            model.gate = trio.Event()
            busy = held.agent.send("a long one")
            await model.asked.wait()
            got: list[object] = []

            async def ask() -> None:
                got.append(
                    await rt_b.agents.resume(agent_id="y", session_id="s", take_over="ask", wait=30)
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                await trio.sleep(1.0)
                assert got == []  # mid-turn: not yet
                assert held.agent.status == "running"
                model.gate.set()
            answer = await busy
            assert answer.stop_reason == "completed"  # its turn ran to its end, then let go
            assert str(held.agent.status) == "disposed"  # (mypy narrowed it to "running")
    events = await stored(postgres_dsn)
    assert_enclosed(events)
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [type(e.reason) for e in ends] == [Completed]


async def test_a_holder_that_keeps_busy_sessions_refuses_and_the_asker_is_told(
    postgres_dsn: str,
) -> None:
    with (
        trio.fail_after(LIMIT),
        node(postgres_dsn, "a", keep_busy=True) as a,
        node(postgres_dsn, "b") as b,
    ):
        model = Gated()
        async with (
            open_runtime(model=model, persistence=a) as rt_a,
            open_runtime(persistence=b) as rt_b,
        ):
            held = await rt_a.agents.create(agent_id="x", session_id="s")
            model.gate = trio.Event()
            held.agent.send("a long one")
            await model.asked.wait()
            asked = trio.current_time()
            with pytest.raises(SessionLocked, match=r"host a .*keeps busy sessions"):
                await rt_b.agents.resume(agent_id="y", session_id="s", take_over="ask", wait=30)
            assert trio.current_time() - asked < 10  # told, not timed out
            assert held.agent.status == "running"
            model.gate.set()


async def test_a_holder_that_never_answers_leaves_the_asker_to_its_wait(
    postgres_dsn: str,
) -> None:
    with trio.fail_after(LIMIT), node(postgres_dsn, "a") as a, node(postgres_dsn, "b") as b:
        async with open_runtime(persistence=a) as rt_a, open_runtime(persistence=b) as rt_b:
            held = await rt_a.agents.create(agent_id="x", session_id="s")
            a.releases.close()  # node a hears nothing more (its lease is still renewed)
            asked = trio.current_time()
            with pytest.raises(SessionLocked, match=r"host a .*did not let go within 1\.5s"):
                await rt_b.agents.resume(agent_id="y", session_id="s", take_over="ask", wait=1.5)
            assert 1.5 <= trio.current_time() - asked < 10
            assert held.agent.status == "idle"


async def test_ask_needs_a_persistence_that_hands_off(tmp_path: object) -> None:
    from greenroom.session.persistence import JsonlPersistence

    async with open_runtime(persistence=JsonlPersistence(f"{tmp_path}/s")) as rt:
        with pytest.raises(ValueError, match="cannot ask a holder to let go"):
            await rt.agents.resume(agent_id="y", session_id="s", take_over="ask", wait=1)
        with pytest.raises(ValueError, match="take_over must be one of refuse, ask"):
            await rt.agents.resume(agent_id="y", session_id="s", take_over="grab")  # type: ignore[arg-type]


async def test_an_acp_client_is_told_when_its_idle_session_is_handed_off(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """``greenroom acp --store postgresql://`` answers release requests: an idle session
    of its client is let go, the client told in the session; loading it asks again."""
    with trio.fail_after(LIMIT), node(postgres_dsn, "a") as a, node(postgres_dsn, "b") as b:
        async with open_runtime(persistence=a) as rt_a, open_runtime(persistence=b) as rt_b:
            client, server = trio.testing.memory_stream_pair()
            peer = Peer(client)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_connection, rt_a, server)
                nursery.start_soon(peer.read_loop)
                await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                session = await peer.new_session(str(tmp_path))
                prompt = [{"type": "text", "text": "on a"}]
                answered = await peer.call(
                    "session/prompt", {"sessionId": session, "prompt": prompt}
                )
                assert answered["result"]["stopReason"] == "end_turn"
                await rt_b.agents.resume(agent_id="b", session_id=session, take_over="ask", wait=10)
                told = await peer.wait_for(
                    lambda f: (
                        "handed to another node"
                        in str(f.get("params", {}).get("update", {}).get("content", {}))
                    )
                )
                assert told["params"]["sessionId"] == session
                again = await peer.call("session/prompt", {"sessionId": session, "prompt": prompt})
                assert again["error"]["code"] == -32002  # not a session of this client any more
                load = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
                refused = await peer.call("session/load", load)
                assert "on host b" in refused["error"]["message"]
                await peer.close()
                nursery.cancel_scope.cancel()


def test_greenroom_acp_keep_busy_reaches_the_store(postgres_dsn: str) -> None:
    from greenroom.session.persistence.urls import store_from_url

    for keep in (False, True):
        store = store_from_url(postgres_dsn, keep_busy=keep)
        assert isinstance(store, PostgresPersistence)
        assert store.keep_busy is keep
        store.close()
