"""`SqlitePersistence`: every session in one SQLite database (stdlib ``sqlite3``, WAL mode).

All database work runs on the persistence's `Writer`, one batch at a time
on one connection. The appends of a batch, from however many sessions, go
in one transaction (one fsync when the batch needs one: group commit); a
fenced append is refused before it writes anything, so it cannot undo
another's. The writer gathers (`GATHER`): sessions that flush back to back
share a batch instead of taking turns at it. A drain is one row: the JSON
lines of its events, keyed by (session id, first seq), so a resume fetches
one row per drain and decodes the whole log in one call.

One live writer per session: `create` and `open` take the session's lock
file (`SessionLock`, in ``<db>.locks/``) and bump its **epoch**; every
append checks, in its own transaction, that the epoch is still its own and
that its first seq is the stored next seq, and writes nothing otherwise. So
even a bypassed lock cannot interleave two lives: the older one gets
`LeaseLost`.

**Inline commits.** A log's append is first tried on the Trio thread, on a
second connection that never waits for the write lock (busy timeout 0) and
never checkpoints: with the lock free, the commit is a write into the WAL file
(``synchronous=NORMAL``, ``OFF`` under ``os``), tens of microseconds, no hop to
a thread, the fence checked in the same transaction as ever. A durable commit
(a flush under ``always``, a close) goes to the writer, ``FULL``, in one
transaction with its batch's other appends (group commit), and its fsync of
the WAL covers the inline commits before it; with nothing left to commit, a
`Sync` (an ``fdatasync`` of the WAL, one per batch) does. With the lock taken
(another process, or the writer's own batch) the append goes to the writer as
before, which waits for the lock within its deadline. The writer checkpoints
the WAL every `CHECKPOINT_EVERY` inline commits, off the agent's path.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import msgspec
import trio

from greenroom.protocol.events import SessionHeader
from greenroom.session.persistence.answers import AnswersBeside
from greenroom.session.persistence.base import (
    DEADLINE,
    SYNC_POLICIES,
    Events,
    Interruption,
    NotASessionLog,
    PersistenceError,
    SessionExists,
    SessionNotFound,
    Stored,
    StoredSession,
    SyncPolicy,
    UnsupportedVersion,
    repair,
)
from greenroom.session.persistence.batch import Append, BatchLog, Call, Sync, run_call
from greenroom.session.persistence.blobs import put_files, read_files, remove_files
from greenroom.session.persistence.lock import SessionLock
from greenroom.session.persistence.rows import Rows, run_batch
from greenroom.session.persistence.writer import Job, Writer
from greenroom.session.store import check_session_id

logger = logging.getLogger("greenroom.persistence")

#: The schema this greenroom writes (``PRAGMA user_version``); version 0 is migrated on open.
SCHEMA_VERSION: Final = 1
#: Inline commits between two WAL checkpoints on the writer (each commit adds a few pages;
#: SQLite's own automatic checkpoint comes at 1,000).
CHECKPOINT_EVERY: Final = 256
#: Inline commits past which commits go to the writer until its checkpoint has run.
CHECKPOINT_LAG: Final = 4 * CHECKPOINT_EVERY
#: Seconds a writer batch that ends with commits queued behind it waits for the sessions it
#: just answered to come back (`Writer`'s gathering): about a hop to Trio and back.
GATHER: Final = 0.0003
#: Seconds a checkpoint waits for an inline commit under way, or for another process's
#: readers, before it does what it can without them.
CHECKPOINT_WAIT: Final = 0.02

_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    header BLOB NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,
    next_seq INTEGER NOT NULL DEFAULT 0,
    title TEXT,
    updated_at REAL NOT NULL DEFAULT 0
);
CREATE TABLE batches (
    session_id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    next_seq INTEGER NOT NULL,
    lines BLOB NOT NULL,
    PRIMARY KEY (session_id, first_seq)
) WITHOUT ROWID;
PRAGMA user_version = 1;
"""

_MIGRATE_FROM_0 = """
ALTER TABLE sessions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN next_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN title TEXT;
ALTER TABLE sessions ADD COLUMN updated_at REAL NOT NULL DEFAULT 0;
UPDATE sessions SET next_seq = (
    SELECT COALESCE(MAX(next_seq), 0) FROM batches WHERE batches.session_id = sessions.id
);
PRAGMA user_version = 1;
"""

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(SessionHeader)


