"""`Writer`: a persistence's blocking work (fsyncs, transactions) on one worker thread at a time.

The Trio side hands it `Job`s with `submit`, which never blocks and never
checkpoints. Jobs that arrive while a batch runs wait for the next one, so
work from many sessions coalesces: a backend sees a whole batch at once and
can give it one fsync or one transaction (group commit). The thread comes
from Trio's thread cache (`trio.lowlevel.start_thread_soon`): none is
spawned per batch, and none is left parked when there is no work. Each job
is settled on the Trio thread, through the submitting run's token.

**Deadlines.** Every job must settle within the writer's ``deadline``
(seconds from its submission). A waiter that sees the deadline pass settles
the job itself, as failed with `OperationTimeout`: a stuck worker thread (a
hung fsync, a server that stopped answering) cannot hold its caller. The
thread is abandoned to finish when it can; a job abandoned before the worker
reached it never runs, one it was running may still land. While a job past
its deadline is still running, the writer is *stuck*: every job submitted
meanwhile fails at once (it could only queue behind), so a teardown pays the
deadline once, not once per operation. Only a batch at work can be stuck: a
job whose deadline passes after its batch returned (its settling not yet seen
on the Trio side) fails, and the writer goes on.

**Gathering.** With a ``gather`` time, the batch after one that settled n
jobs with m queued behind it waits for n + m jobs: the submitters it
answered, woken, often come straight back with their next, and so share one
batch (one commit, one fsync) with those that waited. The wait ends at n + m
jobs, or once no job has come for ``gather`` seconds. Without it, sessions
that flush back to back split into groups that take turns at the batch, each
paying a commit and an fsync for a part of them. A lone session's next job
is the one its batch waits for: it never waits.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import trio

from greenroom.session.persistence.base import OperationTimeout

J = TypeVar("J", bound="Job")

_writers: weakref.WeakSet[Writer[Job]] = weakref.WeakSet()


def writers_busy(token: trio.lowlevel.TrioToken) -> bool:
    """True while any writer holds a job of the run `token` names that is not settled yet
    (a test clock holds still meanwhile). A writer stuck on another run's job (a test
    before) does not count."""
    return any(writer.serves(token) for writer in list(_writers))


class Job:
    """One piece of work and its outcome: ``error`` is set by the batch when it failed.

    `wait` returns once the job is settled (checkpoints), at the latest at its
    ``deadline`` (`trio.current_time`, set by `Writer.submit`): then it settles
    the job as failed with `OperationTimeout`. The wait is shielded: a
    cancelled caller still waits for the job (the work lands or fails either
    way, and what the caller keeps follows it), never past the deadline.
    ``on_settled``, if set, is called on the Trio thread when it is settled,
    once.
    """

    __slots__ = ("_event", "_writer", "deadline", "error", "on_settled", "settled")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.settled = False
        self.on_settled: Callable[[Job], None] | None = None
        self.deadline = math.inf
        self._event: trio.Event | None = None
        self._writer: Writer[Any] | None = None

    def settle(self) -> None:
        if self.settled:  # abandoned at its deadline, then finished by its worker
            return
        self.settled = True
        if self._event is not None:
            self._event.set()
        if self.on_settled is not None:
            self.on_settled(self)

    async def wait(self) -> None:
        if self.settled:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        if self._event is None:
            self._event = trio.Event()
        # One scope for the shield and the deadline (its own cancel still ends the wait).
        with trio.CancelScope(deadline=self.deadline, shield=True):
            await self._event.wait()
        if not self.settled and self._writer is not None:
            self._writer.abandon(self)


class Writer(Generic[J]):
    """Runs ``work(batch)`` in a worker thread for every batch of submitted jobs, in order.

    `work` sets ``job.error`` on each job that failed; if it raises, every
    job of the batch without an error gets that exception. ``deadline`` is
    the seconds each job may take from its submission, ``gather`` the seconds
    a batch may wait for more jobs (both: see the module docstring); ``where``,
    if given, names the store in its `OperationTimeout`s.
    """

    __slots__ = (
        "__weakref__",
        "_at_work",
        "_draining",
        "_expected",
        "_gather",
        "_gather_until",
        "_gathering",
        "_lock",
        "_more",
        "_queue",
        "_stuck",
        "_unsettled",
        "_work",
        "deadline",
        "where",
    )

    def __init__(
        self,
        work: Callable[[Sequence[J]], None],
        *,
        deadline: float = math.inf,
        gather: float = 0.0,
        where: str = "",
    ) -> None:
        self._work = work
        self.deadline = deadline
        self.where = where
        self._gather = gather
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)  # the queue reached what a gather waits for
        self._gathering = 0  # while a gather waits: the queue length that ends it
        # What the batch that ended last settled, with what was queued behind it, and until
        # when the next batch waits for that many (their submitters may come straight back).
        self._expected = 0
        self._gather_until = 0.0
        self._queue: list[tuple[J, trio.lowlevel.TrioToken]] = []
        self._draining = False  # a worker thread is taking batches off the queue
        # ... and the batch it is in `work` with (empty while it gathers, settles or is gone)
        self._at_work: list[tuple[J, trio.lowlevel.TrioToken]] = []
        self._stuck = False  # ... and the batch it works on holds a job past its deadline
        # Jobs submitted and not yet settled, per run. Counted down on the run's own thread,
        # as the job is settled, so whoever checks after that step sees it done.
        self._unsettled: dict[trio.lowlevel.TrioToken, int] = {}
        _writers.add(self)  # type: ignore[arg-type]

    @property
    def stuck(self) -> bool:
        """True while a job past its deadline is still running on the worker thread."""
        with self._lock:
            return self._stuck

    def submit(self, job: J) -> None:
        """Queue `job` (from the Trio thread); it runs in the current or the next batch.

        While the writer is `stuck`, `job` is settled at once instead, failed
        with `OperationTimeout` (its ``on_settled`` runs before this returns).
        """
        token = trio.lowlevel.current_trio_token()
        job.deadline = trio.current_time() + self.deadline
        job._writer = self
        with self._lock:
            stuck = self._stuck
            if not stuck:
                self._queue.append((job, token))
                self._unsettled[token] = self._unsettled.get(token, 0) + 1
                start = not self._draining
                self._draining = True
                if self._gathering:
                    if len(self._queue) >= self._gathering:
                        self._more.notify()
                    else:  # they are coming back: give the next as long again
                        self._gather_until = time.monotonic() + self._gather
        if stuck:
            job.error = OperationTimeout(
                f"{self._prefix}not started, an earlier operation is still running"
                f" past its deadline ({self.deadline:g} s)"
            )
            job.settle()
        elif start:
            trio.lowlevel.start_thread_soon(self._drain, _ignore)

    def abandon(self, job: Job) -> None:
        """Settle `job` as failed, its deadline passed (on the Trio thread); the writer is
        stuck until the batch at work now returns, if `job` is in it or queued behind it.
        A job whose batch returned, its settling not yet seen here, leaves it going: the
        batch at work then is a later one, of jobs within their deadlines."""
        with self._lock:
            at_work = self._at_work
            if any(j is job for j, _ in at_work) or (
                at_work and any(j is job for j, _ in self._queue)
            ):
                self._stuck = True
        job.error = OperationTimeout(f"{self._prefix}no answer within {self.deadline:g} s")
        job.settle()

    @property
    def _prefix(self) -> str:
        return f"{self.where}: " if self.where else ""

    def serves(self, token: trio.lowlevel.TrioToken) -> bool:
        """True while a job of the run `token` names is queued, in work or not yet settled."""
        with self._lock:
            return token in self._unsettled

    def _drain(self) -> None:
        """The worker thread: batches until the queue is empty (after any gather)."""
        while True:
            with self._lock:
                if len(self._queue) < self._expected:
                    self._gather_more()
                batch, self._queue = self._queue, []
                if not batch:
                    self._draining = False
                    return
                self._at_work = batch
            try:
                # A job its waiter gave up on before it began is never run.
                self._work([job for job, _ in batch if not job.settled])
            except BaseException as exc:  # a backend's bug still settles every job
                for job, _ in batch:
                    if job.error is None:
                        job.error = exc
            with self._lock:  # before a submitter it answers can come back
                self._at_work = []
                self._stuck = False
                expected = len(batch) + len(self._queue)
            # One wake-up of each run for the whole batch: a wake per job would hand the GIL
            # back and forth with a run already resuming the jobs settled before.
            runs: dict[trio.lowlevel.TrioToken, list[J]] = {}
            for job, token in batch:
                runs.setdefault(token, []).append(job)
            for token, jobs in runs.items():
                try:
                    token.run_sync_soon(self._settle, jobs, token)
                except trio.RunFinishedError:  # the run that waited is gone
                    for _ in jobs:
                        self._count_settled(token)
            if self._gather:
                with self._lock:
                    self._expected = expected
                    self._gather_until = time.monotonic() + self._gather

    def _gather_more(self) -> None:
        """Wait (holding the lock) until the queue holds what the last batch expects, or no
        job came for the gather time (each one queued meanwhile gives the next that long
        again: the submitters it answered come back one by one)."""
        self._gathering = self._expected
        try:
            while len(self._queue) < self._expected:
                left = self._gather_until - time.monotonic()
                if left <= 0:
                    break
                self._more.wait(left)
        finally:
            self._gathering = 0
            self._expected = 0

    def _settle(self, jobs: list[J], token: trio.lowlevel.TrioToken) -> None:
        for job in jobs:
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
