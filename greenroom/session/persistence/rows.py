"""The row layer SQLite and PostgreSQL share: a session's log as rows, and a writer batch.

Both keep a ``sessions`` table (id, header, epoch, next_seq, title,
updated_at, ...) and a ``batches`` table (session_id, first_seq, next_seq,
lines): one row per drain, the JSON lines of its events. `Rows` holds the
statements, made once per persistence from its table names and its driver's
placeholder; each method takes the connection (or transaction) to run on.
Every append moves the session's next seq past its events only at the
append's epoch and only from their first seq (the fence); one that matched
no row is a retry (`stored_already` keeps only what the store lacks) or a
`LeaseLost`.

`run_batch` runs a writer batch on one connection; `decode_header` reads a stored header,
naming the session when it cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from greenroom.protocol.events import SESSION_VERSION, SessionEvent, SessionHeader
from greenroom.session.persistence.base import (
    CorruptLog,
    Events,
    NotASessionLog,
    UnsupportedVersion,
)
from greenroom.session.persistence.batch import Append, stored_already
from greenroom.session.persistence.writer import Job

_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(SessionEvent)
_header_decoder = msgspec.json.Decoder(SessionHeader)


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Any: ...


class Connection(Protocol):
    """What the row layer needs of a DB-API connection (``sqlite3``'s, psycopg's)."""

    def execute(self, query: Any, params: Any = ..., /) -> Cursor: ...


class Rows:
    """The statements of one store (see the module docstring). ``where`` names the store in
    errors; ``other`` names who else writes it (``"another process"``, ``"another node"``)."""

    __slots__ = (
        "_advance",
        "_fence",
        "_header",
        "_insert",
        "_lines",
        "_retitle",
        "other",
        "where",
    )

    def __init__(self, where: str, sessions: str, batches: str, mark: str, other: str) -> None:
        self.where = where
        self.other = other
        fenced = f"WHERE id = {mark} AND epoch = {mark} AND next_seq = {mark}"
        self._advance = (
            f"UPDATE {sessions} SET next_seq = {mark}, updated_at = {mark},"
            f" title = COALESCE(title, {mark}) {fenced}"
        )
        self._retitle = (
            f"UPDATE {sessions} SET next_seq = {mark}, updated_at = {mark}, title = {mark} {fenced}"
        )
        self._fence = f"SELECT epoch, next_seq FROM {sessions} WHERE id = {mark}"
        self._insert = (
            f"INSERT INTO {batches} (session_id, first_seq, next_seq, lines)"
            f" VALUES ({mark}, {mark}, {mark}, {mark})"
        )
        self._header = f"SELECT header FROM {sessions} WHERE id = {mark}"
        self._lines = f"SELECT lines FROM {batches} WHERE session_id = {mark} ORDER BY first_seq"

    def append(self, db: Connection, job: Append) -> None:
        """Store `job`'s events past the fence; what the store holds already is skipped.
        Raises `LeaseLost` (the epoch moved on) or `PersistenceError` (a gap) before it
        writes anything, so a batch's other appends in the same transaction stand."""
        events = job.events
        if not self.advance(db, job, events):
            row = db.execute(self._fence, (job.session_id,)).fetchone()
            events = events[stored_already(job, self.where, row, self.other) :]
            if not events:
                return  # a retry of a commit that had landed: written already
            self.advance(db, job, events)
        db.execute(
            self._insert,
            (job.session_id, events[0].seq, events[-1].seq + 1, _encoder.encode_lines(events)),
        )

    def advance(self, db: Connection, job: Append, events: Events) -> bool:
        """Move the session's next seq past `events` if it is still at their first, at the
        append's epoch (its title stored: see `Append`); False if no row matched."""
        updated: int = db.execute(
            self._retitle if job.retitle else self._advance,
            (
                events[-1].seq + 1,
                events[-1].time,
                job.title,
                job.session_id,
                job.epoch,
                events[0].seq,
            ),
        ).rowcount
        return updated > 0

    def read(self, db: Connection, session_id: str) -> tuple[SessionHeader, Events] | None:
        """The session's header and whole log (one decode call), None if it is not stored.
        Raises `CorruptLog` for an event that does not decode or a gap in the seqs."""
        row = db.execute(self._header, (session_id,)).fetchone()
        if row is None:
            return None
        header = decode_header(self.where, session_id, row[0])
        rows = db.execute(self._lines, (session_id,)).fetchall()
        try:
            events: Events = _event_decoder.decode_lines(b"".join(r[0] for r in rows))
        except msgspec.DecodeError as exc:
            raise CorruptLog(
                f"{self.where}: an event of session {session_id!r} does not decode: {exc}"
            ) from None
        for index, event in enumerate(events):
            if event.seq != index:
                raise CorruptLog(f"{self.where}: session {session_id!r} has a gap at seq {index}")
        return header, events


def run_batch(
    jobs: Sequence[Job],
    commit: Callable[[Sequence[Append]], None],
    run: Callable[[Job], None],
) -> None:
    """A writer batch: each run of appends `commit`ted together (one transaction), every
    other job `run` alone, in order; what `run` raises is that job's error."""
    appends: list[Append] = []
    for job in jobs:
        if isinstance(job, Append):
            appends.append(job)
            continue
        if appends:
            commit(appends)
            appends = []
        try:
            run(job)
        except Exception as exc:
            job.error = exc
    if appends:
        commit(appends)


def decode_header(where: str, session_id: str, raw: bytes) -> SessionHeader:
    """A stored header; `NotASessionLog` if it does not decode, `UnsupportedVersion` for a
    log version this greenroom does not read."""
    try:
        header = _header_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise NotASessionLog(
            f"{where}: the header of {session_id!r} does not decode: {exc}"
        ) from None
    if header.version != SESSION_VERSION:
        raise UnsupportedVersion(
            f"{where}: session {session_id!r} has log version {header.version}"
            f" (this greenroom reads version {SESSION_VERSION})"
        )
    return header
