"""One live writer per session, across processes: real subprocesses, real files.

A second process's create or resume of a live session is refused with
`SessionLocked` naming the holder; once the holder is gone, by a clean exit
or a SIGKILL, the session can be taken live again, and its log never holds
a duplicate or a missing seq. Over ACP too. And the SQLite fence holds even
when the lock is bypassed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TypeVar

import msgspec
import psycopg
import pytest
import trio

from greenroom import open_runtime
from greenroom.models import ScriptedModel
from greenroom.protocol.events import (
    COMPLETED,
    USER,
    MessageTrigger,
    SessionEvent,
    SessionHeader,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.session.persistence import (
    Holder,
    JsonlPersistence,
    LeaseLost,
    Persistence,
    SessionLocked,
    SqlitePersistence,
)
from greenroom.session.persistence.lock import SessionLock
from greenroom.session.persistence.postgres import PostgresPersistence
from tests import TESTS
from tests.acp_process import acp_process
from tests.agents_helpers import assert_enclosed

E = TypeVar("E", bound=SessionEvent)
CHILD = TESTS / "hold_child.py"
LIMIT = 30


def _store(backend: str, tmp_path: Path) -> Persistence:
    if backend == "jsonl":
        return JsonlPersistence(tmp_path / "sessions")
    return SqlitePersistence(tmp_path / "sessions.sqlite")


def _path(backend: str, tmp_path: Path) -> Path:
    return tmp_path / ("sessions" if backend == "jsonl" else "sessions.sqlite")


async def _holder(backend: str, tmp_path: Path) -> tuple[trio.Process, int]:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(CHILD), backend, str(_path(backend, tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        chunk = await process.stdout.receive_some()
        assert chunk, "the holder died before it held the session"
        line += chunk
    word, pid = line.decode().split()
    assert word == "held"
    return process, int(pid)


async def _refused(backend: str, tmp_path: Path, pid: int) -> None:
    async with open_runtime(persistence=_store(backend, tmp_path)) as rt:
        for attempt in (rt.agents.resume, rt.agents.create):
            with pytest.raises(SessionLocked) as refused:
                await attempt(agent_id="b", session_id="s")
            assert refused.value.holder is not None
            assert refused.value.holder.pid == pid
            assert refused.value.holder.host == socket.gethostname()
            assert f"live in pid {pid} on host" in str(refused.value)
        assert rt.agents.list() == []


async def _taken_over(backend: str, tmp_path: Path) -> None:
    async with open_runtime(
        model=ScriptedModel(delay=0), persistence=_store(backend, tmp_path)
    ) as rt:
        handle = await rt.agents.resume(agent_id="b", session_id="s")
        handle.agent.send("from the parent")
        await handle.agent.when_idle()
        await handle.dispose()


@pytest.mark.real_clock
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
async def test_a_second_process_is_refused_until_the_holder_is_gone(
    backend: str, tmp_path: Path
) -> None:
    with trio.fail_after(LIMIT):
        for ending in ("clean exit", "sigkill"):
            process, pid = await _holder(backend, tmp_path)
            await _refused(backend, tmp_path, pid)
            if ending == "clean exit":
                assert process.stdin is not None
                await process.stdin.aclose()
                assert await process.wait() == 0
            else:
                process.send_signal(signal.SIGKILL)
                await process.wait()
            await _taken_over(backend, tmp_path)
    _, events = await _store(backend, tmp_path).load("s")
    assert_enclosed(events)  # seqs 0, 1, 2, ... with none twice, none missing
    senders = [e.content for e in events if isinstance(e, UserMessage)]
    assert len(senders) == 4
    assert senders[1] == senders[3] == "from the parent"


@pytest.mark.real_clock
async def test_a_second_greenroom_acp_cannot_load_a_live_session(tmp_path: Path) -> None:
    work = str(tmp_path)
    with trio.fail_after(LIMIT):
        async with acp_process(tmp_path, "--model", "scripted:0") as first:
            session = await first.new_session(work)
            assert (await first.prompt(session, "hello"))["result"] == {"stopReason": "end_turn"}
            async with acp_process(tmp_path, "--model", "scripted:0") as second:
                load = {"sessionId": session, "cwd": work, "mcpServers": []}
                refused = await second.call("session/load", load)
                message = refused["error"]["message"]
                assert f"live in pid {first.process.pid} on host" in message
                assert await first.close() == 0
                loaded = await second.call("session/load", load)
                assert loaded["result"]["modes"]["currentModeId"] == "default"
                answer = await second.prompt(session, "again")
                assert answer["result"] == {"stopReason": "end_turn"}
                assert await second.close() == 0
    _, events = await JsonlPersistence(tmp_path / "sessions").load(session)
    assert_enclosed(events)
    assert [e.turn for e in events if isinstance(e, TurnEnd)] == [1, 2]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_the_epoch_fences_a_holder_whose_exclusion_was_bypassed(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """Whatever let a second holder in (SQLite: its lock file removed; PostgreSQL: a
    pause past the lease's ttl), the first writes nothing more: `LeaseLost`."""
    if kind == "sqlite":
        db = tmp_path / "sessions.sqlite"
        first, second = SqlitePersistence(db), SqlitePersistence(db)
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        first, second = PostgresPersistence(dsn), PostgresPersistence(dsn)
    try:
        with trio.fail_after(60):
            await (await first.create(SessionHeader(id="s", created_at=1))).close()
            _, _, old = await first.open("s")
            with pytest.raises(SessionLocked):
                await second.open("s")
            if kind == "sqlite":
                for lock in (tmp_path / "sessions.sqlite.locks").iterdir():
                    lock.unlink()  # it no longer excludes anyone
            else:
                with psycopg.connect(dsn, autocommit=True) as pg:
                    pg.execute("UPDATE greenroom_sessions SET lease_until = now() - interval '1 s'")
            _, _, new = await second.open("s")
            old.append(_at(0, TurnStart(turn=1, trigger=MessageTrigger(USER))))
            with pytest.raises(LeaseLost, match="session 's' was taken over"):
                await old.write_ahead()
            written = [
                _at(0, TurnStart(turn=1, trigger=MessageTrigger(USER))),
                _at(1, TurnEnd(turn=1, reason=COMPLETED)),
            ]
            for event in written:
                new.append(event)
            await new.flush()
            await new.close()
            await old.close()  # nothing more is written; the lost lease was reported already
            _, stored = await first.load("s")
    finally:
        first.close()
        second.close()
    assert stored == written


def _at(seq: int, event: E) -> E:
    return msgspec.structs.replace(event, seq=seq)


def _race(path: str) -> tuple[SessionLock, SessionLocked]:
    """Two threads take `path` at once: the lock one got, and the other's refusal."""
    start = threading.Barrier(2)
    outcomes: list[SessionLock | SessionLocked] = []

    def take() -> None:
        start.wait()
        try:
            outcomes.append(SessionLock.acquire(path, "s"))
        except SessionLocked as exc:
            outcomes.append(exc)

    takers = [threading.Thread(target=take) for _ in range(2)]
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join(10)
    (held,) = [o for o in outcomes if isinstance(o, SessionLock)]
    (refused,) = [o for o in outcomes if isinstance(o, SessionLocked)]
    return held, refused


@pytest.mark.parametrize("left", [False, True], ids=["fresh", "a-dead-holders-file"])
def test_a_refusal_always_names_the_holder_however_the_race_falls(
    tmp_path: Path, left: bool
) -> None:
    """Two takers racing for one session: the winner locks the file, then writes its name;
    the loser, refused in between, read an empty file (15 of 40 races named no holder),
    or, in a file a dead holder left, that dead holder's name."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    me = Holder(os.getpid(), socket.gethostname())
    path = tmp_path / "s.lock"
    for _ in range(200):
        if left:  # its pid runs no more (reaped); its start time is not that of any process
            record = {"pid": int(dead.stdout), "host": me.host, "start": 1, "owner": "gone"}
            path.write_bytes(msgspec.json.encode(record))
        held, refused = _race(str(path))
        assert refused.holder == me, str(refused)
        assert f"pid {me.pid} on host {me.host}" in str(refused)
        held.release()
