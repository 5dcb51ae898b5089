"""What the database backends share: their writer's jobs, and `BatchLog`, a live session
whose every write is an append job committed by the writer (SQLite, PostgreSQL).

A backend's writer runs each batch of jobs on one connection: the `Append`s of a batch in
one transaction (a fenced append is refused before it writes anything, so it cannot undo
another), every other job alone, in order. One drain of a log is in flight at a time; what is
appended meanwhile waits for the next.

A backend may also commit an append on the Trio thread (`Inline`, SQLite's): one that
needs no wait and is not to be durable yet; the next durable commit covers it.

The writer's jobs: `Append` (a drain of one log), `Call` (any other statement, through
`run_call`) and `Sync` (every commit before it made durable: SQLite's ``fdatasync`` of its
WAL, one per batch).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, TypeAlias, TypeVar

import trio

from greenroom.protocol.events import ConfigSet, SessionEvent, UserMessage
from greenroom.session.persistence.base import (
    Events,
    LeaseLost,
    PersistenceError,
    SeqMismatch,
    SessionNotFound,
    SyncPolicy,
)
from greenroom.session.persistence.writer import Job, Writer
from greenroom.session.session import TITLE_KEY, title_of

logger = logging.getLogger("greenroom.persistence")

T = TypeVar("T")


class Call(Job):
    """A piece of database work run alone, in order: ``call()``, its value in ``value``."""

    __slots__ = ("call", "value")

    def __init__(self, call: Callable[[], object]) -> None:
        super().__init__()
        self.call = call
        self.value: object = None


class Append(Job):
    """One log's drain: its events, at its epoch; ``sync`` wants the commit durable;
    ``title`` is the session's title (None: none to store), stored unless it has one,
    or in place of the one it has when ``retitle`` (a model wrote it)."""

    __slots__ = ("epoch", "events", "retitle", "session_id", "sync", "title")

    def __init__(
        self,
        session_id: str,
        epoch: int,
        events: Events,
        *,
        sync: bool,
        title: str | None = None,
        retitle: bool = False,
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self.epoch = epoch
        self.events = events
        self.sync = sync
        self.title = title
        self.retitle = retitle


def stored_already(job: Append, where: str, stored: tuple[int, int] | None, by: str) -> int:
    """How many of an append's events the store holds already, read off the session's
    stored ``(epoch, next_seq)`` after its fenced update matched no row: an earlier try
    of this same life landed (a commit whose answer was lost, or that came past its
    deadline), so the rest is written after it. Raises why the append is refused
    otherwise (`SessionNotFound` for no row, `LeaseLost`, `SeqMismatch`); ``by`` names
    who takes sessions over."""
    session_id, first, after = job.session_id, job.events[0].seq, job.events[-1].seq + 1
    if stored is None:
        raise SessionNotFound(f"no stored session {session_id!r} in {where}")
    epoch, next_seq = stored
    if epoch != job.epoch:
        raise LeaseLost(
            f"session {session_id!r} was taken over by {by} (epoch {epoch}, this life"
            f" held {job.epoch}); nothing written to {where}"
        )
    if first < next_seq <= after:
        return next_seq - first
    raise SeqMismatch(
        f"session {session_id!r}: append starts at seq {first}, but {where} holds {next_seq} events"
    )


class Sync(Job):
    """Makes every commit before it durable, up to seq ``covers`` of the log that asked.

    A turn's sync (``log`` given, `BatchLog.flush`) is shared by the turns that end
    before its batch begins: the writer calls `begin` then, in its thread, before any
    fsync of the batch, and ``covers`` is read off the log's ``written`` at that moment
    (each of those turns committed before it, so the fsync after covers it).
    """

    __slots__ = ("covers", "log", "started")

    def __init__(self, covers: int = 0, *, log: BatchLog | None = None) -> None:
        super().__init__()
        self.covers = covers
        self.log = log
        self.started = False

    def begin(self) -> None:
        self.started = True
        if self.log is not None:
            self.covers = self.log.written


#: Commits `job` on the calling (Trio) thread if that needs no wait, and says whether it
#: did: True once it is committed or refused (``job.error`` set, nothing written); False
#: when it must go to the writer instead (the database's write lock is taken).
Inline: TypeAlias = Callable[[Append], bool]


async def run_call(writer: Writer[Job], call: Callable[[], T]) -> T:
    """Run `call` on `writer`, in order with every append; its value, or its error.

    The wait is shielded (`Job.wait`): the database work finishes either way.
    """
    job = Call(call)
    writer.submit(job)
    await job.wait()
    if job.error is not None:
        raise job.error
    return job.value  # type: ignore[return-value]


class Database(Protocol):
    """What a `BatchLog` needs of its backend."""

    @property
    def writer(self) -> Writer[Job]: ...

    @property
    def sync(self) -> SyncPolicy: ...

    @property
    def where(self) -> str:
        """The store, for messages (a path, a database name)."""
        ...

    @property
    def syncs_turns(self) -> bool:
        """Whether a turn's commits are made durable by a `Sync` after it, off the agent's
        path (False: the database does that by itself)."""
        ...

    async def put_blobs(self, session_id: str, blobs: Mapping[str, bytes]) -> None: ...

    async def read_blobs(self, session_id: str, digests: Sequence[str]) -> dict[str, bytes]: ...


class BatchLog:
    """One live session of a database backend (see `SessionLog` for the contract).

    `write_ahead` and `flush` wait for their append to commit; under
    ``sync="turn"`` the turn's commit is made durable after it, off the
    agent's path (a `Sync`, where `Database.syncs_turns`: turns that end
    before it begins share it); `close` commits durably, then lets the
    session go (`release`).

    With ``inline`` (see `Inline`), a commit that is not to be durable and
    needs no wait is made on the Trio thread: a write-ahead then costs no hop
    to the writer. A durable commit (``always``, a close) still goes to the
    writer, where it shares its batch's transaction and fsync; with nothing
    left to commit, a `Sync` makes the inline commits durable.
    """

    __slots__ = (
        "_closed",
        "_database",
        "_epoch",
        "_error",
        "_in_flight",
        "_inline",
        "_pending",
        "_release",
        "_sync",
        "_synced",
        "_titled",
        "append",
        "session_id",
        "written",
    )

    def __init__(
        self,
        database: Database,
        session_id: str,
        release: Callable[[], Awaitable[None]],
        *,
        epoch: int,
        next_seq: int,
        inline: Inline | None = None,
    ) -> None:
        self._database = database
        self._inline = inline
        self.session_id = session_id
        self._release = release
        self._epoch = epoch
        self._pending: Events = []  # one list for the log's life: see `append`
        # The list's own append: one call per event, no frame of ours. It never blocks or
        # raises.
        self.append: Callable[[SessionEvent], None] = self._pending.append
        self._in_flight: Append | None = None
        self.written = next_seq  # the seq after the last event committed
        self._synced = next_seq  # ... and after the last one made durable
        self._sync: Sync | None = None  # the latest turn's sync asked for
        self._titled = False  # a commit of this life stored the session's title
        self._error: LeaseLost | None = None
        self._closed = False

    async def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        await self._database.put_blobs(self.session_id, blobs)

    async def read_blobs(self, digests: Sequence[str]) -> dict[str, bytes]:
        return await self._database.read_blobs(self.session_id, digests)

    def lost(self, error: LeaseLost) -> None:
        """Another holder took the session over: write nothing more (a heartbeat found it)."""
        self._error = error

    async def write_ahead(self) -> None:
        # Written is enough here; with an inline commit a turn's flush makes it durable.
        await self._commit(sync=self._database.sync == "always" and self._inline is None)

    async def flush(self) -> None:
        database = self._database
        await self._commit(sync=database.sync == "always")
        if database.sync == "turn" and self._synced < self.written and database.syncs_turns:
            job = self._sync
            if job is None or job.started or job.settled:  # else it covers this turn too
                job = self._sync = Sync(log=self)
                job.on_settled = self._turn_synced
                database.writer.submit(job)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            try:
                if self._error is None:  # after a lost lease nothing more is written
                    await self._commit(sync=self._database.sync != "os")
                if self._sync is not None and not self._sync.settled:
                    await self._sync.wait()
            finally:
                await self._release()
                if self._pending:
                    logger.error(
                        "session %r: %d events never reached %s",
                        self.session_id,
                        len(self._pending),
                        self._database.where,
                    )

    async def _commit(self, *, sync: bool) -> None:
        """Commit everything appended so far (waits for a drain already in flight first)."""
        if self._error is not None:
            raise self._error
        while self._in_flight is not None:
            await self._in_flight.wait()
        pending = self._pending
        if pending:
            # The title the commit stores (see `Append`): the last a model wrote among its
            # events, else its first prompt's unless this life stored one. Read here, not in
            # a function: a commit is the store's hot path (``bench sessions``, calls).
            title: str | None = None
            retitle = False
            prompt: str | None = None
            for event in pending:
                if event.__class__ is ConfigSet and event.key == TITLE_KEY:
                    title, retitle = event.value, True
                elif prompt is None and event.__class__ is UserMessage:
                    prompt = event.content
            if not retitle and prompt is not None and not self._titled:
                title = title_of(prompt)
            job = Append(
                self.session_id, self._epoch, pending[:], sync=sync, title=title, retitle=retitle
            )
            pending.clear()
            # A durable commit goes to the writer: one transaction with its batch's others.
            if sync or self._inline is None or not self._inline(job):
                await self._commit_on_writer(job)
            elif job.error is not None:
                pending[:0] = job.events
                self._failed(job)
            else:
                self._committed(job)
        if sync and self._synced < self.written:
            await self._sync_to(self.written)

    async def _commit_on_writer(self, job: Append) -> None:
        self._in_flight = job
        self._database.writer.submit(job)
        await job.wait()  # shielded: the commit lands either way; the buffer follows it
        self._in_flight = None
        if job.error is not None:
            self._pending[:0] = job.events  # ahead of what was appended meanwhile
            self._failed(job)
        self._committed(job)
        if job.sync:
            self._synced = self.written

    def _committed(self, job: Append) -> None:
        self.written = job.events[-1].seq + 1
        if job.title is not None:
            self._titled = True

    def _failed(self, job: Append) -> None:
        """Raise why `job` was refused (its events stay pending); a lost lease for good."""
        assert job.error is not None
        if isinstance(job.error, LeaseLost):
            self._error = job.error
        raise job.error

    async def _sync_to(self, covers: int) -> None:
        """Make every commit up to seq `covers` durable: a `Sync` on the writer, awaited."""
        job = Sync(covers)
        self._database.writer.submit(job)
        await job.wait()  # shielded: the fsync runs to its end either way
        error = job.error
        if isinstance(error, PersistenceError):  # a deadline passed
            raise error
        if error is not None:
            raise PersistenceError(
                f"{self._database.where}: cannot make session {self.session_id!r} durable: {error}"
            ) from error
        self._synced = max(self._synced, covers)

    def _turn_synced(self, job: Job) -> None:
        assert isinstance(job, Sync)
        if job.error is None:
            self._synced = max(self._synced, job.covers)
        else:
            where = self._database.where
            logger.error(
                "%s: making the turn of %r durable failed: %s", where, self.session_id, job.error
            )
