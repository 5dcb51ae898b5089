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
  persistence's successful ``open`` of it;
* hand-off: milliseconds from ``resume(..., take_over="ask")`` of an idle session held by
  another node (a runtime of its own, in this process) to the new holder's first append,
  against a ``resume`` of the same session held by nobody;
* resume and continue: ``resume(..., interrupted="continue")`` of a log cut in a model
  step (as a SIGKILL leaves it: written so here) until its turn's answer, against a plain
  ``resume`` of the same log plus one turn of one step.
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
from greenroom import open_runtime
from greenroom.models import ScriptedModel
from greenroom.protocol.events import (
    USER,
    MessageTrigger,
    SessionEvent,
    SessionHeader,
    StepStart,
    TurnStart,
    UserMessage,
)
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


async def _hand_off(dsn: str, tag: str) -> tuple[float, float]:
    """Milliseconds: the hand-off of an idle session from node a to node b, to b's first
    append; and a resume by b of a session nobody holds, to its first append."""
    a = PostgresPersistence(dsn, node=f"a-{tag}")
    b = PostgresPersistence(dsn, node=f"b-{tag}")
    model = ScriptedModel(delay=0)
    try:
        async with (
            open_runtime(model=model, persistence=a) as rt_a,
            open_runtime(model=model, persistence=b) as rt_b,
        ):
            for session in (f"held-{tag}", f"free-{tag}"):
                handle = await rt_a.agents.create(agent_id=session, session_id=session)
                await handle.agent.run("a turn on node a")
            await handle.dispose()  # the free one: nobody holds it
            await b.releases.start()  # as any node does at its first session: not timed
            t0 = time.perf_counter()
            free = await rt_b.agents.resume(agent_id="free", session_id=f"free-{tag}")
            free.agent.inject("b was here")
            t1 = time.perf_counter()
            held = await rt_b.agents.resume(
                agent_id="held", session_id=f"held-{tag}", take_over="ask", wait=10
            )
            held.agent.inject("b was here")
            t2 = time.perf_counter()
    finally:
        a.close()
        b.close()
    return (t2 - t1) * 1e3, (t1 - t0) * 1e3


async def _continue(dsn: str, tag: str) -> tuple[float, float]:
    """Milliseconds: resume-and-continue of a turn cut in its model step, to its answer;
    and a plain resume of the same log plus a one-step turn."""
    store = PostgresPersistence(dsn)
    cut: list[SessionEvent] = [
        TurnStart(turn=1, trigger=MessageTrigger(USER)),
        UserMessage(content="carry this on", source=USER, message_id="m-1"),
        StepStart(turn=1, step=1),
    ]
    try:
        for session in (f"go-{tag}", f"plain-{tag}"):
            log = await store.create(SessionHeader(id=session, created_at=1))
            for seq, event in enumerate(cut):
                log.append(msgspec.structs.replace(event, seq=seq))
            await log.close()
        async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
            t0 = time.perf_counter()
            handle = await rt.agents.resume(
                agent_id="go", session_id=f"go-{tag}", interrupted="continue"
            )
            assert handle.resumed is not None
            if (await handle.resumed).stop_reason != "completed":
                raise RuntimeError("the continued turn did not complete")
            t1 = time.perf_counter()
            plain = await rt.agents.resume(agent_id="plain", session_id=f"plain-{tag}")
            await plain.agent.run("carry this on")
            t2 = time.perf_counter()
    finally:
        store.close()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


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
            skipped(SCENARIO, "hand-off of an idle session between two nodes", "ms", reason),
            skipped(SCENARIO, "resume and continue a cut turn (PostgreSQL)", "ms", reason),
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
            for names, pair in (
                (("hand-off", "free resume"), partial(trio.run, _hand_off, dsn, f"r{r}")),
                (("continue", "plain resume"), partial(trio.run, _continue, dsn, f"r{r}")),
            ):
                gc.collect()
                for name, value in zip(names, pair(), strict=True):
                    results.setdefault(name, []).append(value)
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
        compare(
            SCENARIO,
            "hand-off of an idle session between two nodes, request to first append",
            "ms",
            results["hand-off"],
            baseline="resume of a session nobody holds, to its first append",
            raw=results["free resume"],
            max_value=50.0,
        ),
        compare(
            SCENARIO,
            "resume and continue a turn cut in its model step (PostgreSQL), to its answer",
            "ms",
            results["continue"],
            baseline="plain resume of the same log + a one-step turn",
            raw=results["plain resume"],
            max_ratio=2.0,
        ),
    ]
