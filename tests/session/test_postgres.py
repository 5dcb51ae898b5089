"""Sessions on PostgreSQL across nodes, against the suite's real server: no mocks.

Two ``greenroom acp --store postgresql://...`` processes play two nodes. A node that
dies loses its sessions at once; a node that is merely paused loses them after its lease
ran out, and when it wakes it writes nothing into them. The server going away under a
live node fails writes as typed errors and loses nothing.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import msgspec
import psycopg
import pytest
import trio

from greenroom import open_runtime
from greenroom.cli import main
from greenroom.models import ScriptedModel
from greenroom.protocol.events import (
    USER,
    Errored,
    MessageTrigger,
    SessionEvent,
    SessionHeader,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.session.persistence import (
    LeaseLost,
    PersistenceError,
    SessionExists,
    SessionLocked,
)
from greenroom.session.persistence.postgres import PostgresPersistence, own_parameters
from tests.acp_process import acp_process
from tests.agents_helpers import assert_enclosed, turn_ends
from tests.pg_server import PgServer

pytestmark = pytest.mark.real_clock

LIMIT = 60
TTL = 2.0


async def _stored(dsn: str, session: str) -> list[SessionEvent]:
    store = PostgresPersistence(dsn)
    try:
        _, events = await store.load(session)
    finally:
        store.close()
    return list(events)


async def test_a_second_node_is_refused_then_takes_over_at_once_when_the_first_dies(
    tmp_path: Path, postgres_dsn: str
) -> None:
    store = ("--store", postgres_dsn, "--lease-ttl", "30", "--model", "scripted:0")
    load = {"cwd": str(tmp_path), "mcpServers": []}
    with trio.fail_after(LIMIT):
        async with acp_process(tmp_path / "a", *store) as node_a:
            session = await node_a.new_session(str(tmp_path))
            assert (await node_a.prompt(session, "from a"))["result"]["stopReason"] == "end_turn"
            async with acp_process(tmp_path / "b", *store) as node_b:
                refused = await node_b.call("session/load", {"sessionId": session, **load})
                assert f"live in pid {node_a.process.pid} on host" in refused["error"]["message"]
                killed = time.monotonic()
                node_a.process.send_signal(signal.SIGKILL)
                await node_a.process.wait()
                loaded = await node_b.call("session/load", {"sessionId": session, **load})
                takeover = time.monotonic() - killed
                assert "result" in loaded, loaded
                assert takeover < 5  # the dead node's lease is taken at once, not after 30 s
                reply = await node_b.prompt(session, "from b")
                assert reply["result"]["stopReason"] == "end_turn"
                assert await node_b.close() == 0
    events = await _stored(postgres_dsn, session)
    assert_enclosed(events)
    assert [e.content for e in events if isinstance(e, UserMessage)] == ["from a", "from b"]
    assert [t for t, _ in turn_ends(events)] == [1, 2]


async def test_a_paused_node_loses_its_lease_and_writes_nothing_when_it_wakes(
    tmp_path: Path, postgres_dsn: str
) -> None:
    store = ("--store", postgres_dsn, "--lease-ttl", str(TTL), "--model", "scripted:0")
    load = {"cwd": str(tmp_path), "mcpServers": []}
    with trio.fail_after(LIMIT):
        async with (
            acp_process(tmp_path / "a", *store) as node_a,
            acp_process(tmp_path / "b", *store) as node_b,
        ):
            session = await node_a.new_session(str(tmp_path))
            assert (await node_a.prompt(session, "a one"))["result"]["stopReason"] == "end_turn"
            node_a.process.send_signal(signal.SIGSTOP)
            try:
                await trio.sleep(TTL * 1.5)
                loaded = await node_b.call("session/load", {"sessionId": session, **load})
                assert "result" in loaded, loaded
                assert (await node_b.prompt(session, "b one"))["result"]["stopReason"] == "end_turn"
            finally:
                node_a.process.send_signal(signal.SIGCONT)
            late = await node_a.prompt(session, "a two, too late")
            assert late["error"]["code"] == -32603
            assert "was taken over by another node" in late["error"]["message"]
            assert (await node_b.prompt(session, "b two"))["result"]["stopReason"] == "end_turn"
            assert await node_b.close() == 0
    events = await _stored(postgres_dsn, session)
    assert_enclosed(events)
    assert [e.content for e in events if isinstance(e, UserMessage)] == ["a one", "b one", "b two"]


async def test_a_second_create_of_a_live_session_leaves_its_holder_holding(
    postgres_dsn: str,
) -> None:
    first, other = PostgresPersistence(postgres_dsn), PostgresPersistence(postgres_dsn)
    try:
        with trio.fail_after(LIMIT):
            log = await first.create(SessionHeader(id="s", created_at=1))
            with pytest.raises(SessionExists):
                await first.create(SessionHeader(id="s", created_at=1))
            with pytest.raises(SessionLocked):
                await other.open("s")
            await log.close()
    finally:
        first.close()
        other.close()


async def test_a_holder_cut_off_never_writes_into_a_session_made_anew_under_its_id(
    postgres_dsn: str,
) -> None:
    first = PostgresPersistence(postgres_dsn)
    try:
        with trio.fail_after(LIMIT):
            old = await first.create(SessionHeader(id="s", created_at=1))
            with psycopg.connect(postgres_dsn, autocommit=True) as db:  # the holder cut off
                cut = [
                    pid
                    for pid, _ in db.execute(
                        "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE pid <> pg_backend_pid() AND datname = current_database()"
                        " AND backend_type = 'client backend'"
                    )
                ]
                # A terminated backend lets its advisory locks go when it has exited.
                while db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (cut,)
                ).fetchone() != (0,):
                    await trio.sleep(0.01)
            second = PostgresPersistence(postgres_dsn)
            await second.delete("s")
            new = await second.create(SessionHeader(id="s", created_at=2))
            old.append(_at(0, TurnStart(turn=1, trigger=MessageTrigger(USER))))
            with pytest.raises(PersistenceError, match="terminating connection"):
                await old.write_ahead()  # its connection was cut; the event is kept
            with pytest.raises(LeaseLost):
                await old.write_ahead()
            await new.close()
            await old.close()
            second.close()
    finally:
        first.close()
    assert await _stored(postgres_dsn, "s") == []


async def test_the_server_going_away_fails_writes_and_loses_nothing(
    tmp_path: Path, pg_server: PgServer, postgres_dsn: str
) -> None:
    store = PostgresPersistence(postgres_dsn)
    errors: list[str] = []
    try:
        with trio.fail_after(LIMIT):
            async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
                agent.send("before")
                await agent.when_idle()
                await trio.to_thread.run_sync(pg_server.stop)
                try:
                    agent.send("while it is gone")
                    await agent.when_idle()
                finally:
                    await trio.to_thread.run_sync(pg_server.start)
                ends = turn_ends(agent.session.events)
                assert isinstance(ends[-1][1], Errored)
                errors.append(ends[-1][1].message)
                agent.send("after")
                await agent.when_idle()
                live = list(agent.session.events)
    finally:
        store.close()
    assert "could not be written" in errors[0]
    stored = await _stored(postgres_dsn, "s")
    assert stored == live  # what failed was kept and written once the server was back
    assert_enclosed(stored)
    assert [e.content for e in stored if isinstance(e, UserMessage)] == [
        "before",
        "while it is gone",
        "after",
    ]
    assert len([e for e in stored if isinstance(e, TurnEnd)]) == 3


def _at(seq: int, event: SessionEvent) -> SessionEvent:
    return msgspec.structs.replace(event, seq=seq)


def test_sessions_list_reads_a_postgres_store(
    tmp_path: Path, postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def one() -> None:
        store = PostgresPersistence(postgres_dsn)
        try:
            async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
                handle = await rt.agents.create(agent_id="a", session_id="pg-1", cwd="/tmp")
                handle.agent.send("hello postgres")
                await handle.agent.when_idle()
        finally:
            store.close()

    trio.run(one)
    assert main(["sessions", "--store", postgres_dsn, "list"]) == 0
    assert "pg-1" in capsys.readouterr().out


# -- deadlines ---------------------------------------------------------------------------


def _settings(db: psycopg.Connection[object]) -> list[str]:
    names = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    return [str(db.execute(f"SHOW {name}").fetchone()[0]) for name in names]  # type: ignore[index]


def test_every_connection_has_its_deadlines_and_the_url_sets_them(postgres_dsn: str) -> None:
    store = PostgresPersistence(postgres_dsn)
    try:
        assert (store.statement_timeout, store.lock_timeout) == (5.0, 2.0)
        assert store.writer.deadline == 5.0
        with store.connect() as db:
            assert _settings(db) == ["5s", "2s", "5s"]
            parameters = db.info.get_parameters()
            assert parameters["connect_timeout"] == "5"
            assert (parameters["keepalives"], parameters["keepalives_idle"]) == ("1", "5")
            assert parameters["tcp_user_timeout"] == "10000"
            assert db.execute("SHOW search_path").fetchone()[0].startswith("test_")  # type: ignore[index]
    finally:
        store.close()
    given = f"{postgres_dsn}&statement_timeout=1500ms&lock_timeout=250&connect_timeout=3"
    store = PostgresPersistence(given)
    try:
        assert (store.statement_timeout, store.lock_timeout) == (1.5, 0.25)
        assert store.writer.deadline == 1.5
        assert "statement_timeout" not in store.dsn  # libpq would refuse it
        with store.connect() as db:
            assert _settings(db) == ["1500ms", "250ms", "1500ms"]
            assert db.info.get_parameters()["connect_timeout"] == "3"  # the DSN's own kept
    finally:
        store.close()


def test_sessions_list_reads_a_store_url_with_deadlines(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = PostgresPersistence(postgres_dsn)
    store.close()  # the tables made
    given = f"{postgres_dsn}&statement_timeout=2s&lock_timeout=1s"
    assert main(["sessions", "--store", given, "list"]) == 0
    assert "no sessions in" in capsys.readouterr().err


def test_a_duration_that_does_not_read_is_refused_naming_it(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(PersistenceError, match="statement_timeout='soon' in the PostgreSQL DSN"):
        PostgresPersistence(f"{postgres_dsn}&statement_timeout=soon")
    PostgresPersistence(postgres_dsn).close()  # the tables made: a reader gets as far
    assert main(["sessions", "--store", f"{postgres_dsn}&lock_timeout=2h", "list"]) == 2
    assert "lock_timeout='2h' in the PostgreSQL DSN is not a duration" in capsys.readouterr().err


async def test_a_row_held_by_a_silent_node_fails_the_take_over_at_the_lock_timeout(
    postgres_dsn: str,
) -> None:
    """A node cut off mid-append holds the session's row lock; another node's take-over
    waits `lock_timeout` for it and fails, instead of waiting for as long as it is held."""
    store = PostgresPersistence(f"{postgres_dsn}&lock_timeout=300ms")
    try:
        log = await store.create(_header("s"))
        await log.close()
        with psycopg.connect(postgres_dsn) as silent:  # a transaction left open
            silent.execute("SELECT 1 FROM greenroom_sessions WHERE id = 's' FOR UPDATE")
            began = time.monotonic()
            with trio.fail_after(LIMIT), pytest.raises(PersistenceError, match="lock timeout"):
                await store.open("s")
            assert time.monotonic() - began < 3
        _, events, log = await store.open("s")  # the lock gone, the take-over goes through
        await log.close()
        assert events == []
    finally:
        store.close()


def _header(session_id: str) -> SessionHeader:
    return SessionHeader(id=session_id, created_at=int(time.time() * 1000), cwd="/tmp")


def test_the_deadlines_are_read_off_every_form_of_dsn() -> None:
    assert own_parameters("postgresql:///db?host=/run/pg&password=x") == (
        "postgresql:///db?host=/run/pg&password=x",  # none of ours: as given, to the byte
        {},
    )
    assert own_parameters("postgresql:///db?host=/run/pg&statement_timeout=2s") == (
        "postgresql:///db?host=%2Frun%2Fpg",  # no host in the authority: still a URL
        {"statement_timeout": "2s"},
    )
    assert own_parameters("postgresql://u@h:5/db?lock_timeout=1s") == (
        "postgresql://u@h:5/db",
        {"lock_timeout": "1s"},
    )
    assert own_parameters("host=/run/pg dbname=db statement_timeout='3 s' user=u") == (
        "host=/run/pg dbname=db user=u",
        {"statement_timeout": "3 s"},
    )
