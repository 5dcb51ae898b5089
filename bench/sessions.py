"""Sessions: what durability costs, per backend and sync policy, and resume time.

* durable append: T turns of 10 events each appended to a live `SessionLog`
  and one ``flush`` per turn, for `JsonlPersistence` and `SqlitePersistence`,
  in events per second: with ``sync="always"`` against a plain synchronous
  loop that encodes the same lines (``Encoder.encode_lines``), ``os.write``s
  them and ``os.fsync``s once per turn; with the default ``sync="turn"``
  against the same loop without the fsync. Ratios are ours / raw (higher is
  better);
* the floor of each: for JSONL under ``turn``, the same ``os.write`` loop and one
  ``fsync`` at its end (a close waits for the policy's last fsync); for SQLite, a
  bare ``sqlite3`` connection (WAL) committing each turn's lines as one row of the
  same ``batches`` table, ``synchronous=FULL`` (``always``) or ``NORMAL``
  (``turn``), with neither the fence nor a thread. Under ``always`` the floor for
  the whole guarantee (durable before the turn's end is reported, and a hung disk
  holding no one past the deadline: the wait off the event loop) is the same loop
  with each fsync, or each ``sqlite3`` commit, in ``trio.to_thread.run_sync``: a
  thread round trip per turn, which no persistence with a deadline can skip. SQLite
  under ``turn`` has two more: the bare loop with the fence in each transaction (the
  ``UPDATE`` of the session's epoch and next seq: one live writer per session), and
  that with an ``fdatasync`` of the WAL after each turn in a thread of its own (each
  turn durable soon after its end): the floor of ``turn``'s guarantees;
* Python calls per turn appended, counted on the agent's thread (`bench.counting`), and
  instructions under callgrind (where valgrind is installed; not in a quick run): the
  one-step turn under ``sync="os"`` against it without persistence, a SQLite turn
  appended under ``sync="os"`` against the fenced floor (`bench._persist_child`);
* group commit: 10 SQLite sessions flushing turns concurrently with
  ``sync="always"``, against one session alone, in events per second;
* the turn: a one-step text turn of an agent with JSONL persistence (default
  policy) against the same turn without persistence, and its Python calls counted;
  the same turn under ``sync="os"`` (the write-ahead alone: two ``os.write`` per
  turn, no fsync) against both, which parts what write-ahead costs from what the
  turn's fsync adds;
* resume: ``open`` (hold, load, repair) of a session of complete 10-event
  turns, by a fresh instance each time (for SQLite, opening the database is
  timed too), against reading the same JSONL file and
  ``Decoder(SessionEvent).decode_lines`` of its lines after the header, in
  milliseconds;
* PostgreSQL (`bench/sessions_pg.py`, on a throwaway server): 10 sessions appending at
  once against raw psycopg, the group-commit gain, resume against a raw SELECT + decode,
  and the lease take-over after a SIGKILL of the holder.

Every file lives in a `tempfile.TemporaryDirectory` (so on the disk that
holds it, with real fsyncs). The variants alternate inside each repeat, with a
``gc.collect()`` before each; every async variant runs in a fresh ``trio.run``.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import msgspec
import trio

from bench.counting import NO_VALGRIND, instructions, profile
from bench.report import Row, compare, skipped
from greenroom.models import ScriptedModel
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
from greenroom.runtime import open_runtime
from greenroom.session.persistence import (
    JsonlPersistence,
    Persistence,
    SessionLog,
    SqlitePersistence,
    SyncPolicy,
)

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


def _raw_log(root: Path) -> int:
    """A raw log file for the floors, its header written and synced: its fd."""
    fd = os.open(root / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, msgspec.json.encode(_header()) + b"\n")
    os.fsync(fd)
    return fd


def _raw_append(root: Path, turns: Sequence[Turn], *, fsync: bool) -> float:
    """Events per second: encode each turn's lines, ``os.write`` them (and ``os.fsync``)."""
    encoder = msgspec.json.Encoder()
    fd = _raw_log(root)
    try:
        t0 = time.perf_counter()
        for events in turns:
            data = encoder.encode_lines(events)
            if os.write(fd, data) != len(data):
                raise RuntimeError("short write")
            if fsync:
                os.fsync(fd)
        t1 = time.perf_counter()
    finally:
        os.close(fd)
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


