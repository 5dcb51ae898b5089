"""`PostgresPersistence`: sessions in PostgreSQL, with one live writer per session across nodes.

psycopg 3 has no Trio support, so every statement runs off the Trio thread: appends and
reads on the persistence's `Writer` (one batch at a time on one connection; the appends of
a batch in one transaction, each under its own savepoint: group commit), the leases on a
connection of their own, kept by a heartbeat thread.

**Leases.** Taking a session live (create, resume) takes its lease: its row names the
holder (node, pid), an `epoch` (the fencing token, bumped at every take-over) and an
expiry, `lease_ttl` seconds ahead, which the heartbeat renews every third of it. The
holder also holds a session-level advisory lock keyed by (session, epoch) on its lease
connection, which PostgreSQL releases the moment that connection ends. Another node may
take the lease over when the row's expiry has passed (a holder paused by SIGSTOP, a long
GC, a partition) or when it can take that advisory lock itself (the holder's process or
connection is gone): so a SIGKILLed holder is taken over at once, a paused one after
`lease_ttl`. Every append checks, in its own transaction, that the epoch is still its
own and that its first seq is the stored next seq, and writes nothing otherwise: a paused
holder that wakes after a take-over gets `LeaseLost` and writes nothing.

**What a dead holder left.** Beside the lease the row records the holder's host name, its
start time and the token its spawns are marked with (`greenroom.procs`). A take-over of a
lease whose holder ran on this host (its host name, not its ``node``) and whose pid no
longer runs with that start time SIGKILLs every process carrying that token before `open`
returns, as the lock file's successor does (`greenroom.session.persistence.lock`): all of
the dead process's, not only this session's. A holder on another host cannot be swept
from here (its pids mean nothing here): its keeper is its only line. A lease given back
(`release`) names no holder, and its take-over sweeps nothing.

**Durability.** A commit is ``synchronous_commit=on`` when it must be durable (``sync=
"always"``, a close) and ``off`` otherwise: under ``"turn"`` PostgreSQL's WAL writer makes
it durable within ``wal_writer_delay`` (200 ms by default), off the agent's path.

**Deadlines.** No statement waits forever. Each connection is made within
``connect_timeout`` (libpq's, default 5 s) with TCP keepalives on (``keepalives_idle=5``,
``keepalives_interval=2``, ``keepalives_count=3``, and ``tcp_user_timeout=10000`` for data
never acknowledged, unless the DSN says otherwise), and runs
with ``statement_timeout`` (default 5 s; also the writer's deadline for a whole job, after
which its caller stops waiting), ``lock_timeout`` (default 2 s: a row or advisory lock held
by a node that went silent fails the waiter instead of holding it) and
``idle_in_transaction_session_timeout`` (as ``statement_timeout``: the server ends a
transaction whose client went silent, and its row locks with it). ``statement_timeout``
and ``lock_timeout`` may be given in the DSN's query (``?statement_timeout=5s``), in
PostgreSQL's units: a bare number is milliseconds, or ``ms``, ``s``, ``min``; 0 turns one
off. The libpq parameters go in the DSN as libpq reads them.

The schema creates itself on open, versioned in ``greenroom_schema``; an open with
``read_only=True`` (``greenroom sessions``) creates and changes nothing: it checks the
schema is there, its connections run with ``default_transaction_read_only=on``, a store
without the blobs table (made before it) reads as holding no blobs, and whatever would
write raises `PersistenceError` saying the store was opened read-only.

**Tables.** ``greenroom_sessions`` (the id, header, epoch, next seq, title and update
time, and the holder: node, pid, lease expiry, host, start time, token; the last three
added by an open that finds them missing), ``greenroom_batches`` (as SQLite's: one row per
drain), ``greenroom_blobs``, ``greenroom_answers``, and the ``greenroom_epochs`` sequence
every epoch is drawn from. The schema is made under an advisory lock, so two nodes
opening at once never race it. Each persistence has two connections: the writer's
(appends, reads) and the leases' (`greenroom.session.persistence.leases`). The
parameters greenroom reads itself (``statement_timeout``, ``lock_timeout``) are taken off
the DSN by `own_parameters` before libpq sees it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar

import msgspec
import psycopg
import trio

from greenroom.procs import alive, owner, sweep_dead_holder
from greenroom.protocol.events import SessionHeader
from greenroom.session.persistence.answers import check_decision_id
from greenroom.session.persistence.base import (
    LEASE_TTL,
    SYNC_POLICIES,
    Events,
    Holder,
    Interruption,
    PersistenceError,
    SessionExists,
    SessionLocked,
    SessionNotFound,
    Stored,
    StoredSession,
    SyncPolicy,
    UnsupportedVersion,
    repair,
)
from greenroom.session.persistence.batch import (
    Append,
    BatchLog,
    Call,
    run_call,
)
from greenroom.session.persistence.handoff import (
    RELEASED,
    Answered,
    Ask,
    ReleaseRequest,
    Releases,
    answered,
    channel_of,
    released_key,
)
from greenroom.session.persistence.leases import Leases, lock_key
from greenroom.session.persistence.rows import Rows, run_batch
from greenroom.session.persistence.writer import Job, Writer
from greenroom.session.store import check_session_id

logger = logging.getLogger("greenroom.persistence")

SCHEMA_VERSION: Final = 1
#: Seconds a statement (and a writer job) may take, unless the DSN says otherwise.
STATEMENT_TIMEOUT: Final = 5.0
#: Seconds a statement may wait for a lock, unless the DSN says otherwise.
LOCK_TIMEOUT: Final = 2.0
#: Seconds a take-over waits for the server to drop a dead same-host holder's advisory lock.
HOLDER_EXIT: Final = 2.0
#: libpq's connection parameters greenroom sets when the DSN does not.
_CONNECT_DEFAULTS: Final = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    # Data sent and never acknowledged (a partition mid-request, where keepalives do not
    # probe): the kernel drops the connection, and the stuck statement fails.
    "tcp_user_timeout": "10000",
}
#: The DSN parameters greenroom reads itself (libpq would refuse them).
_OWN_PARAMETERS: Final = ("statement_timeout", "lock_timeout")
#: A key every node's migration takes, so that two nodes never create the schema at once.
_MIGRATION_LOCK: Final = 0x67726565_6E726F6F  # "greenroo"

_SCHEMA = """
CREATE SEQUENCE greenroom_epochs;
CREATE TABLE greenroom_sessions (
    id text PRIMARY KEY,
    header bytea NOT NULL,
    epoch bigint NOT NULL DEFAULT 0,
    next_seq bigint NOT NULL DEFAULT 0,
    title text,
    updated_at double precision NOT NULL DEFAULT 0,
    holder_node text,
    holder_pid integer,
    lease_until timestamptz
);
CREATE TABLE greenroom_batches (
    session_id text NOT NULL,
    first_seq bigint NOT NULL,
    next_seq bigint NOT NULL,
    lines bytea NOT NULL,
    PRIMARY KEY (session_id, first_seq)
);
"""

#: A session's blobs (`put_blobs`): made by any version's first open, so the schema's
#: version stays.
_BLOBS = """
CREATE TABLE IF NOT EXISTS greenroom_blobs (
    session_id text NOT NULL,
    sha256 text NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session_id, sha256)
)
"""

#: Answers to a session's decisions given while no one held it (`put_answer`): made by any
#: version's first open, so the schema's version stays.
_ANSWERS = """
CREATE TABLE IF NOT EXISTS greenroom_answers (
    session_id text NOT NULL,
    decision_id text NOT NULL,
    answer text NOT NULL,
    answered_by text NOT NULL,
    PRIMARY KEY (session_id, decision_id)
)
"""

#: What a successor needs to sweep what a dead holder left: added by any version's open
#: that lacks them, so the schema's version stays.
_HOLDER_COLUMNS = """
ALTER TABLE greenroom_sessions
    ADD COLUMN IF NOT EXISTS holder_host text,
    ADD COLUMN IF NOT EXISTS holder_start bigint,
    ADD COLUMN IF NOT EXISTS holder_owner text
