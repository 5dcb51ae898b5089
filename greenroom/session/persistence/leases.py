"""`Leases`: the PostgreSQL leases one persistence holds, their advisory locks and heartbeat.

A lease is a session's row naming its holder (node, pid), its epoch and an
expiry; the holder also holds a session-level advisory lock keyed by
(session, epoch) (`lock_key`) on a connection of the leases' own, which
PostgreSQL drops the moment that connection ends. See
`greenroom.session.persistence.postgres` for who takes a lease over when.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any, Final

import psycopg

from greenroom.session.persistence.base import LeaseLost, PersistenceError
from greenroom.session.persistence.batch import BatchLog

logger = logging.getLogger("greenroom.persistence")

#: Seconds closing a persistence waits for a lease statement in flight.
STOP_WAIT: Final = 1.0


def lock_key(session_id: str, epoch: int) -> int:
    """The advisory lock (a signed 64-bit key) of one holding of one session."""
    digest = hashlib.sha256(f"{session_id}\x00{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Leases:
    """The leases this persistence holds: their advisory locks and their heartbeat.

    One connection of its own (autocommit), used by whoever holds `_lock`: the
    writer's thread (lock, probe, release) and the heartbeat thread, which wakes every
    third of the lease's ttl while any lease is held, renews them all in one statement,
    and tells a log whose lease another node took that it lost it. The renewal skips a
    row another transaction has locked (a take-over in progress, perhaps this process's
    own) rather than wait for it with `_lock` held: the next beat renews it or finds it
    taken. The Trio thread never takes `_lock` (a statement that hangs holds it): the
    table of held leases has a lock of its own, held for no I/O.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        writer_connection: Callable[[], psycopg.Connection[Any]],
        where: str,
        lease_ttl: float,
    ) -> None:
        self._connect = connect
        self._writer_connection = writer_connection
        self._where = where
        self._lease_ttl = lease_ttl
        self._lock = threading.Lock()
        self._db = connect()
        self._held_lock = threading.Lock()  # guards `_held` and `_thread`, never across I/O
        self._held: dict[tuple[str, int], BatchLog | None] = {}
        self._keys: set[int] = set()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        """The lease connection; a new one, with our locks taken again, if it was dropped.

        A lock that cannot be taken again was taken by another node meanwhile: its log
        has lost its lease.
        """
        if self._stopped:
            raise PersistenceError(f"{self._where}: this persistence is closed")
        if self._db.closed or self._db.broken:
            self._db = self._connect()
            with self._held_lock:
                held = list(self._held.items())
            for (session_id, epoch), log in held:
                key = lock_key(session_id, epoch)
                taken = self._db.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                if not (taken and taken[0]):
                    self._keys.discard(key)
                    self._lose(session_id, epoch, log)
        return self._db

    def lock(self, key: int) -> None:
        with self._lock:
            taken = self._connection().execute("SELECT pg_try_advisory_lock(%s)", (key,))
            if not taken.fetchone()[0]:  # type: ignore[index]
                raise PersistenceError("a lease's advisory lock is held elsewhere; try again")
            self._keys.add(key)

    def unlock(self, key: int) -> None:
        """Drop the advisory lock `key` if this persistence holds it."""
        with self._lock:
            if key not in self._keys:
                return
            self._keys.discard(key)
            if self._db.closed or self._db.broken:
                return  # the server dropped the lock with the connection
            try:
                self._db.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except psycopg.OperationalError:
                if not self._db.broken:
                    raise

    def holder_gone(self, key: int) -> bool:
        """True if nobody holds the advisory lock `key` (its holder's connection ended)."""
        with self._lock:
            if key in self._keys:
                return False  # we hold it ourselves
            db = self._connection()
            taken = db.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if taken is not None and taken[0]:
                db.execute("SELECT pg_advisory_unlock(%s)", (key,))
                return True
            return False

    def watch(self, session_id: str, epoch: int, log: BatchLog) -> None:
        with self._held_lock:
            self._held[(session_id, epoch)] = log
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._beat, name="greenroom lease heartbeat", daemon=True
                )
                self._thread.start()

    def forget(self, session_id: str, epoch: int) -> None:
        """Renew this lease no more (from any thread; waits for no statement)."""
        with self._held_lock:
            self._held.pop((session_id, epoch), None)

    def release(self, session_id: str, epoch: int) -> None:
        """Give the lease back (if it is still ours) and drop its advisory lock."""
        self.forget(session_id, epoch)
        try:
            self._writer_connection().execute(
                "UPDATE greenroom_sessions SET holder_node = NULL, holder_pid = NULL,"
                " lease_until = NULL WHERE id = %s AND epoch = %s",
                (session_id, epoch),
            )
        finally:  # the lock goes even if the row could not be updated: the lease then expires
            self.unlock(lock_key(session_id, epoch))

    def stop(self) -> None:
        """Stop the heartbeat and close the connection, waiting at most `STOP_WAIT` for a
        statement in flight: one hung on a silent server is left to the process's end."""
        self._stopped = True
        self._wake.set()
        if self._lock.acquire(timeout=STOP_WAIT):
            try:
                self._db.close()
            finally:
                self._lock.release()
        else:
            logger.warning("%s: a lease statement is still waiting", self._where)
        with self._held_lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_WAIT)

    def _beat(self) -> None:
        period = self._lease_ttl / 3
        while True:
            self._wake.wait(period)
            with self._held_lock:
                held = dict(self._held)
                if self._stopped or not held:
                    self._thread = None
                    return
            with self._lock:
                try:
                    self._renew(held)
                except (psycopg.Error, PersistenceError) as exc:
                    logger.warning("renewing leases in %s failed: %s", self._where, exc)

    def _renew(self, held: dict[tuple[str, int], BatchLog | None]) -> None:
        ids = [session_id for session_id, _ in held]
        epochs = [epoch for _, epoch in held]
        db = self._connection()
        db.execute(
            "UPDATE greenroom_sessions SET lease_until = now() + make_interval(secs => %s)"
            " WHERE id IN (SELECT s.id FROM greenroom_sessions AS s"
            " JOIN unnest(%s::text[], %s::bigint[]) AS h(id, epoch)"
            " ON s.id = h.id AND s.epoch = h.epoch FOR UPDATE OF s SKIP LOCKED)",
            (self._lease_ttl, ids, epochs),
        )
        current = dict(
            db.execute(  # a plain read waits for no row lock
                "SELECT id, epoch FROM greenroom_sessions WHERE id = ANY(%s)", (ids,)
            ).fetchall()
        )
        for (session_id, epoch), log in held.items():
            if current.get(session_id) != epoch:
                self._lose(session_id, epoch, log)

    def _lose(self, session_id: str, epoch: int, log: BatchLog | None) -> None:
        """Tell `log` that another node took its session over (called with `_lock` held)."""
        self.forget(session_id, epoch)
        if log is not None:
            # A plain attribute the log reads at its next write: no need to wake Trio.
            log.lost(
                LeaseLost(
                    f"session {session_id!r} was taken over by another node (this life held"
                    f" epoch {epoch}); nothing more written to {self._where}"
                )
            )
