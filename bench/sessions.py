"""Sessions: durable append throughput and resume time of the persistence backends.

* durable append: T turns of 10 events each, one ``await persistence.append(id, turn)``
  per turn (group commit: one fsync, or one transaction, per turn) after one
  ``create``, for `JsonlPersistence` and `SqlitePersistence`, in events per
  second, against a plain synchronous loop that encodes the same lines
  (``Encoder.encode_lines``), ``os.write``s them to a file and ``os.fsync``s
  once per turn; the ratio is ours / raw, so higher is better;
* resume: ``load`` of a session of complete 10-event turns, by a fresh instance
  each time (for SQLite, opening the database is timed too), against reading
  the same JSONL file and ``Decoder(SessionEvent).decode_lines`` of its lines
  after the header, in milliseconds.

Every file lives in a `tempfile.TemporaryDirectory` (so on the disk that
holds it, with real fsyncs). The variants alternate inside each repeat, with a
``gc.collect()`` before each; every async variant runs in a fresh ``trio.run``.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import trio

from bench.report import Row, compare
from greenroom.protocol.events import (
    COMPLETED,
    USER,
    AssistantChunk,
    AssistantMessage,
    MessageTrigger,
    SessionEvent,
    SessionHeader,
    StepEnd,
    StepStart,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import TextDelta
from greenroom.session.persistence import JsonlPersistence, SqlitePersistence

SCENARIO = "sessions"
SESSION_ID = "bench-session"
EVENTS_PER_TURN = 10
#: Events per ``append`` when filling the SQLite session to resume (one transaction each).
_FILL_BATCH = 1_000
_CHUNK = "The quick brown fox jumps over the lazy d"  # 41 characters of streamed text
_T0 = 1_700_000_000.0

Turn = list[SessionEvent]


def _header() -> SessionHeader:
    return SessionHeader(id=SESSION_ID, created_at=int(_T0 * 1000))


def _turn(turn: int) -> Turn:
    """Turn `turn` (from 1): exactly 10 events, with seqs following the turns before it."""
    seq = (turn - 1) * EVENTS_PER_TURN
    now = _T0 + turn
    chunks = [
        AssistantChunk(seq=seq + 3 + i, time=now, turn=turn, step=1, chunk=TextDelta(_CHUNK))
        for i in range(4)
    ]
    events: Turn = [
        TurnStart(seq=seq, time=now, turn=turn, trigger=MessageTrigger(source=USER)),
        UserMessage(
            seq=seq + 1,
            time=now,
            content=f"Please summarise document number {turn} for me.",
            source=USER,
            message_id=f"m{turn}",
        ),
        StepStart(seq=seq + 2, time=now, turn=turn, step=1),
        *chunks,
        AssistantMessage(seq=seq + 7, time=now, turn=turn, step=1, content=_CHUNK * 4),
        StepEnd(seq=seq + 8, time=now, turn=turn, step=1),
        TurnEnd(seq=seq + 9, time=now, turn=turn, reason=COMPLETED),
    ]
    assert len(events) == EVENTS_PER_TURN
    return events


def _turns(count: int) -> list[Turn]:
    return [_turn(t) for t in range(1, count + 1)]


# -- (a) durable append -----------------------------------------------------------------------


def _raw_append(root: Path, turns: Sequence[Turn]) -> float:
    """Events per second: encode each turn's lines, ``os.write`` them, ``os.fsync`` per turn."""
    encoder = msgspec.json.Encoder()
    fd = os.open(root / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, msgspec.json.encode(_header()) + b"\n")
        os.fsync(fd)
        t0 = time.perf_counter()
        for events in turns:
            data = encoder.encode_lines(events)
            if os.write(fd, data) != len(data):
                raise RuntimeError("short write")
            os.fsync(fd)
        t1 = time.perf_counter()
    finally:
        os.close(fd)
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


async def _jsonl_append(root: Path, turns: Sequence[Turn]) -> float:
    """Events per second: one ``JsonlPersistence.append`` per turn."""
    persistence = JsonlPersistence(root)
    await persistence.create(_header())
    t0 = time.perf_counter()
    for events in turns:
        await persistence.append(SESSION_ID, events)
    t1 = time.perf_counter()
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


async def _sqlite_append(root: Path, turns: Sequence[Turn]) -> float:
    """Events per second: one ``SqlitePersistence.append`` (one transaction) per turn."""
    persistence = SqlitePersistence(root / "sessions.db")
    try:
        await persistence.create(_header())
        t0 = time.perf_counter()
        for events in turns:
            await persistence.append(SESSION_ID, events)
        t1 = time.perf_counter()
    finally:
        persistence.close()
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