"""
#: Whether they are there: an ``ALTER TABLE`` would lock the table even when they are.
_HAS_HOLDER_COLUMNS = """
SELECT 1 FROM pg_attribute WHERE attrelid = 'greenroom_sessions'::regclass
    AND attname = 'holder_owner' AND NOT attisdropped
"""

Keys: TypeAlias = list[int]
T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(SessionHeader)


class _Left(msgspec.Struct, frozen=True, gc=False):
    """The holder a session's row names as a take-over finds it (`pid` None: none)."""

    pid: int | None
    host: str | None
    start: int | None
    owner: str | None


class PostgresPersistence:
    """Session logs in the PostgreSQL database at `dsn` (see the module docstring).

    ``node`` names this process's machine in the leases it takes (default: the host
    name). ``statement_timeout`` and ``lock_timeout`` (seconds) are read from the DSN's
    query when it has them, else are the defaults (see "Deadlines" in the module
    docstring). Raises `PersistenceError` naming the server when it cannot be reached or
    the DSN is unreadable.
    """

    def __init__(
        self,
        dsn: str,
        *,
        sync: SyncPolicy = "turn",
        node: str | None = None,
        lease_ttl: float = LEASE_TTL,
        keep_busy: bool = False,
        read_only: bool = False,
    ) -> None:
        if sync not in SYNC_POLICIES:
            raise ValueError(f"sync must be one of {SYNC_POLICIES}, got {sync!r}")
        self.sync: SyncPolicy = sync
        self.host = socket.gethostname()
        self.node = node or self.host
        self.lease_ttl = lease_ttl
        #: A release request for a session that is mid-turn is refused (else it is let go
        #: after the turn): `open_handed_off`.
        self.keep_busy = keep_busy
        #: Opened to read (see the module docstring): nothing is created, nothing written.
        self.read_only = read_only
        self.dsn, timeouts = own_parameters(dsn)
        self.where = _describe(self.dsn)
        self.statement_timeout = _duration(timeouts, "statement_timeout", STATEMENT_TIMEOUT)
        self.lock_timeout = _duration(timeouts, "lock_timeout", LOCK_TIMEOUT)
        self._conninfo = self._complete()
        self._rows = Rows(
            self.where, "greenroom_sessions", "greenroom_batches", "%s", "another node"
        )
        self.writer: Writer[Job] = Writer(
            self._batch, deadline=self.statement_timeout or math.inf, where=self.where
        )
        self._db = self.connect()
        try:
            if read_only:
                self._has_blobs = self._look()
            else:
                self._migrate()
                self._has_blobs = True
            self._leases = Leases(self.connect, self.connection, self.where, lease_ttl)
            self.releases = Releases(self.connect, channel_of(self.node, os.getpid()))
        except psycopg.Error as exc:
            self._db.close()
            raise PersistenceError(f"{self.where}: cannot set up the tables: {exc}") from None
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        """Stop the heartbeat and close the connections; a connection a stuck thread still
        waits on is left to the process's end (closing it under that thread is unsafe)."""
        self.releases.close()
        self._leases.stop()
        if self.writer.stuck:
            logger.warning("%s: closed with a statement still waiting on it", self.where)
            return
        self._db.close()

    @property
    def syncs_turns(self) -> bool:
        """False: commits go out ``synchronous_commit=off``, the WAL writer makes them
        durable."""
        return False

    def check_session_id(self, session_id: str) -> None:
        check_session_id(session_id)
        if "\x00" in session_id:
            raise ValueError("a PostgreSQL session id cannot hold a NUL character")

    async def create(self, header: SessionHeader) -> BatchLog:
        self._writable("create a session")
        self.check_session_id(header.id)
        await self.releases.start()  # a holder hears release requests from its first lease
        epoch = await self._run(lambda: self._create(header))
        return self._live(header.id, epoch, 0)

    async def open(
        self, session_id: str, *, interrupted: Interruption = "close"
    ) -> tuple[SessionHeader, Events, BatchLog]:
        self._writable("take a session live")
        self.check_session_id(session_id)
        await self.releases.start()
        header, events, epoch = await self._run(lambda: self._open(session_id, interrupted))
        return header, events, self._live(session_id, epoch, len(events))

    async def load(self, session_id: str) -> tuple[SessionHeader, Events]:
        self.check_session_id(session_id)
        header, events = await self._run(lambda: self._read(self.connection(), session_id))
        return header, events + repair(events)

    async def list(self) -> Stored:
        return await self._run(self._list)

    async def delete(self, session_id: str) -> None:
        self._writable("delete a session")
        self.check_session_id(session_id)
        await self._run(lambda: self._delete(session_id))

    async def put_blobs(self, session_id: str, blobs: Mapping[str, bytes]) -> None:
        """Into the ``greenroom_blobs`` table (a side file would not reach another node)."""
        self._writable("store blobs")
        await self._run(lambda: self._put_blobs(session_id, blobs))

    async def read_blobs(self, session_id: str, digests: Sequence[str]) -> dict[str, bytes]:
        return await self._run(lambda: self._read_blobs(session_id, digests))

    async def put_answer(
        self, session_id: str, decision_id: str, answer: str, by: str
    ) -> tuple[str, str]:
        """Into the ``greenroom_answers`` table: a conditional insert, the first answer
        kept whichever node gave it; the session's live holder, if any, is told
        (`handoff.Answered`)."""
        self._writable("keep an answer")
        check_decision_id(decision_id)
        return await self._run(lambda: self._put_answer(session_id, decision_id, answer, by))

    async def read_answers(self, session_id: str) -> dict[str, tuple[str, str]]:
        return await self._run(lambda: self._read_answers(session_id))

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise PersistenceError(f"{self.where}: opened read-only, so it cannot {what}")

    # -- the Trio side ---------------------------------------------------------------

    async def _run(self, call: Callable[[], T]) -> T:
        return await run_call(self.writer, call)

    def _live(self, session_id: str, epoch: int, next_seq: int) -> BatchLog:
        async def release() -> None:
            # No more renewals first: a release past its deadline leaves the lease to expire.
            self._leases.forget(session_id, epoch)
            await self._run(lambda: self._let_go(session_id, epoch))

        log = BatchLog(self, session_id, release, epoch=epoch, next_seq=next_seq)
        self._leases.watch(session_id, epoch, log)
        return log

    async def open_handed_off(
        self, session_id: str, *, interrupted: Interruption = "close", wait: float
    ) -> tuple[SessionHeader, Events, BatchLog]:
        """`open`, asking a live holder to let the session go (`handoff`): returns once
        this node holds it, within `wait` seconds.

        Raises `SessionLocked` naming the holder when it refused (a busy session on a
        node that keeps its busy sessions) or had not let go by then; the rest as
        `open`. A holder that died is taken over as `open` takes it (no asking).
        """
        self._writable("take a session live")
        await self.releases.start()
        deadline = trio.current_time() + wait
        asked: Holder | None = None
        with self.releases.watch(session_id) as watch:
            while True:
                try:
                    return await self.open(session_id, interrupted=interrupted)
                except SessionLocked as locked:
                    holder = locked.holder
                    if watch.refused is not None or trio.current_time() >= deadline:
                        why = watch.refused or f"it did not let go within {wait:g}s"
                        raise SessionLocked(session_id, holder, f"{self.where}; {why}") from None
                    ask = self.releases.ask(session_id)
                    if holder is not None and holder != asked and ask is not None:
                        await self.notify(channel_of(holder.host, holder.pid), ask)
                        asked = holder
                # A notice can be lost: look again now and then all the same.
                with trio.move_on_at(min(deadline, trio.current_time() + self.lease_ttl / 10)):
                    await watch.changed()

    async def notices(self) -> AsyncGenerator[ReleaseRequest | Answered, None]:
        """What other nodes tell this one, as it comes: requests to let a session go, and
        answers kept for a session of this one."""
        await self.releases.start()
        async for notice in self.releases.requests:
            yield ReleaseRequest(notice, self.notify) if isinstance(notice, Ask) else notice

    async def notify(self, channel: str, payload: str) -> None:
        await self._run(lambda: self._notify(channel, payload))

    # -- in the writer's thread ----------------------------------------------------

    def _let_go(self, session_id: str, epoch: int) -> None:
        """Give the lease back, then tell the askers (`handoff.RELEASED`)."""
        self._leases.release(session_id, epoch)
        self._notify(RELEASED, released_key(session_id))

    def _notify(self, channel: str, payload: str) -> None:
        self.connection().execute("SELECT pg_notify(%s, %s)", (channel, payload))

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection to the server (blocking); `PersistenceError` naming the server
        (never the password) if it cannot be made."""
        try:
            return psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise unreachable(self.dsn, exc) from None

    def _complete(self) -> str:
        """The DSN `connect` uses: with libpq's defaults it lacks, and the server-side
        timeouts joined to its ``options``."""
        try:
            given = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError as exc:
            raise PersistenceError(f"{self.where}: {exc}") from None
        added = {key: value for key, value in _CONNECT_DEFAULTS.items() if key not in given}
        statement, lock = round(self.statement_timeout * 1000), round(self.lock_timeout * 1000)
        settings = (
            f"-c statement_timeout={statement} -c lock_timeout={lock}"
            f" -c idle_in_transaction_session_timeout={statement}"
        )
        if self.read_only:  # the server refuses any write, should one be tried
            settings += " -c default_transaction_read_only=on"
        added["options"] = f"{given.get('options') or ''} {settings}".strip()
        return psycopg.conninfo.make_conninfo(self.dsn, **added)

    def connection(self) -> psycopg.Connection[Any]:
        """The writer's connection (used on the writer's thread only); a new one if the
        server dropped it."""
        if self._db.closed or self._db.broken:
            self._db = self.connect()
        return self._db

    def _look(self) -> bool:
        """A read-only open's check of the schema, creating nothing: `PersistenceError`
        without greenroom's tables, `UnsupportedVersion` for another version; whether the
        blobs table is there."""
        found = self._db.execute(
            "SELECT to_regclass('greenroom_schema'), to_regclass('greenroom_blobs')"
        ).fetchone()
        row = None
        if found is not None and found[0] is not None:
            row = self._db.execute("SELECT version FROM greenroom_schema").fetchone()
        if row is None:
            raise PersistenceError(f"{self.where}: no greenroom store there (no greenroom tables)")
        if row[0] != SCHEMA_VERSION:
            raise UnsupportedVersion(
                f"{self.where}: schema version {row[0]} (this greenroom reads {SCHEMA_VERSION})"
            )
        return found is not None and found[1] is not None

    def _migrate(self) -> None:
        with self._db.transaction():
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            self._db.execute("CREATE TABLE IF NOT EXISTS greenroom_schema (version integer)")
            self._db.execute(_BLOBS)
            self._db.execute(_ANSWERS)
            row = self._db.execute("SELECT version FROM greenroom_schema").fetchone()
            if row is None:
                self._db.execute(_SCHEMA)
                self._db.execute("INSERT INTO greenroom_schema VALUES (%s)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise UnsupportedVersion(
                    f"{self.where}: schema version {row[0]} (this greenroom reads {SCHEMA_VERSION})"
                )
            if self._db.execute(_HAS_HOLDER_COLUMNS).fetchone() is None:
                self._db.execute(_HOLDER_COLUMNS)

    def _batch(self, jobs: Sequence[Job]) -> None:
        run_batch(jobs, self._commit, self._run_job)

    def _run_job(self, job: Job) -> None:
        if isinstance(job, Call):
            try:
                job.value = job.call()
            except psycopg.Error as exc:
                raise PersistenceError(f"{self.where}: {exc}") from None

    def _commit(self, appends: Sequence[Append]) -> None:
        durable = any(job.sync for job in appends) or self.sync == "always"
        try:
            db = self.connection()
            with db.transaction():
                if not durable:
                    db.execute("SET LOCAL synchronous_commit = off")
                for job in appends:
                    try:
                        with db.transaction():  # a savepoint: a fenced append undoes only itself
                            self._rows.append(db, job)
                    except PersistenceError as exc:
                        job.error = exc
        except psycopg.Error as exc:
            for job in appends:
                job.error = job.error or PersistenceError(f"{self.where}: {exc}")
        except PersistenceError as exc:  # the server cannot be reached
            for job in appends:
                job.error = job.error or exc

    def _create(self, header: SessionHeader) -> int:
        """Store the header and take the lease in one transaction (the lock before it commits);
        returns the epoch."""
        db = self.connection()
        key: int | None = None
        try:
            with db.transaction():  # committed with the lock held: no row without its holder
                epoch = _next_epoch(db)
                self._insert(db, header, epoch)
                key = lock_key(header.id, epoch)
                self._leases.lock(key)
        except BaseException:
            if key is not None:  # only a lock this call took
                self._leases.unlock(key)
            raise
        return epoch

    def _insert(self, db: psycopg.Connection[Any], header: SessionHeader, epoch: int) -> None:
        inserted = db.execute(
            "INSERT INTO greenroom_sessions (id, header, epoch, updated_at, holder_node,"
            " holder_pid, holder_host, holder_start, holder_owner, lease_until)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " now() + make_interval(secs => %s)) ON CONFLICT (id) DO NOTHING",
            (
                header.id,
                _encoder.encode(header),
                epoch,
                header.created_at / 1000,
                self.node,
                *self._me(),
                self.lease_ttl,
            ),
        ).rowcount
        if not inserted:
            raise SessionExists(f"session {header.id!r} is stored already in {self.where}")

    def _open(
        self, session_id: str, interrupted: Interruption
    ) -> tuple[SessionHeader, Events, int]:
        db = self.connection()
        taken: Keys = []  # the advisory lock this open took, dropped if it fails
        try:
            with db.transaction():  # a failed commit drops the lock too
                left, opened = self._take_over(db, session_id, taken, interrupted)
        except BaseException:
            for key in taken:
                self._leases.unlock(key)
            raise
        # Once the take-over is committed: a failed one leaves the sweep to who takes it.
        self._sweep_after(left, session_id)
        return opened

    def _me(self) -> tuple[int, str, int | None, str]:
        """This process as a holder: pid, host, start time and its spawns' token."""
        me = owner()
        return me.pid, self.host, me.start, me.token

    def _sweep_after(self, left: _Left, session_id: str) -> None:
        """End what a dead holder of this host left running (see the module docstring)."""
        if left.pid is None or left.host != self.host or left.owner is None:
            return  # given back, another host's, or a holder from before the token was kept
        sweep_dead_holder(session_id, left.pid, left.start, left.owner)

    def _take_over(
        self,
        db: psycopg.Connection[Any],
        session_id: str,
        taken: Keys,
        interrupted: Interruption,
    ) -> tuple[_Left, tuple[SessionHeader, Events, int]]:
        """The holder it took the session from, and what `open` returns."""
        left = self._claim(db, session_id)
        if left is None:
            raise SessionNotFound(f"no stored session {session_id!r} in {self.where}")
        epoch = _next_epoch(db)
        key = lock_key(session_id, epoch)
        self._leases.lock(key)
        taken.append(key)
        db.execute(
            "UPDATE greenroom_sessions SET epoch = %s, holder_node = %s, holder_pid = %s,"
            " holder_host = %s, holder_start = %s, holder_owner = %s,"
            " lease_until = now() + make_interval(secs => %s) WHERE id = %s",
            (epoch, self.node, *self._me(), self.lease_ttl, session_id),
        )
        header, events = self._read(db, session_id)
        closers = repair(events, interrupted)
        if closers:
            self._rows.append(db, Append(session_id, epoch, closers, sync=True))
            logger.info("closed interrupted turn of %r in %s", session_id, self.where)
        return left, (header, events + closers, epoch)

    def _claim(self, db: psycopg.Connection[Any], session_id: str) -> _Left | None:
        """Lock the session's row for this transaction if nobody else holds the session,
        and return the holder it names; None if there is no such session, `SessionLocked`
        naming the holder if a live one does (its lease unexpired and its advisory lock
        held)."""
        row = db.execute(
            "SELECT epoch, holder_node, holder_pid, lease_until > now(), holder_host,"
            " holder_start, holder_owner FROM greenroom_sessions WHERE id = %s FOR UPDATE",
            (session_id,),
        ).fetchone()
        if row is None:
            return None
        epoch, node, pid, live, host, start, token = row
        if live and not self._holder_gone(lock_key(session_id, epoch), pid, host, start):
            raise SessionLocked(session_id, Holder(pid, node), self.where)
        return _Left(pid, host, start, token)

    def _holder_gone(self, key: int, pid: int | None, host: str | None, start: int | None) -> bool:
        """Whether the holder of `key` is gone: its advisory lock is free. A holder of this
        host whose process is dead is waited for, up to `HOLDER_EXIT`: its server backend
        drops the lock only once it has seen the connection close, which a loaded server
        may take a moment to do (it is blocking: the writer's thread)."""
        if self._leases.holder_gone(key):
            return True
        if pid is None or start is None or host != self.host or alive(pid, start):
            return False
        deadline = time.monotonic() + HOLDER_EXIT
        while time.monotonic() < deadline:
            time.sleep(0.02)
            if self._leases.holder_gone(key):
                return True
        return False

    def _read(self, db: psycopg.Connection[Any], session_id: str) -> tuple[SessionHeader, Events]:
        stored = self._rows.read(db, session_id)
        if stored is None:
            raise SessionNotFound(f"no stored session {session_id!r} in {self.where}")
        return stored

    def _list(self) -> Stored:
        rows = (
            self.connection()
            .execute(
                "SELECT header, title, updated_at, holder_node, holder_pid,"
                " lease_until > now() FROM greenroom_sessions ORDER BY updated_at DESC, id"
            )
            .fetchall()
        )
        return [
            StoredSession(_header_decoder.decode(h), t, u, Holder(pid, node) if live else None)
            for h, t, u, node, pid, live in rows
        ]

    def _delete(self, session_id: str) -> None:
        db = self.connection()
        with db.transaction():
            if self._claim(db, session_id) is None:
                return
            db.execute("DELETE FROM greenroom_batches WHERE session_id = %s", (session_id,))
            db.execute("DELETE FROM greenroom_blobs WHERE session_id = %s", (session_id,))
            db.execute("DELETE FROM greenroom_answers WHERE session_id = %s", (session_id,))
            db.execute("DELETE FROM greenroom_sessions WHERE id = %s", (session_id,))

    def _put_blobs(self, session_id: str, blobs: Mapping[str, bytes]) -> None:
        db = self.connection()
        with db.transaction():
            for digest, data in blobs.items():
                db.execute(
                    "INSERT INTO greenroom_blobs VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    (session_id, digest, data),
                )

    def _read_blobs(self, session_id: str, digests: Sequence[str]) -> dict[str, bytes]:
        if not self._has_blobs:
            return {}  # a store from before the table, opened read-only
        rows = (
            self.connection()
            .execute(
                "SELECT sha256, data FROM greenroom_blobs"
                " WHERE session_id = %s AND sha256 = ANY(%s)",
                (session_id, list(digests)),
            )
            .fetchall()
        )
        return {digest: bytes(data) for digest, data in rows}

    def _put_answer(
        self, session_id: str, decision_id: str, answer: str, by: str
    ) -> tuple[str, str]:
        db = self.connection()
        with db.transaction():
            db.execute(
                "INSERT INTO greenroom_answers VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (session_id, decision_id, answer, by),
            )
            row = db.execute(
                "SELECT answer, answered_by FROM greenroom_answers"
                " WHERE session_id = %s AND decision_id = %s",
                (session_id, decision_id),
            ).fetchone()
        assert row is not None
        # Read after the insert: a holder that took the session since read the answers
        # after it took its lease, so it has this one, or is named here and told.
        holder = db.execute(
            "SELECT holder_node, holder_pid FROM greenroom_sessions"
            " WHERE id = %s AND lease_until > now()",
            (session_id,),
        ).fetchone()
        payload = answered(session_id, decision_id)
        if holder is not None and holder[1] is not None and payload is not None:
            self._notify(channel_of(holder[0], holder[1]), payload)
        return str(row[0]), str(row[1])

    def _read_answers(self, session_id: str) -> dict[str, tuple[str, str]]:
        db = self.connection()
        found = db.execute("SELECT to_regclass('greenroom_answers')").fetchone()
        if found is None or found[0] is None:
            return {}  # a store from before the table, opened read-only
        rows = db.execute(
            "SELECT decision_id, answer, answered_by FROM greenroom_answers WHERE session_id = %s",
            (session_id,),
        ).fetchall()
        return {str(d): (str(a), str(b)) for d, a, b in rows}


