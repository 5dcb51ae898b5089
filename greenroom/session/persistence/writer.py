"""`Writer`: a persistence's blocking work (fsyncs, transactions) on one worker thread at a time.

The Trio side hands it `Job`s with `submit`, which never blocks and never
checkpoints. Jobs that arrive while a batch runs wait for the next one, so
work from many sessions coalesces: a backend sees a whole batch at once and
can give it one fsync or one transaction (group commit). The thread comes
from Trio's thread cache (`trio.lowlevel.start_thread_soon`): none is
spawned per batch, and none is left parked when there is no work. Each job
is settled on the Trio thread, through the submitting run's token.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import trio

J = TypeVar("J", bound="Job")

_writers: weakref.WeakSet[Writer[Job]] = weakref.WeakSet()


def writers_busy(token: trio.lowlevel.TrioToken) -> bool:
    """True while any writer holds a job of the run `token` names that is not settled yet
    (a test clock holds still meanwhile). A writer stuck on another run's job (a test
    before) does not count."""
    return any(writer.serves(token) for writer in list(_writers))


class Job:
    """One piece of work and its outcome: ``error`` is set by the batch when it failed.

    `wait` returns once the job is settled (checkpoints). ``on_settled``, if
    set, is called on the Trio thread when it is.
    """

    __slots__ = ("_event", "error", "on_settled", "settled")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.settled = False
        self.on_settled: Callable[[Job], None] | None = None
        self._event: trio.Event | None = None

    def settle(self) -> None:
        self.settled = True
        if self._event is not None:
            self._event.set()
        if self.on_settled is not None:
            self.on_settled(self)

    async def wait(self) -> None:
        if self.settled:
            await trio.lowlevel.checkpoint()
            return
        if self._event is None:
            self._event = trio.Event()
        await self._event.wait()


class Writer(Generic[J]):
    """Runs ``work(batch)`` in a worker thread for every batch of submitted jobs, in order.

    `work` sets ``job.error`` on each job that failed; if it raises, every
    job of the batch without an error gets that exception.
    """

    __slots__ = ("__weakref__", "_draining", "_lock", "_queue", "_unsettled", "_work")

    def __init__(self, work: Callable[[Sequence[J]], None]) -> None:
        self._work = work
        self._lock = threading.Lock()
        self._queue: list[tuple[J, trio.lowlevel.TrioToken]] = []
        self._draining = False  # a worker thread is taking batches off the queue
        # Jobs submitted and not yet settled, per run. Counted down on the run's own thread,
        # as the job is settled, so whoever checks after that step sees it done.
        self._unsettled: dict[trio.lowlevel.TrioToken, int] = {}
        _writers.add(self)  # type: ignore[arg-type]

    def submit(self, job: J) -> None:
        """Queue `job` (from the Trio thread); it runs in the current or the next batch."""
        token = trio.lowlevel.current_trio_token()
        with self._lock:
            self._queue.append((job, token))
            self._unsettled[token] = self._unsettled.get(token, 0) + 1
            if self._draining:
                return
            self._draining = True
        trio.lowlevel.start_thread_soon(self._drain, _ignore)

    def serves(self, token: trio.lowlevel.TrioToken) -> bool:
        """True while a job of the run `token` names is queued, in work or not yet settled."""
        with self._lock:
            return token in self._unsettled

    def _drain(self) -> None:
        """The worker thread: batches until the queue is empty."""
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._draining = False
                    return
            try:
                self._work([job for job, _ in batch])
            except BaseException as exc:  # a backend's bug still settles every job
                for job, _ in batch:
                    if job.error is None:
                        job.error = exc
            for job, token in batch:
                try:
                    token.run_sync_soon(self._settle, job, token)
                except trio.RunFinishedError:  # the run that waited is gone
                    self._count_settled(token)

    def _settle(self, job: J, token: trio.lowlevel.TrioToken) -> None:
        self._count_settled(token)
        job.settle()

    def _count_settled(self, token: trio.lowlevel.TrioToken) -> None:
        with self._lock:
            left = self._unsettled[token] - 1
            if left:
                self._unsettled[token] = left
            else:
                del self._unsettled[token]


def _ignore(outcome: object) -> None:
    pass
