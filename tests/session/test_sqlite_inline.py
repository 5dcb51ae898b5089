"""SQLite's inline commits: a write-ahead reaches the database without the writer thread,
falls back to the writer while the write lock is taken, and a durable flush after it is
covered by an fdatasync of the WAL before it returns."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import msgspec
import pytest
import trio

from greenroom.protocol.events import (
    COMPLETED,
    USER,
    MessageTrigger,
    SessionHeader,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.session.persistence import SqlitePersistence
from greenroom.session.persistence.batch import Call, run_call
from greenroom.session.persistence.sqlite import CHECKPOINT_EVERY, CHECKPOINT_LAG
from tests.persistence_helpers import Fsyncs

LIMIT = 20  # seconds; generous for a loaded machine


def _stored(db: Path) -> int:
    """The session's stored next seq, read on a connection of its own."""
    with sqlite3.connect(db) as reader:
        row = reader.execute("SELECT next_seq FROM sessions WHERE id = 's'").fetchone()
    assert row is not None
    return int(row[0])


def _start(seq: int) -> TurnStart:
    return TurnStart(seq=seq, time=1.0, turn=seq + 1, trigger=MessageTrigger(USER))


@pytest.mark.real_clock
async def test_a_write_ahead_commits_while_the_writer_is_busy(tmp_path: Path) -> None:
    """The writer's thread held by a long job; a write-ahead under the default policy
    still lands at once (its commit is made on the Trio thread)."""
    db = tmp_path / "sessions.sqlite"
    store = SqlitePersistence(db)
    release = threading.Event()
    try:
        with trio.fail_after(LIMIT):
            log = await store.create(SessionHeader(id="s", created_at=1))
            held = Call(lambda: release.wait(LIMIT))
            store.writer.submit(held)
            log.append(_start(0))
            with trio.move_on_after(5) as waited:
                await log.write_ahead()
            assert not waited.cancelled_caught, "the write-ahead waited for the writer"
            assert _stored(db) == 1
            release.set()
            await held.wait()
            await log.close()
    finally:
        release.set()
        store.close()


@pytest.mark.real_clock
async def test_a_write_ahead_waits_for_a_write_lock_held_elsewhere(tmp_path: Path) -> None:
    """Another connection holds the write lock: the write-ahead goes to the writer,
    which lands it once the lock is given back."""
    db = tmp_path / "sessions.sqlite"
    store = SqlitePersistence(db)
    try:
        with trio.fail_after(LIMIT):
            log = await store.create(SessionHeader(id="s", created_at=1))
            other = sqlite3.connect(db, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            done = trio.Event()

            async def write() -> None:
                log.append(_start(0))
                await log.write_ahead()
                done.set()

            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(write)
                    await trio.sleep(0.5)
                    assert not done.is_set()
                    assert _stored(db) == 0
                    other.execute("ROLLBACK")
            finally:
                other.close()
            assert _stored(db) == 1
            await log.close()
    finally:
        store.close()


async def test_always_returns_a_flush_only_after_the_wal_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``always`` a write-ahead's inline commit is not durable; the flush after it,
    with nothing left to commit, returns only after an fdatasync of the WAL covered it."""
    db = tmp_path / "sessions.sqlite"
    syncs = Fsyncs(monkeypatch, str(db) + "-wal")
    store = SqlitePersistence(db, sync="always")
    try:
        log = await store.create(SessionHeader(id="s", created_at=1))
        for turn in range(3):
            log.append(_start(2 * turn))
            log.append(
                msgspec.structs.replace(
                    TurnEnd(turn=turn + 1, reason=COMPLETED), seq=2 * turn + 1, time=1.0
                )
            )
            await log.write_ahead()
            assert _stored(db) == 2 * turn + 2
            await log.flush()
            assert syncs.covered() >= os.path.getsize(str(db) + "-wal")
        await log.close()
    finally:
        store.close()
    assert syncs.sizes


async def test_the_wal_stays_bounded_under_inline_commits(tmp_path: Path) -> None:
    """Inline commits never checkpoint; the writer's checkpoints (and, past their lag,
    commits sent to the writer) keep the WAL from growing with the log."""
    db = tmp_path / "sessions.sqlite"
    wal = Path(str(db) + "-wal")
    store = SqlitePersistence(db)
    try:
        log = await store.create(SessionHeader(id="s", created_at=1))
        first = 100
        for seq in range(first):
            log.append(_start(seq))
            await log.write_ahead()
        per_commit = wal.stat().st_size / first  # no checkpoint has run yet
        commits = 4 * (CHECKPOINT_LAG + CHECKPOINT_EVERY)
        for seq in range(first, commits):
            log.append(_start(seq))
            await log.write_ahead()
        assert _stored(db) == commits
        assert wal.stat().st_size <= per_commit * (CHECKPOINT_LAG + 2 * CHECKPOINT_EVERY)
        await log.close()
    finally:
        store.close()


@pytest.mark.real_clock
async def test_turns_that_end_while_a_wal_sync_waits_share_it_and_it_covers_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``turn``, three turns end while the writer is held: their syncs are one,
    which covers all three once it runs (the close after it has nothing to sync), and
    the stored title is the first prompt's."""
    db = tmp_path / "sessions.sqlite"
    syncs = Fsyncs(monkeypatch, str(db) + "-wal")
    store = SqlitePersistence(db)
    release = threading.Event()
    try:
        with trio.fail_after(LIMIT):
            log = await store.create(SessionHeader(id="s", created_at=1))
            entered = threading.Event()
            held = Call(lambda: (entered.set(), release.wait(LIMIT)))
            store.writer.submit(held)
            await trio.to_thread.run_sync(entered.wait)  # alone in its batch: the syncs queue
            for turn in range(3):
                log.append(_start(3 * turn))
                log.append(
                    msgspec.structs.replace(
                        UserMessage(content=f"prompt {turn}", source=USER, message_id=f"m{turn}"),
                        seq=3 * turn + 1,
                        time=1.0,
                    )
                )
                log.append(
                    msgspec.structs.replace(
                        TurnEnd(turn=turn + 1, reason=COMPLETED), seq=3 * turn + 2, time=1.0
                    )
                )
                await log.flush()
            assert _stored(db) == 9
            assert syncs.sizes == []
            release.set()
            await run_call(store.writer, lambda: None)  # after the turns' sync
            assert len(syncs.sizes) == 1
            await log.close()
            assert len(syncs.sizes) == 1  # the close found all three durable
    finally:
        release.set()
        store.close()
    with sqlite3.connect(db) as reader:
        assert reader.execute("SELECT title FROM sessions").fetchone() == ("prompt 0",)