def _next_epoch(db: psycopg.Connection[Any]) -> int:
    """A fencing token never handed out before, by any node, for any session."""
    row = db.execute("SELECT nextval('greenroom_epochs')").fetchone()
    assert row is not None
    return int(row[0])


def own_parameters(dsn: str) -> tuple[str, dict[str, str]]:
    """`dsn` without the parameters greenroom reads itself (libpq refuses them), and those,
    by name. A URL carries them in its query; a ``key=value`` DSN as more of its pairs."""
    if "://" in dsn:
        base, _, query = dsn.partition("?")
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        own = {key: value for key, value in pairs if key in _OWN_PARAMETERS}
        if not own:
            return dsn, own  # as given, to the byte
        rest = urllib.parse.urlencode([(k, v) for k, v in pairs if k not in _OWN_PARAMETERS])
        return f"{base}?{rest}" if rest else base, own
    own = {}
    for match in _PAIR.finditer(dsn):
        own[match[1]] = match[2].strip("'")
    return _PAIR.sub("", dsn).strip(), own


_PAIR = re.compile(rf"(?:^|\s)({'|'.join(_OWN_PARAMETERS)})\s*=\s*('[^']*'|\S+)")
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?)\s*(ms|s|min)?\s*")
_UNITS: Final = {None: 0.001, "ms": 0.001, "s": 1.0, "min": 60.0}


