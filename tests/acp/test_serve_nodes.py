"""Any node: two ``greenroom serve`` nodes on one PostgreSQL store, a client moving between
them. A load on node B of a session live on node A asks A to let go (the hand-off) and
serves it; A's client is told, then its connection ends."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from greenroom.acp.network import ServeLimits
from greenroom.session.persistence.postgres import PostgresPersistence
from tests.serve_clients import INITIALIZE, said, served, ws_client

pytestmark = [pytest.mark.real_clock, pytest.mark.postgres]


async def test_a_client_moves_from_node_a_to_node_b(tmp_path: Path, postgres_dsn: str) -> None:
    store_a = PostgresPersistence(postgres_dsn, node="a")
    store_b = PostgresPersistence(postgres_dsn, node="b")
    try:
        with trio.fail_after(60):
            async with (
                served(tmp_path / "a", persistence=store_a) as node_a,
                served(tmp_path / "b", persistence=store_b) as node_b,
                ws_client(node_a.ws_url) as on_a,
                ws_client(node_b.ws_url) as on_b,
            ):
                for client in (on_a, on_b):
                    await client.call("initialize", INITIALIZE)
                new = await on_a.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
                session = new["result"]["sessionId"]
                prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "on a"}]}
                await on_a.call("session/prompt", prompt)
                load = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
                loaded = await on_b.call("session/load", load)
                assert "result" in loaded, loaded
                assert "on a" in said(on_b.updates(session))  # the log, replayed from the store
                while "handed to another node" not in said(on_a.updates(session)):
                    await trio.sleep(0.02)
                assert node_a.runtime.agents.get(session) is None
                again = {"sessionId": session, "prompt": [{"type": "text", "text": "on b"}]}
                assert (await on_b.call("session/prompt", again))["result"] == {
                    "stopReason": "end_turn"
                }
                while not on_a.closed:  # told, then the connection's end: a reconnects
                    await trio.sleep(0.02)
    finally:
        store_a.close()
        store_b.close()


async def test_a_session_handed_off_no_longer_counts_as_held_on_the_node_it_left(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """Once node A let a session go to B, its client holds no session on A: a new one is
    within A's limit of one (it was refused as a second), and no connection of it stays."""
    store_a = PostgresPersistence(postgres_dsn, node="a")
    store_b = PostgresPersistence(postgres_dsn, node="b")
    where = {"cwd": str(tmp_path), "mcpServers": []}
    try:
        with trio.fail_after(60):
            async with (
                served(tmp_path / "a", persistence=store_a, limits=ServeLimits(sessions=1)) as a,
                served(tmp_path / "b", persistence=store_b) as b,
                ws_client(b.ws_url) as on_b,
            ):
                async with ws_client(a.ws_url) as on_a:
                    await on_a.call("initialize", INITIALIZE)
                    session = (await on_a.call("session/new", where))["result"]["sessionId"]
                    await on_b.call("initialize", INITIALIZE)
                    assert "result" in await on_b.call(
                        "session/load", {"sessionId": session, **where}
                    )
                    while not on_a.closed:  # told, then its connection ends
                        await trio.sleep(0.02)
                async with ws_client(a.ws_url) as again:
                    await again.call("initialize", INITIALIZE)
                    new = await again.call("session/new", where)
                    assert "result" in new, new
    finally:
        store_a.close()
        store_b.close()
