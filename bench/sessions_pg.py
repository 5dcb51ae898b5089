"""Sessions on PostgreSQL, against a throwaway server started for the run (the suite's own,
``tests/pg_server.py``); every ratio is against raw psycopg on the same server.

* concurrent append: 10 `PostgresPersistence` logs (default ``sync="turn"``) each
  appending T turns of 10 events with one ``flush`` per turn, all at once, in events per
  second, against raw psycopg storing the same rows (one ``lines`` row per turn and the
  ``next_seq`` update, one transaction per turn per session, ``synchronous_commit=off``);
  and the group-commit gain: the same 10 sessions against one session alone;
* resume: ``open`` of a session of N events against a raw ``SELECT lines ... ORDER BY``
  and one ``decode_lines``, in milliseconds;
* take-over: seconds from the SIGKILL of a process holding a session to another
  persistence's successful ``open`` of it.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import msgspec
import psycopg
import trio

from bench.report import Row, compare, skipped
from bench.sessions import append_at_once
from greenroom.protocol.events import SessionEvent, SessionHeader
from greenroom.session.persistence import SessionLocked
from greenroom.session.persistence.postgres import PostgresPersistence

SCENARIO = "sessions"
Turn = list[SessionEvent]
_HOLD_CHILD = Path(__file__).parent.parent / "tests" / "hold_child.py"


async def _concurrent(dsn: str, sessions: int, turns: Sequence[Turn], tag: str) -> float:
    persistence = PostgresPersistence(dsn)
    try:
        logs = [
            await persistence.create(SessionHeader(id=f"{tag}-{i}", created_at=1))
            for i in range(sessions)
        ]
        rate = await append_at_once(logs, turns)
        for log in logs:
            await log.close()
    finally:
        persistence.close()
    return rate


def _raw_concurrent(dsn: str, sessions: int, turns: Sequence[Turn], tag: str) -> float:
    encoder = msgspec.json.Encoder()
    with psycopg.connect(dsn, autocommit=True) as db:
        for i in range(sessions):
            db.execute(
                "INSERT INTO greenroom_sessions (id, header) VALUES (%s, %s)",
                (f"{tag}-{i}", b"{}"),
            )
        t0 = time.perf_counter()
        for events in turns:
            first, after = events[0].seq, events[-1].seq + 1
            for i in range(sessions):
                with db.transaction():
                    db.execute("SET LOCAL synchronous_commit = off")
                    db.execute(
                        "UPDATE greenroom_sessions SET next_seq = %s WHERE id = %s",
                        (after, f"{tag}-{i}"),
                    )
                    db.execute(
                        "INSERT INTO greenroom_batches VALUES (%s, %s, %s, %s)",
                        (f"{tag}-{i}", first, after, encoder.encode_lines(events)),
                    )
        t1 = time.perf_counter()
    return sessions * len(turns) * len(turns[0]) / (t1 - t0)


async def _fill(dsn: str, turns: Sequence[Turn]) -> None:
    persistence = PostgresPersistence(dsn, sync="os")
    try:
        log = await persistence.create(SessionHeader(id="resume", created_at=1))
        for number, event in enumerate(e for turn in turns for e in turn):
            log.append(event)
            if number % 1_000 == 999:
                await log.write_ahead()
        await log.close()
    finally:
        persistence.close()


async def _resume(dsn: str, n: int) -> float:
    persistence = PostgresPersistence(dsn)
    try:
        t0 = time.perf_counter()
        _, events, log = await persistence.open("resume")
        t1 = time.perf_counter()
        await log.close()
    finally:
        persistence.close()
    if len(events) != n:
        raise RuntimeError(f"PostgreSQL open: expected {n} events, got {len(events)}")
    return (t1 - t0) * 1e3


def _raw_resume(dsn: str, n: int) -> float:
    decoder = msgspec.json.Decoder(SessionEvent)
    with psycopg.connect(dsn) as db:
        t0 = time.perf_counter()
        rows = db.execute(
            "SELECT lines FROM greenroom_batches WHERE session_id = %s ORDER BY first_seq",
            ("resume",),
        ).fetchall()
        events = decoder.decode_lines(b"".join(r[0] for r in rows))
        t1 = time.perf_counter()
    if len(events) != n:
        raise RuntimeError(f"raw resume: expected {n} events, got {len(events)}")
    return (t1 - t0) * 1e3


def _takeover(dsn: str) -> float:
    """Seconds from the SIGKILL of a holder of session ``s`` to an ``open`` of it elsewhere."""
    child = subprocess.Popen(
        [sys.executable, str(_HOLD_CHILD), "postgres", dsn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(_HOLD_CHILD.parent.parent)},
    )
    assert child.stdout is not None
    if not child.stdout.readline().startswith(b"held"):
        raise RuntimeError("the holder died before it held the session")

    async def take() -> float:
        persistence = PostgresPersistence(dsn)
        try:
            child.send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            while True:
                try:
                    _, _, log = await persistence.open("s")
                    break
                except SessionLocked:
                    await trio.sleep(0.01)
            taken = time.perf_counter() - killed
            await log.close()
        finally:
            persistence.close()
        return taken

    try:
        return trio.run(take)
    finally:
        child.kill()
        child.wait()


def run(repeats: int, turns: list[Turn], n: int) -> list[Row]:
    """The PostgreSQL rows; `turns` are appended per session, `n` events are resumed."""
    sys.path.insert(0, str(_HOLD_CHILD.parent.parent))
    from tests.pg_server import PgServer

    try:
        server = PgServer().start()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        reason = f"no PostgreSQL server could be started: {exc}"
        return [
            skipped(SCENARIO, "PostgreSQL, 10 sessions at once", "events/s", reason),
            skipped(SCENARIO, "resume, PostgreSQL open", "ms", reason),
        ]
    sessions = 10
    results: dict[str, list[float]] = {}
    try:
        dsn = server.dsn
        PostgresPersistence(dsn).close()  # the schema
        resume_turns = [
            [msgspec.structs.replace(e, seq=t * len(turns[0]) + i) for i, e in enumerate(turn)]
            for t, turn in enumerate(turns * (n // (len(turns) * len(turns[0]))))
        ]
        trio.run(_fill, dsn, resume_turns)
        for r in range(repeats):
            for name, measure in (
                ("raw", partial(_raw_concurrent, dsn, sessions, turns, f"raw{r}")),
                ("ten", partial(trio.run, _concurrent, dsn, sessions, turns, f"ten{r}")),
                ("one", partial(trio.run, _concurrent, dsn, 1, turns, f"one{r}")),
                ("raw resume", partial(_raw_resume, dsn, n)),
                ("resume", partial(trio.run, _resume, dsn, n)),
                ("takeover", partial(_takeover, dsn)),
            ):
                gc.collect()
                results.setdefault(name, []).append(measure())
    finally:
        server.remove()
    t = len(turns)
    return [
        compare(
            SCENARIO,
            f"append, PostgreSQL, sync=turn, {sessions} sessions at once, 1 flush/turn (T={t})",
            "events/s",
            results["ten"],
            baseline="raw psycopg, 1 transaction per turn per session",
            raw=results["raw"],
            min_ratio=0.7,
        ),
        compare(
            SCENARIO,
            f"group commit, PostgreSQL, sync=turn, {sessions} sessions at once (T={t} each)",
            "events/s",
            results["ten"],
            baseline="one session alone",
            raw=results["one"],
        ),
        compare(
            SCENARIO,
            f"resume, PostgreSQL open (N={n})",
            "ms",
            results["resume"],
            baseline="raw SELECT + decode_lines",
            raw=results["raw resume"],
            max_ratio=2.0,
        ),
        compare(
            SCENARIO,
            "lease take-over after SIGKILL of the holder (PostgreSQL)",
            "s",
            results["takeover"],
        ),
    ]
