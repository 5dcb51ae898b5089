"""`SqlitePersistence`: every session in one SQLite database (stdlib ``sqlite3``, WAL mode).

One connection, used by one worker thread at a time (a `trio.Lock` hands it
over); each `append` is one transaction, committed with ``synchronous=FULL``,
so a batch is on disk whole or not at all. Events are stored as their JSON,
keyed by (session id, seq).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import TypeAlias

import msgspec
import trio

from greenroom.protocol.events import SESSION_VERSION, SessionEvent, SessionHeader
from greenroom.session.persistence.base import (
    CorruptLog,
    NotASessionLog,
    SeqMismatch,
    SessionExists,
    SessionNotFound,
    UnsupportedVersion,
    repair,
)
from greenroom.session.store import check_session_id

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, header BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""

Events: TypeAlias = list[SessionEvent]
Headers: TypeAlias = list[SessionHeader]

_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(SessionEvent)
_header_decoder = msgspec.json.Decoder(SessionHeader)


class SqlitePersistence:
    """Session logs in the SQLite database at `path` (created if missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._turn = trio.Lock()  # one thread at a time on the connection

    def close(self) -> None:
        self._db.close()

    async def create(self, header: SessionHeader) -> None:
        check_session_id(header.id)
        async with self._turn:
            await trio.to_thread.run_sync(self._create_sync, header)

    async def append(self, session_id: str, events: Sequence[SessionEvent]) -> None:
        if not events:
            return
        async with self._turn:
            await trio.to_thread.run_sync(self._append_sync, session_id, events)

    async def load(self, session_id: str) -> tuple[SessionHeader, Events]:
        check_session_id(session_id)
        async with self._turn:
            return await trio.to_thread.run_sync(self._load_sync, session_id)

    async def list(self) -> Headers:
        async with self._turn:
            rows = await trio.to_thread.run_sync(
                lambda: self._db.execute("SELECT header FROM sessions ORDER BY id").fetchall()
            )
        return [_header_decoder.decode(row[0]) for row in rows]

    # -- in a worker thread ------------------------------------------------------

    def _create_sync(self, header: SessionHeader) -> None:
        try:
            with self._transaction():
                self._db.execute(
                    "INSERT INTO sessions (id, header) VALUES (?, ?)",
                    (header.id, _encoder.encode(header)),
                )
        except sqlite3.IntegrityError:
            raise SessionExists(f"session {header.id!r} already exists in {self.path}") from None

    def _append_sync(self, session_id: str, events: Sequence[SessionEvent]) -> None:
        with self._transaction():
            stored = self._db.execute(
                "SELECT coalesce(max(seq) + 1, 0), (SELECT 1 FROM sessions WHERE id = ?)"
                " FROM events WHERE session_id = ?",
                (session_id, session_id),
            ).fetchone()
            if stored[1] is None:
                raise SessionNotFound(f"no stored session {session_id!r} in {self.path}")
            if events[0].seq != stored[0]:
                raise SeqMismatch(
                    f"session {session_id!r}: append starts at seq {events[0].seq},"
                    f" but {self.path} holds {stored[0]} events"
                )
            self._db.executemany(
                "INSERT INTO events (session_id, seq, event) VALUES (?, ?, ?)",
                [(session_id, e.seq, _encoder.encode(e)) for e in events],
            )

    def _load_sync(self, session_id: str) -> tuple[SessionHeader, Events]:
        row = self._db.execute("SELECT header FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(f"no stored session {session_id!r} in {self.path}")
        header = _decode_header(self.path, session_id, row[0])
        events: Events = []
        cursor = self._db.execute(
            "SELECT seq, event FROM events WHERE session_id = ? ORDER BY seq", (session_id,)
        )
        for seq, raw in cursor:
            try:
                event = _event_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                raise CorruptLog(
                    f"{self.path}: event {seq} of session {session_id!r} does not decode: {exc}"
                ) from None
            if seq != len(events) or event.seq != seq:
                raise CorruptLog(f"{self.path}: session {session_id!r} has a gap at seq {seq}")
            events.append(event)
        closers = repair(events)
        if closers:
            self._append_sync(session_id, closers)
        return header, events + closers

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    __slots__ = ("_db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _decode_header(path: str, session_id: str, raw: bytes) -> SessionHeader:
    try:
        header = _header_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise NotASessionLog(
            f"{path}: the header of {session_id!r} does not decode: {exc}"
        ) from None
    if header.version != SESSION_VERSION:
        raise UnsupportedVersion(
            f"{path}: session {session_id!r} has log version {header.version}"
            f" (this greenroom reads version {SESSION_VERSION})"
        )
    return header
