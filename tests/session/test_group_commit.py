"""Group commit on one writer: sessions that flush back to back share one batch (one
commit, one fsync), and a lone session never waits for company."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from greenroom.protocol.events import USER, MessageTrigger, SessionHeader, TurnStart
from greenroom.session.persistence import LeaseLost, SqlitePersistence
from greenroom.session.persistence.batch import Call
from greenroom.session.persistence.writer import Job, Writer

LIMIT = 60  # seconds; generous for a loaded machine
SESSIONS = 10
ROUNDS = 20


class Batches:
    """A writer's work: notes each batch's size and takes `cost` seconds, as a commit's
    fsync does (the worker thread blocks, the Trio thread runs on). The first batch also
    waits for `gate`."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.sizes: list[int] = []
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, batch: Sequence[Job]) -> None:
        with self._lock:
            self.sizes.append(len(batch))
        self.gate.wait(LIMIT)
        time.sleep(self.cost)


async def _session(writer: Writer[Job]) -> None:
    """Submit a job as soon as the one before is settled, `ROUNDS` times."""
    for _ in range(ROUNDS):
        job = Job()
        writer.submit(job)
        await job.wait()
        assert job.error is None


@pytest.mark.real_clock
async def test_sessions_flushing_back_to_back_come_to_share_every_batch() -> None:
    """Five sessions in a batch, five more queued behind it: once the first five are
    answered they come straight back, and from then on every batch holds all ten but
    the last (the five that started later, alone). Without gathering the two groups
    take turns at the batch for good, each paying a commit for half the sessions."""
    half = SESSIONS // 2
    batches = Batches(cost=0.002)
    writer: Writer[Job] = Writer(batches, gather=1.0)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            for _ in range(half):
                nursery.start_soon(_session, writer)
            while not batches.sizes:  # the worker is in the first batch
                await trio.sleep(0.01)
            for _ in range(half):
                nursery.start_soon(_session, writer)
            await trio.sleep(0.1)  # ... and the others are queued behind it
            batches.gate.set()
    assert sum(batches.sizes) == SESSIONS * ROUNDS
    assert batches.sizes[1:-1] == [SESSIONS] * (len(batches.sizes) - 2), batches.sizes


@pytest.mark.real_clock
async def test_a_lone_session_never_waits_for_company() -> None:
    """One session: each job finds the queue holding what the batch before expects (its
    own next job), so none waits the gather time (10 s here: twenty waits would pass the
    test's bound)."""
    batches = Batches(cost=0.0)
    batches.gate.set()
    writer: Writer[Job] = Writer(batches, gather=10.0)
    with trio.fail_after(LIMIT):
        await _session(writer)
    assert batches.sizes == [1] * ROUNDS


@pytest.mark.real_clock
async def test_a_gather_ends_at_its_time_when_nobody_comes_back() -> None:
    """A batch that ends with a job queued behind it waits for the sessions it answered;
    those that never come back hold the queued job only for the gather time."""
    entered, release = threading.Event(), threading.Event()
    sizes: list[int] = []

    def work(batch: Sequence[Job]) -> None:
        sizes.append(len(batch))
        if len(sizes) == 1:
            entered.set()
            release.wait(LIMIT)

    writer: Writer[Job] = Writer(work, gather=0.05)
    with trio.fail_after(LIMIT):
        first, second = Job(), Job()
        writer.submit(first)
        await trio.to_thread.run_sync(entered.wait)  # the worker is in the first batch
        writer.submit(second)  # queued behind it
        release.set()
        await first.wait()  # its session stops here: nobody comes back
        await second.wait()
    assert sizes == [1, 1]


@pytest.mark.real_clock
async def test_a_fenced_append_leaves_the_others_of_its_batch_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions' durable flushes in one transaction of the writer; one of them was
    taken over meanwhile: it gets `LeaseLost` and writes nothing, the other is stored."""
    db = tmp_path / "sessions.sqlite"
    store = SqlitePersistence(db, sync="always")
    batches: list[int] = []
    commit = store._commit
    monkeypatch.setattr(
        store, "_commit", lambda appends: (batches.append(len(appends)), commit(appends))
    )
    release = threading.Event()
    try:
        with trio.fail_after(LIMIT):
            logs = {sid: await store.create(SessionHeader(id=sid, created_at=1)) for sid in "ab"}
            with sqlite3.connect(db) as other:  # another life took "a" over
                other.execute("UPDATE sessions SET epoch = epoch + 1 WHERE id = 'a'")
            entered = threading.Event()
            held = Call(lambda: (entered.set(), release.wait(LIMIT)))
            store.writer.submit(held)  # both flushes queue behind it: one batch
            await trio.to_thread.run_sync(entered.wait)
            errors: dict[str, BaseException | None] = {}

            async def flush(sid: str) -> None:
                logs[sid].append(TurnStart(seq=0, time=1.0, turn=1, trigger=MessageTrigger(USER)))
                try:
                    await logs[sid].flush()
                    errors[sid] = None
                except LeaseLost as exc:
                    errors[sid] = exc

            async with trio.open_nursery() as nursery:
                for sid in "ab":
                    nursery.start_soon(flush, sid)
                await trio.sleep(0.1)
                release.set()
            await logs["b"].close()
            await logs["a"].close()
            _, stored_b = await store.load("b")
            _, stored_a = await store.load("a")
    finally:
        release.set()
        store.close()
    assert 2 in batches, batches  # the two appends shared a transaction
    assert isinstance(errors["a"], LeaseLost)
    assert errors["b"] is None
    assert [e.seq for e in stored_b] == [0, 1]  # its turn/start, and the closer a load adds
    assert stored_a == []
