"""`SqlitePersistence`: every session in one SQLite database (stdlib ``sqlite3``, WAL mode).

One connection, used by one worker thread at a time (a `trio.Lock` hands it
over); each `append` is one transaction, committed with ``synchronous=FULL``,
so a batch is on disk whole or not at all. A batch is one row: the JSON lines
of its events, keyed by (session id, first seq), so a resume fetches one row
per drain (per turn) and decodes the whole log in one call.
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
CREATE TABLE IF NOT EXISTS batches (
    session_id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    next_seq INTEGER NOT NULL,
    lines BLOB NOT NULL,
    PRIMARY KEY (session_id, first_seq)
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

    def check_session_id(self, session_id: str) -> None:
        check_session_id(session_id)

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
            if not self._db.execute(
                "SELECT 1 FROM sessions WHERE id = ?", (session_id,)
            ).fetchone():
                raise SessionNotFound(f"no stored session {session_id!r} in {self.path}")
            last = self._db.execute(
                "SELECT next_seq FROM batches WHERE session_id = ? ORDER BY first_seq DESC LIMIT 1",
                (session_id,),
            ).fetchone()
            stored = last[0] if last else 0
            if events[0].seq != stored:
                raise SeqMismatch(
                    f"session {session_id!r}: append starts at seq {events[0].seq},"
                    f" but {self.path} holds {stored} events"
                )
            self._db.execute(
                "INSERT INTO batches (session_id, first_seq, next_seq, lines) VALUES (?, ?, ?, ?)",
                (session_id, events[0].seq, events[-1].seq + 1, _encoder.encode_lines(events)),
            )

    def _load_sync(self, session_id: str) -> tuple[SessionHeader, Events]:
        row = self._db.execute("SELECT header FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(f"no stored session {session_id!r} in {self.path}")
        header = _decode_header(self.path, session_id, row[0])
        rows = self._db.execute(
            "SELECT lines FROM batches WHERE session_id = ? ORDER BY first_seq", (session_id,)
        ).fetchall()
        try:  # one decode call for the whole log
            events: Events = _event_decoder.decode_lines(b"".join(row[0] for row in rows))
        except msgspec.DecodeError as exc:
            raise CorruptLog(
                f"{self.path}: an event of session {session_id!r} does not decode: {exc}"
            ) from None
        for index, event in enumerate(events):
            if event.seq != index:
                raise CorruptLog(f"{self.path}: session {session_id!r} has a gap at seq {index}")
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