def _duration(given: dict[str, str], name: str, default: float) -> float:
    """Seconds, from a PostgreSQL duration (a bare number is milliseconds); `default` if
    `name` was not given. `PersistenceError` naming the parameter if it does not read."""
    if name not in given:
        return default
    match = _DURATION.fullmatch(given[name])
    if match is None:
        raise PersistenceError(
            f"{name}={given[name]!r} in the PostgreSQL DSN is not a duration"
            " (milliseconds, or with a unit: 500ms, 5s, 1min; 0 for none)"
        )
    return float(match[1]) * _UNITS[match[2]]


def unreachable(dsn: str, exc: psycopg.Error) -> PersistenceError:
    """`PersistenceError` saying the server of `dsn` could not be reached, and libpq's
    reason on one line, with every form of the DSN's password starred out."""
    why = " ".join(str(exc).split())  # libpq's message spans lines
    for secret in _passwords(dsn):
        why = why.replace(secret, "***")
    return PersistenceError(f"cannot reach {_describe(dsn)}: {why}")


def _passwords(dsn: str) -> list[str]:
    """Every form of a password `dsn` may carry, for scrubbing it out of libpq's messages."""
    found = re.findall(r"://[^:/@]*:(.*)@", dsn) + re.findall(r"password=([^&\s]*)", dsn)
    return [form for raw in found if raw for form in {raw, urllib.parse.unquote(raw)}]


def _describe(dsn: str) -> str:
    """The server, for messages: the DSN without a password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "PostgreSQL (an unreadable DSN)"
    host = info.get("host") or "localhost"
    return f"PostgreSQL database {info.get('dbname', '?')!r} at {host}"