def _in_tempdir(measure: Callable[[Path], float]) -> float:
    """Run `measure` in a fresh temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        return measure(Path(tmp))


# -- (b) resume ---------------------------------------------------------------------------------


def _raw_resume(jsonl: Path, n: int) -> float:
    """Milliseconds to read the JSONL file and decode its event lines (after the header)."""
    decoder = msgspec.json.Decoder(SessionEvent)
    t0 = time.perf_counter()
    with open(jsonl, "rb") as file:
        data = file.read()
    events = decoder.decode_lines(data[data.index(b"\n") + 1 :])
    t1 = time.perf_counter()
    if len(events) != n:
        raise RuntimeError(f"raw decode: expected {n} events, got {len(events)}")
    return (t1 - t0) * 1e3


async def _jsonl_resume(root: Path, n: int) -> float:
    """Milliseconds for ``await JsonlPersistence(root).load(id)``."""
    t0 = time.perf_counter()
    header, events = await JsonlPersistence(root).load(SESSION_ID)
    t1 = time.perf_counter()
    if header.id != SESSION_ID or len(events) != n:
        raise RuntimeError(f"JSONL load: expected {n} events, got {len(events)}")
    return (t1 - t0) * 1e3


async def _sqlite_resume(db: Path, n: int) -> float:
    """Milliseconds for ``await SqlitePersistence(db).load(id)``, opening the database included."""
    t0 = time.perf_counter()
    persistence = SqlitePersistence(db)
    try:
        header, events = await persistence.load(SESSION_ID)
        t1 = time.perf_counter()
    finally:
        persistence.close()
    if header.id != SESSION_ID or len(events) != n:
        raise RuntimeError(f"SQLite load: expected {n} events, got {len(events)}")
    return (t1 - t0) * 1e3


async def _fill_sqlite(db: Path, turns: Sequence[Turn]) -> None:
    """Store the session through ``append``, ``_FILL_BATCH`` events per transaction."""
    persistence = SqlitePersistence(db)
    try:
        await persistence.create(_header())
        events = [event for turn in turns for event in turn]
        for start in range(0, len(events), _FILL_BATCH):
            await persistence.append(SESSION_ID, events[start : start + _FILL_BATCH])
    finally:
        persistence.close()


def _fill_jsonl(root: Path, turns: Sequence[Turn]) -> Path:
    """Write the session's JSONL file directly: the header line, then every event's line."""
    path = JsonlPersistence(root).path(SESSION_ID)
    encoder = msgspec.json.Encoder()
    with open(path, "wb") as file:
        file.write(msgspec.json.encode(_header()) + b"\n")
        for events in turns:
            file.write(encoder.encode_lines(events))
    return path


# -- the scenario ---------------------------------------------------------------------------


def run(repeats: int, quick: bool) -> list[Row]:
    t = 200 if quick else 1_000  # turns appended, one append each
    n = 20_000 if quick else 100_000  # events of the session to resume

    append_turns = _turns(t)
    appends: dict[str, list[float]] = {"raw": [], "jsonl": [], "sqlite": []}
    append_variants: dict[str, Callable[[Path], float]] = {
        "raw": lambda root: _raw_append(root, append_turns),
        "jsonl": lambda root: trio.run(_jsonl_append, root, append_turns),
        "sqlite": lambda root: trio.run(_sqlite_append, root, append_turns),
    }

    resume_turns = _turns(n // EVENTS_PER_TURN)
    resumes: dict[str, list[float]] = {"raw": [], "jsonl": [], "sqlite": []}
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        root = Path(tmp) / "jsonl"
        root.mkdir()
        db = Path(tmp) / "sessions.db"
        jsonl = _fill_jsonl(root, resume_turns)
        trio.run(_fill_sqlite, db, resume_turns)
        del resume_turns
        for _ in range(repeats):
            for name, variant in append_variants.items():
                gc.collect()
                appends[name].append(_in_tempdir(variant))
            gc.collect()
            resumes["raw"].append(_raw_resume(jsonl, n))
            gc.collect()
            resumes["jsonl"].append(trio.run(_jsonl_resume, root, n))
            gc.collect()
            resumes["sqlite"].append(trio.run(_sqlite_resume, db, n))

    raw_append = "os.write+fsync per turn"
    raw_decode = "read + decode_lines"
    return [
        compare(
            SCENARIO,
            f"durable append, JSONL, 1 append/turn (T={t})",
            "events/s",
            appends["jsonl"],
            baseline=raw_append,
            raw=appends["raw"],
            min_ratio=0.7,
        ),
        compare(
            SCENARIO,
            f"durable append, SQLite, 1 append/turn (T={t})",
            "events/s",
            appends["sqlite"],
            baseline=raw_append,
            raw=appends["raw"],
            min_ratio=0.7,
        ),
        compare(
            SCENARIO,
            f"resume, JSONL load (N={n})",
            "ms",
            resumes["jsonl"],
            baseline=raw_decode,
            raw=resumes["raw"],
            max_ratio=2.0,
        ),
        compare(
            SCENARIO,
            f"resume, SQLite open + load (N={n})",
            "ms",
            resumes["sqlite"],
            baseline=raw_decode,
            raw=resumes["raw"],
            max_ratio=2.0,
        ),
    ]