class SqlitePersistence(AnswersBeside):
    """Session logs in the SQLite database at `path` (created if missing; see the module docstring).

    ``sync`` is the `SyncPolicy` of every log it opens (default ``"turn"``);
    ``commit_timeout`` the seconds a statement or commit may take (waiting for
    another process's write lock included) before its waiter stops waiting
    (`OperationTimeout`). ``read_only`` opens an existing store for `load`
    and `list` only: nothing is created, migrated or written (SQLite's
    ``mode=ro``; ``immutable`` too when no WAL file says a writer may be live,
    so a reader leaves no WAL files behind). A missing path, a file that is
    not a database or an empty one raise `NotASessionLog` naming it; another
    schema version `UnsupportedVersion`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sync: SyncPolicy = "turn",
        commit_timeout: float = DEADLINE,
        read_only: bool = False,
    ) -> None:
        if sync not in SYNC_POLICIES:
            raise ValueError(f"sync must be one of {SYNC_POLICIES}, got {sync!r}")
        if not commit_timeout > 0:
            raise ValueError(
                f"commit_timeout must be a positive number of seconds, got {commit_timeout!r}"
            )
        self.path = os.fspath(path)
        self.sync: SyncPolicy = sync
        if read_only:
            self._db = _open_read_only(self.path, commit_timeout)
        else:
            # Made private before SQLite opens it: its -wal and -shm take the database's mode.
            os.close(os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=commit_timeout
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._migrate()
        self._inline_db = None if read_only else self._connect_inline()
        self._uncheckpointed = 0  # inline commits since the last checkpoint ended
        self._checkpointing = False  # a checkpoint is queued or running on the writer
        self._busy_ms = round(commit_timeout * 1000)
        self._wal_fd = -1
        self._wal_synced = False  # in the writer's batch: no commit since its last fdatasync
        self._level = "FULL"  # the writer connection's synchronous, as set above
        self._rows = Rows(self.path, "sessions", "batches", "?", "another process")
        # Its files' names are joined as text, not as Paths (which intern each name: see
        # `JsonlPersistence`), as a session's names are made per session.
        self._locks = self.path + ".locks"
        self.writer: Writer[Job] = Writer(
            self._batch, deadline=commit_timeout, gather=GATHER, where=self.path
        )

    @property
    def where(self) -> str:
        return self.path

    @property
    def syncs_turns(self) -> bool:
        """True: commits go out ``synchronous=NORMAL``; after a turn, an fsync of the WAL."""
        return True

    def close(self) -> None:
        self._db.close()
        if self._inline_db is not None:
            self._inline_db.close()
        if self._wal_fd >= 0:
            os.close(self._wal_fd)

    def check_session_id(self, session_id: str) -> None:
        check_session_id(session_id)

    async def create(self, header: SessionHeader) -> BatchLog:
        check_session_id(header.id)
        lock = await self._lock(header.id)
        try:
            await self._run(lambda: self._create(header))
        except BaseException:
            lock.release()
            raise
        return BatchLog(
            self, header.id, _releaser(lock), epoch=1, next_seq=0, inline=self._commit_inline
        )

    async def open(
        self, session_id: str, *, interrupted: Interruption = "close"
    ) -> tuple[SessionHeader, Events, BatchLog]:
        check_session_id(session_id)
        lock = await self._lock(session_id)
        try:
            header, events, epoch = await self._run(lambda: self._open(session_id, interrupted))
        except BaseException:
            lock.release()
            raise
        log = BatchLog(
            self,
            session_id,
            _releaser(lock),
            epoch=epoch,
            next_seq=len(events),
            inline=self._commit_inline,
        )
        return header, events, log

    async def load(self, session_id: str) -> tuple[SessionHeader, Events]:
        check_session_id(session_id)
        header, events = await self._run(lambda: self._read(session_id))
        return header, events + repair(events)

    async def list(self) -> Stored:
        rows = await self._run(
            lambda: self._db.execute(
                "SELECT header, title, updated_at FROM sessions ORDER BY updated_at DESC, id"
            ).fetchall()
        )
        return [StoredSession(_header_decoder.decode(h), t, u) for h, t, u in rows]

    async def delete(self, session_id: str) -> None:
        check_session_id(session_id)
        lock = await self._lock(session_id)
        try:
            await self._run(lambda: self._delete(session_id))
            await trio.to_thread.run_sync(remove_files, self.blob_dir(session_id))
            await trio.to_thread.run_sync(remove_files, self.answer_dir(session_id))
        finally:
            lock.release()

    def blob_dir(self, session_id: str) -> str:
        """Where the session's blobs are: side files in ``<path>.blobs/<sha256 of the id>``
        (`blobs.put_files`), beside the database, so a read-only reader reads them too."""
        return os.path.join(self.path + ".blobs", hashlib.sha256(session_id.encode()).hexdigest())

    async def put_blobs(self, session_id: str, blobs: Mapping[str, bytes]) -> None:
        directory, durable = self.blob_dir(session_id), self.sync != "os"
        await trio.to_thread.run_sync(partial(put_files, directory, blobs, durable=durable))

    async def read_blobs(self, session_id: str, digests: Sequence[str]) -> dict[str, bytes]:
        return await trio.to_thread.run_sync(read_files, self.blob_dir(session_id), digests)

    def answer_dir(self, session_id: str) -> str:
        """Where answers to the session's decisions wait for its next holder: side files in
        ``<path>.answers/<sha256 of the id>`` (`answers`), beside the database."""
        return os.path.join(self.path + ".answers", hashlib.sha256(session_id.encode()).hexdigest())

    # -- the Trio side ---------------------------------------------------------------

    async def _lock(self, session_id: str) -> SessionLock:
        name = hashlib.sha256(session_id.encode()).hexdigest() + ".lock"

        def acquire() -> SessionLock:
            os.makedirs(self._locks, mode=0o700, exist_ok=True)
            return SessionLock.acquire(os.path.join(self._locks, name), session_id)

        return await trio.to_thread.run_sync(acquire)

    async def _run(self, call: Callable[[], T]) -> T:
        return await run_call(self.writer, call)

    def _connect_inline(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=0)
        db.execute(f"PRAGMA synchronous={self._quiet_sync()}")
        db.execute("PRAGMA wal_autocheckpoint=0")  # a checkpoint fsyncs: the writer's work
        return db

    def _commit_inline(self, job: Append) -> bool:
        """`batch.Inline`: commit `job` on the Trio thread if the write lock is free now.

        Not while the writer is stuck (the lock may be under its stuck commit, and
        a disk that hangs a commit would hang the Trio thread too), nor while the
        WAL holds `CHECKPOINT_LAG` inline commits its checkpoint has not caught up
        with: then commits queue on the writer behind it (back-pressure, as SQLite's
        own checkpoint in the committing thread gives).
        """
        db = self._inline_db
        if db is None or self.writer.stuck or self._uncheckpointed >= CHECKPOINT_LAG:
            return False
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:  # the write lock is taken: the writer waits for it
            return False
        try:
            self._rows.append(db, job)
            db.execute("COMMIT")
        except (PersistenceError, sqlite3.Error) as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            job.error = (
                exc
                if isinstance(exc, PersistenceError)
                else PersistenceError(f"{self.path}: {exc}")
            )
            return True
        self._uncheckpointed += 1
        if self._uncheckpointed >= CHECKPOINT_EVERY and not self._checkpointing:
            self._checkpointing = True
            checkpoint = Call(self._checkpoint)
            checkpoint.on_settled = self._checkpointed
            self.writer.submit(checkpoint)
        return True

    def _checkpointed(self, job: Job) -> None:
        self._checkpointing = False
        self._uncheckpointed = 0
        if job.error is not None:
            logger.warning("%s: WAL checkpoint failed: %s", self.path, job.error)

    # -- in the writer's thread ------------------------------------------------------

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UnsupportedVersion(
                f"{self.path}: schema version {version} (this greenroom reads {SCHEMA_VERSION})"
            )
        if version == SCHEMA_VERSION:
            return
        tables = {
            row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        script = _MIGRATE_FROM_0 if "sessions" in tables else _SCHEMA
        self._db.executescript(f"BEGIN IMMEDIATE;{script}COMMIT;")

    def _batch(self, jobs: Sequence[Job]) -> None:
        # Every job of the batch was submitted before it began, so after the commit it
        # covers: one fdatasync at the batch's first Sync covers every inline commit.
        self._wal_synced = False
        for job in jobs:
            if isinstance(job, Sync):
                job.begin()  # what it covers, read before any fdatasync of the batch
        run_batch(jobs, self._commit, self._run_job)

    def _run_job(self, job: Job) -> None:
        if isinstance(job, Sync):
            if not self._wal_synced:
                self._fsync_wal()
                self._wal_synced = True
        elif isinstance(job, Call):
            self._wal_synced = False  # it may write
            job.value = job.call()

    def _checkpoint(self) -> None:
        """Checkpoint the whole WAL, so that the next commit writes it from its start again.

        ``RESTART`` holds off writers while it runs (an inline commit meanwhile goes to
        the writer, behind it): a passive checkpoint, raced by commits, never finishes,
        and the WAL grows without end. It waits at most `CHECKPOINT_WAIT` for the lock
        and for readers; past that it checkpoints what it can, as a passive one would.
        """
        self._db.execute(f"PRAGMA busy_timeout={round(CHECKPOINT_WAIT * 1000)}")
        try:
            self._db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        finally:
            self._db.execute(f"PRAGMA busy_timeout={self._busy_ms}")

    def _commit(self, appends: Sequence[Append]) -> None:
        self._wal_synced = False
        self._synchronous("FULL" if any(job.sync for job in appends) else self._quiet_sync())
        try:
            with self._transaction():
                for job in appends:
                    try:
                        self._rows.append(self._db, job)
                    except PersistenceError as exc:  # refused before it wrote anything
                        job.error = exc
        except sqlite3.Error as exc:
            for job in appends:
                job.error = job.error or PersistenceError(f"{self.path}: {exc}")

    def _synchronous(self, level: str) -> None:
        """The writer's connection commits at `level` from now on (a statement only when
        that changes it)."""
        if level != self._level:
            self._db.execute(f"PRAGMA synchronous={level}")
            self._level = level

    def _quiet_sync(self) -> str:
        return "OFF" if self.sync == "os" else "NORMAL"

    def _fsync_wal(self) -> None:
        if self._wal_fd < 0:
            try:
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return  # nothing was written through the WAL yet
        os.fdatasync(self._wal_fd)

    def _create(self, header: SessionHeader) -> None:
        self._synchronous("FULL")
        try:
            with self._transaction():
                self._db.execute(
                    "INSERT INTO sessions (id, header, epoch, next_seq, updated_at)"
                    " VALUES (?, ?, 1, 0, ?)",
                    (header.id, _encoder.encode(header), header.created_at / 1000),
                )
        except sqlite3.IntegrityError:
            raise SessionExists(f"session {header.id!r} is stored already in {self.path}") from None

    def _delete(self, session_id: str) -> None:
        self._synchronous("FULL")
        with self._transaction():
            self._db.execute("DELETE FROM batches WHERE session_id = ?", (session_id,))
            self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def _open(
        self, session_id: str, interrupted: Interruption
    ) -> tuple[SessionHeader, Events, int]:
        self._synchronous("FULL")
        with self._transaction():
            header, events = self._read(session_id)
            epoch = self._db.execute(
                "UPDATE sessions SET epoch = epoch + 1 WHERE id = ? RETURNING epoch", (session_id,)
            ).fetchone()[0]
            closers = repair(events, interrupted)
            if closers:
                self._rows.append(self._db, Append(session_id, epoch, closers, sync=True))
                logger.info("closed interrupted turn of session %r in %s", session_id, self.path)
        return header, events + closers, epoch

    def _read(self, session_id: str) -> tuple[SessionHeader, Events]:
        stored = self._rows.read(self._db, session_id)
        if stored is None:
            raise SessionNotFound(f"no stored session {session_id!r} in {self.path}")
        return stored

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")


def _open_read_only(path: str, timeout: float) -> sqlite3.Connection:
    """A connection that can only read the greenroom store at `path` (see `SqlitePersistence`)."""
    if not os.path.isfile(path):
        raise NotASessionLog(f"{path}: no such store")
    query = "mode=ro" if os.path.exists(path + "-wal") else "mode=ro&immutable=1"
    uri = f"{Path(path).resolve().as_uri()}?{query}"
    db = sqlite3.connect(
        uri, uri=True, check_same_thread=False, isolation_level=None, timeout=timeout
    )
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        db.close()
        raise NotASessionLog(f"{path}: not a greenroom store ({exc})") from None
    if "sessions" not in tables:
        db.close()
        what = "an empty database" if not tables else "a database without greenroom's tables"
        raise NotASessionLog(f"{path}: not a greenroom store ({what})")
    if version != SCHEMA_VERSION:
        db.close()
        raise UnsupportedVersion(
            f"{path}: schema version {version} (this greenroom reads {SCHEMA_VERSION};"
            " a writer migrates an older one when it opens it)"
        )
    return db


def _releaser(lock: SessionLock) -> Callable[[], Awaitable[None]]:
    async def release() -> None:
        lock.release()
        await trio.lowlevel.checkpoint()

    return release