async def _raw_append_threaded(root: Path, turns: Sequence[Turn]) -> float:
    """Events per second: `_raw_append` with each turn's fsync (``fdatasync``, as JSONL's)
    in ``trio.to_thread.run_sync``."""
    encoder = msgspec.json.Encoder()
    fd = _raw_log(root)
    try:
        t0 = time.perf_counter()
        for events in turns:
            data = encoder.encode_lines(events)
            if os.write(fd, data) != len(data):
                raise RuntimeError("short write")
            await trio.to_thread.run_sync(os.fdatasync, fd)
        t1 = time.perf_counter()
    finally:
        os.close(fd)
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


def _raw_write_then_fsync(root: Path, turns: Sequence[Turn]) -> float:
    """Events per second: `_raw_append` without fsyncs, and one ``os.fsync`` at the end."""
    encoder = msgspec.json.Encoder()
    fd = _raw_log(root)
    try:
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


def _raw_db(root: Path, synchronous: str) -> sqlite3.Connection:
    """A bare connection (WAL, `synchronous`) to a database holding the ``batches`` table."""
    db = sqlite3.connect(root / "raw.db", isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute(
        "CREATE TABLE batches (session_id TEXT NOT NULL, first_seq INTEGER NOT NULL,"
        " next_seq INTEGER NOT NULL, lines BLOB NOT NULL,"
        " PRIMARY KEY (session_id, first_seq)) WITHOUT ROWID"
    )
    return db


def _raw_commit(db: sqlite3.Connection, events: Turn, lines: bytes) -> None:
    db.execute("BEGIN IMMEDIATE")
    db.execute(
        "INSERT INTO batches VALUES (?, ?, ?, ?)",
        (SESSION_ID, events[0].seq, events[-1].seq + 1, lines),
    )
    db.execute("COMMIT")


def _raw_sqlite(root: Path, turns: Sequence[Turn], *, synchronous: str) -> float:
    """Events per second: each turn's lines committed as one row by a bare connection."""
    encoder = msgspec.json.Encoder()
    db = _raw_db(root, synchronous)
    try:
        t0 = time.perf_counter()
        for events in turns:
            _raw_commit(db, events, encoder.encode_lines(events))
        t1 = time.perf_counter()
    finally:
        db.close()
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


def _raw_fenced_db(root: Path) -> sqlite3.Connection:
    """`_raw_db` (``NORMAL``) with a ``sessions`` row for the fence to check and advance."""
    db = _raw_db(root, "NORMAL")
    db.execute(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, epoch INTEGER NOT NULL,"
        " next_seq INTEGER NOT NULL, title TEXT, updated_at REAL NOT NULL)"
    )
    db.execute("INSERT INTO sessions VALUES (?, 1, 0, NULL, 0)", (SESSION_ID,))
    return db


def _raw_fenced_commit(db: sqlite3.Connection, events: Turn, lines: bytes) -> None:
    """`_raw_commit` with the fence in its transaction: the session's next seq moved past
    the turn only at its epoch and from its first seq (as every append of ours does)."""
    db.execute("BEGIN IMMEDIATE")
    moved = db.execute(
        "UPDATE sessions SET next_seq = ?, updated_at = ?, title = COALESCE(title, ?)"
        " WHERE id = ? AND epoch = ? AND next_seq = ?",
        (events[-1].seq + 1, events[-1].time, None, SESSION_ID, 1, events[0].seq),
    ).rowcount
    if moved != 1:
        raise RuntimeError("the fence matched no row")
    db.execute(
        "INSERT INTO batches VALUES (?, ?, ?, ?)",
        (SESSION_ID, events[0].seq, events[-1].seq + 1, lines),
    )
    db.execute("COMMIT")


def _raw_sqlite_fenced(root: Path, turns: Sequence[Turn], *, synced: bool) -> float:
    """Events per second: each turn's row committed with the fence (``NORMAL``); `synced`:
    and the WAL ``fdatasync``ed after each turn by a thread of its own, off the loop (turns
    that end while one runs share the next), the last turn's made durable inside the
    timing, as a close does."""
    encoder = msgspec.json.Encoder()
    db = _raw_fenced_db(root)
    wal = os.open(root / "raw.db-wal", os.O_RDONLY)
    asked = threading.Event()
    stopping = False

    def syncer() -> None:
        while True:
            asked.wait()
            asked.clear()
            if stopping:
                return
            os.fdatasync(wal)

    thread = threading.Thread(target=syncer)
    thread.start()
    try:
        t0 = time.perf_counter()
        for events in turns:
            _raw_fenced_commit(db, events, encoder.encode_lines(events))
            if synced and not asked.is_set():  # else the next fsync is asked for already
                asked.set()
        if synced:
            stopping = True
            asked.set()
            thread.join()  # the fsync under way ends
            os.fdatasync(wal)
        t1 = time.perf_counter()
    finally:
        stopping = True
        asked.set()
        thread.join()
        os.close(wal)
        db.close()
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


async def _raw_sqlite_threaded(root: Path, turns: Sequence[Turn]) -> float:
    """Events per second: `_raw_sqlite` (``FULL``) with each commit in
    ``trio.to_thread.run_sync``."""
    encoder = msgspec.json.Encoder()
    db = _raw_db(root, "FULL")
    try:
        t0 = time.perf_counter()
        for events in turns:
            await trio.to_thread.run_sync(_raw_commit, db, events, encoder.encode_lines(events))
        t1 = time.perf_counter()
    finally:
        db.close()
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


def _store(root: Path, backend: str, sync: SyncPolicy) -> Persistence:
    if backend == "jsonl":
        return JsonlPersistence(root / "sessions", sync=sync)
    return SqlitePersistence(root / "sessions.db", sync=sync)


async def _log_append(root: Path, backend: str, sync: SyncPolicy, turns: Sequence[Turn]) -> float:
    """Events per second: a turn's events appended to the live log, then one ``flush``.

    The log's close (the last fsync) is inside the timing.
    """
    persistence = _store(root, backend, sync)
    log = await persistence.create(_header())
    t0 = time.perf_counter()
    for events in turns:
        for event in events:
            log.append(event)
        await log.flush()
    await log.close()
    t1 = time.perf_counter()
    return len(turns) * EVENTS_PER_TURN / (t1 - t0)


async def append_at_once(logs: Sequence[SessionLog], turns: Sequence[Turn]) -> float:
    """Events per second: every log appending `turns` at once, one ``flush`` per turn."""

    async def one(log: SessionLog) -> None:
        for events in turns:
            for event in events:
                log.append(event)
            await log.flush()

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for log in logs:
            nursery.start_soon(one, log)
    t1 = time.perf_counter()
    return len(logs) * len(turns) * EVENTS_PER_TURN / (t1 - t0)


async def _concurrent_append(root: Path, sessions: int, turns: Sequence[Turn]) -> float:
    """Events per second: `sessions` SQLite logs (``sync="always"``) flushing turns at once."""
    persistence = SqlitePersistence(root / "sessions.db", sync="always")
    logs = [
        await persistence.create(msgspec.structs.replace(_header(), id=f"s{i}"))
        for i in range(sessions)
    ]
    rate = await append_at_once(logs, turns)
    for log in logs:
        await log.close()
    persistence.close()
    return rate


async def _turn_cost(persistence: Persistence | None, m: int) -> float:
    """Microseconds per one-step text turn of one agent, with or without persistence."""
    async with open_runtime(model=ScriptedModel(delay=0), persistence=persistence) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        t1 = time.perf_counter()
    return (t1 - t0) / m * 1e6


# -- (c) Python calls, counted ---------------------------------------------------------------


def _counted(measure: Callable[[Path, int], Awaitable[float]], m: int) -> float:
    """Python calls per op of `measure` (on the agent's thread: `bench.counting`), each run
    in a fresh temporary directory."""

    async def variant(size: int) -> float:
        with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
            return await measure(Path(tmp), size)

    return profile(variant, m).calls


def _append_calls(m: int) -> dict[str, float]:
    """Python calls per turn appended (10 events, one flush), ours and the floors'."""
    turns = _turns(2 * m)  # made before the count: runs of m and 2m turns take slices

    async def ours(root: Path, size: int, backend: str) -> float:
        return await _log_append(root, backend, "turn", turns[:size])

    async def raw_write(root: Path, size: int) -> float:
        return _raw_write_then_fsync(root, turns[:size])

    async def raw_sqlite(root: Path, size: int) -> float:
        return _raw_sqlite_fenced(root, turns[:size], synced=True)

    return {
        "jsonl": _counted(partial(ours, backend="jsonl"), m),
        "sqlite": _counted(partial(ours, backend="sqlite"), m),
        "raw write": _counted(raw_write, m),
        "raw sqlite": _counted(raw_sqlite, m),
    }


def _turn_calls(m: int) -> dict[str, float]:
    """Python calls per one-step turn, with JSONL persistence (each policy) and without."""

    async def turns(root: Path, size: int, sync: SyncPolicy | None) -> float:
        persistence = None if sync is None else JsonlPersistence(root, sync=sync)
        return await _turn_cost(persistence, size)

    return {
        "off": _counted(partial(turns, sync=None), m),
        "os": _counted(partial(turns, sync="os"), m),
        "turn": _counted(partial(turns, sync="turn"), m),
    }


def _instruction_rows(quick: bool) -> list[Row]:
    """Instructions per op under callgrind (`bench.counting.instructions`): the one-step
    turn with JSONL under ``sync="os"`` against it without persistence, and a SQLite turn
    appended under ``sync="os"`` against the fenced floor. Only the SQLite one runs work on
    another thread (the writer's checkpoint), so the others hold from run to run;
    callgrind takes minutes, so a quick run skips them."""
    rows = (
        (
            "one-step turn, JSONL persistence on, sync=os",
            "turn-os",
            "turn-off",
            200,
            "the same turn, persistence off",
        ),
        (
            "turn appended, SQLite, sync=os",
            "append-sqlite-os",
            "append-sqlite-floor",
            300,
            "a fenced sqlite3 row per turn, no fsync",
        ),
    )
    measured: list[Row] = []
    for what, ours, floor, m, baseline in rows:
        metric = f"instructions per {what}, callgrind (M={m})"
        if quick:
            measured.append(skipped(SCENARIO, metric, "instructions", "skipped: --quick"))
            continue
        counts = [instructions("bench._persist_child", v, m) for v in (ours, floor)]
        if counts[0] is None or counts[1] is None:
            measured.append(skipped(SCENARIO, metric, "instructions", NO_VALGRIND))
            continue
        measured.append(
            compare(
                SCENARIO, metric, "instructions", [counts[0]], baseline=baseline, raw=[counts[1]]
            )
        )
    return measured


def _in_tempdir(measure: Callable[[Path], float]) -> float:
    """Run `measure` in a fresh temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        return measure(Path(tmp))


# -- (b) resume ---------------------------------------------------------------------------------


def _raw_resume(jsonl: str, n: int) -> float:
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
    """Milliseconds for ``JsonlPersistence(root).open(id)`` (held, loaded, repaired), closed."""
    t0 = time.perf_counter()
    header, events, log = await JsonlPersistence(root).open(SESSION_ID)
    t1 = time.perf_counter()
    await log.close()
    if header.id != SESSION_ID or len(events) != n:
        raise RuntimeError(f"JSONL open: expected {n} events, got {len(events)}")
    return (t1 - t0) * 1e3


async def _sqlite_resume(db: Path, n: int) -> float:
    """Milliseconds for ``SqlitePersistence(db).open(id)``, opening the database included."""
    t0 = time.perf_counter()
    persistence = SqlitePersistence(db)
    try:
        header, events, log = await persistence.open(SESSION_ID)
        t1 = time.perf_counter()
        await log.close()
    finally:
        persistence.close()
    if header.id != SESSION_ID or len(events) != n:
        raise RuntimeError(f"SQLite open: expected {n} events, got {len(events)}")
    return (t1 - t0) * 1e3


async def _fill_sqlite(db: Path, turns: Sequence[Turn]) -> None:
    """Store the session through a live log, ``_FILL_BATCH`` events per transaction."""
    persistence = SqlitePersistence(db, sync="os")
    try:
        log = await persistence.create(_header())
        for number, event in enumerate(event for turn in turns for event in turn):
            log.append(event)
            if number % _FILL_BATCH == _FILL_BATCH - 1:
                await log.write_ahead()
        await log.close()
    finally:
        persistence.close()


def _fill_jsonl(root: Path, turns: Sequence[Turn]) -> str:
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
    t = 200 if quick else 1_000  # turns appended, one flush each
    n = 8_000 if quick else 100_000  # events of the session to resume (whole turns)
    m = 500 if quick else 2_000  # one-step turns through an agent
    sessions = 10

    append_turns = _turns(t)
    group_turns = _turns(t // 5)
    rates: dict[str, list[float]] = {}
    variants: dict[str, Callable[[Path], float]] = {
        "raw fsync": lambda root: _raw_append(root, append_turns, fsync=True),
        "raw write": lambda root: _raw_append(root, append_turns, fsync=False),
        "raw write, one fsync": lambda root: _raw_write_then_fsync(root, append_turns),
        "raw fsync, thread": lambda root: trio.run(_raw_append_threaded, root, append_turns),
        "sqlite3 FULL, thread": lambda root: trio.run(_raw_sqlite_threaded, root, append_turns),
        "sqlite3 FULL": lambda root: _raw_sqlite(root, append_turns, synchronous="FULL"),
        "sqlite3 NORMAL": lambda root: _raw_sqlite(root, append_turns, synchronous="NORMAL"),
        "sqlite3 NORMAL, fenced": lambda root: _raw_sqlite_fenced(root, append_turns, synced=False),
        "sqlite3 NORMAL, fenced, WAL fsync/turn": lambda root: _raw_sqlite_fenced(
            root, append_turns, synced=True
        ),
        "one session": lambda root: trio.run(_concurrent_append, root, 1, group_turns),
        "ten sessions": lambda root: trio.run(_concurrent_append, root, sessions, group_turns),
    }
    for backend in ("jsonl", "sqlite"):
        for sync in ("always", "turn"):
            variants[f"{backend} {sync}"] = partial(
                lambda root, b, y: trio.run(_log_append, root, b, y, append_turns),
                b=backend,
                y=sync,
            )
    turn_costs: dict[str, list[float]] = {"off": [], "on": [], "os": []}

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
            for name, variant in variants.items():
                gc.collect()
                rates.setdefault(name, []).append(_in_tempdir(variant))
            gc.collect()
            turn_costs["off"].append(trio.run(_turn_cost, None, m))
            gc.collect()
            turn_costs["on"].append(
                _in_tempdir(lambda root: trio.run(_turn_cost, JsonlPersistence(root), m))
            )
            gc.collect()
            turn_costs["os"].append(
                _in_tempdir(lambda root: trio.run(_turn_cost, JsonlPersistence(root, sync="os"), m))
            )
            gc.collect()
            resumes["raw"].append(_raw_resume(jsonl, n))
            gc.collect()
            resumes["jsonl"].append(trio.run(_jsonl_resume, root, n))
            gc.collect()
            resumes["sqlite"].append(trio.run(_sqlite_resume, db, n))

    rows = []
    for backend in ("jsonl", "sqlite"):
        name = "JSONL" if backend == "jsonl" else "SQLite"
        rows.append(
            compare(
                SCENARIO,
                f"durable append, {name}, sync=always, 1 flush/turn (T={t})",
                "events/s",
                rates[f"{backend} always"],
                baseline="os.write+fsync per turn",
                raw=rates["raw fsync"],
                min_ratio=0.7,
            )
        )
        rows.append(
            compare(
                SCENARIO,
                f"append, {name}, sync=turn (default), 1 flush/turn (T={t})",
                "events/s",
                rates[f"{backend} turn"],
                baseline="os.write per turn, no fsync",
                raw=rates["raw write"],
                min_ratio=0.7,
            )
        )
    bare = "the floor: the same OS or SQLite calls, no fence, no thread, no Trio"
    hop = "the floor of the guarantee: the same calls, the wait off the event loop"
    floors = [
        ("JSONL", "always", "raw fsync, thread", "os.write + fdatasync in to_thread", hop),
        ("JSONL", "turn", "raw write, one fsync", "os.write per turn, one fsync at the end", bare),
        ("SQLite", "always", "sqlite3 FULL", "sqlite3 row per turn, synchronous=FULL", bare),
        ("SQLite", "always", "sqlite3 FULL, thread", "sqlite3 FULL commit in to_thread", hop),
        ("SQLite", "turn", "sqlite3 NORMAL", "sqlite3 row per turn, synchronous=NORMAL", bare),
        (
            "SQLite",
            "turn",
            "sqlite3 NORMAL, fenced",
            "the same, each row's transaction fenced (the epoch and next seq UPDATE)",
            "the floor of one live writer per session: the fence every append checks in its"
            " own transaction (docs/semantics.md); no fsync, no thread, no Trio",
        ),
        (
            "SQLite",
            "turn",
            "sqlite3 NORMAL, fenced, WAL fsync/turn",
            "the same, fenced, and an fdatasync of the WAL per turn in a thread",
            "the floor of sync=turn's guarantees: the fence, and every turn durable soon"
            " after its end (one WAL fdatasync per turn off the loop, coalescing)",
        ),
    ]
    for name, sync, floor, baseline, note in floors:
        rows.append(
            compare(
                SCENARIO,
                f"append, {name}, sync={sync}, against its floor (T={t}): {baseline}",
                "events/s",
                rates[f"{name.lower()} {sync}"],
                baseline=baseline,
                raw=rates[floor],
                note=note,
            )
        )
    counted = 300 if quick else 1_000  # the counts do not vary; the profiler slows each op
    appended, turned = _append_calls(counted), _turn_calls(counted)
    rows += [
        compare(
            SCENARIO,
            f"Python calls per turn appended, {name}, sync=turn, counted (T={counted})",
            "calls",
            [appended[backend]],
            note=f"on the agent's thread (a writer thread's are not counted): 10 appends and"
            f" one flush; its floor ({floor}) makes {appended[raw]:.1f}",
        )
        for name, backend, raw, floor in (
            ("JSONL", "jsonl", "raw write", "os.write per turn"),
            ("SQLite", "sqlite", "raw sqlite", "a fenced row per turn, a WAL fsync thread"),
        )
    ]
    rows += _instruction_rows(quick)
    from bench import sessions_pg

    return [
        *rows,
        *sessions_pg.run(repeats, group_turns, n),
        compare(
            SCENARIO,
            f"group commit, SQLite, sync=always, {sessions} sessions at once (T={t // 5} each)",
            "events/s",
            rates["ten sessions"],
            baseline="one session alone",
            raw=rates["one session"],
            min_ratio=4.0,
        ),
        compare(
            SCENARIO,
            f"one-step turn, JSONL persistence on, sync=turn (M={m})",
            "us",
            turn_costs["on"],
            baseline="the same turn, persistence off",
            raw=turn_costs["off"],
            max_ratio=1.3,
        ),
        compare(
            SCENARIO,
            f"one-step turn, JSONL persistence on, sync=os: the write-ahead alone (M={m})",
            "us",
            turn_costs["os"],
            baseline="the same turn, persistence off",
            raw=turn_costs["off"],
            note="the floor of write-ahead: the turn's events encoded once and written to the"
            " OS at its two write-ahead points (before the model call, at its end: two"
            " os.write, each a page-cache copy), no fsync",
        ),
        compare(
            SCENARIO,
            f"one-step turn, JSONL persistence on, sync=turn against sync=os (M={m})",
            "us",
            turn_costs["on"],
            baseline="the same turn, sync=os (the write-ahead alone)",
            raw=turn_costs["os"],
            note="what sync=turn's fsync adds to the agent's thread though it runs on the"
            " writer's: the wake-ups and GIL hand-offs of one fdatasync per 2 ms of turn ends,"
            " and the file's writes waiting while the journal commits its inode",
        ),
        compare(
            SCENARIO,
            f"Python calls per one-step turn, JSONL persistence on, sync=turn (M={counted})",
            "calls",
            [turned["turn"]],
            baseline="the same turn, persistence off",
            raw=[turned["off"]],
            note=f"{turned['turn'] - turned['off']:+.1f} calls per turn, on the agent's thread;"
            f" sync=os (the write-ahead alone, no fsync): {turned['os'] - turned['off']:+.1f}",
        ),
        compare(
            SCENARIO,
            f"resume, JSONL open (N={n})",
            "ms",
            resumes["jsonl"],
            baseline="read + decode_lines",
            raw=resumes["raw"],
            max_ratio=2.0,
        ),
        compare(
            SCENARIO,
            f"resume, SQLite open (N={n}, the database opened too)",
            "ms",
            resumes["sqlite"],
            baseline="read + decode_lines",
            raw=resumes["raw"],
            max_ratio=2.0,
        ),
    ]
