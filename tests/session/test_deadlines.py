"""No teardown waits forever: every store operation has a deadline, and teardowns run at once.

A hung fsync (a test double of the OS call that blocks until the test lets it go) must not
hang `dispose`; a writer's job past its deadline is settled as failed on the Trio side
while its worker thread stays stuck; `greenroom acp` with several sessions whose MCP
servers ignore SIGTERM exits within one grace, not one per session.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import acp
import pytest
import trio
from acp import schema

from greenroom import open_runtime
from greenroom.acp.connection import TEARDOWN_GRACE
from greenroom.models import ScriptedModel
from greenroom.models.scripted import Hang
from greenroom.protocol.events import (
    USER,
    Completed,
    Errored,
    Interrupted,
    MessageTrigger,
    SessionHeader,
    TurnEnd,
    TurnStart,
)
from greenroom.session import new_header
from greenroom.session.persistence import (
    DEADLINE,
    JsonlPersistence,
    OperationTimeout,
    PersistenceError,
    SqlitePersistence,
)
from greenroom.session.persistence import jsonl as jsonl_module
from greenroom.session.persistence.urls import StoreError, store_from_url
from greenroom.session.persistence.writer import Job, Writer
from greenroom.supervisor import ChildSpec, Supervisor, cleanup_scope
from tests.acp_process import acp_process
from tests.tools.test_mcp import SERVERS, alive, pids

LIMIT = 60.0


# -- the writer's deadline ------------------------------------------------------------------


class _Gate:
    """A worker that blocks in its batch until `open` (a stuck fsync, a silent server)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.ran: list[Job] = []

    def work(self, batch: Sequence[Job]) -> None:
        self.ran.extend(batch)
        self.entered.set()
        self.gate.wait(timeout=LIMIT)

    def open(self) -> None:
        self.gate.set()


@pytest.fixture
def gate() -> Iterator[_Gate]:
    stuck = _Gate()
    try:
        yield stuck
    finally:
        stuck.open()  # the abandoned thread finishes, whatever the test did


@pytest.mark.real_clock
async def test_a_job_past_its_deadline_fails_on_the_trio_side_and_the_writer_is_stuck(
    gate: _Gate,
) -> None:
    writer: Writer[Job] = Writer(gate.work, deadline=0.3, where="the test store")
    first = Job()
    writer.submit(first)
    await trio.to_thread.run_sync(gate.entered.wait)
    queued = Job()
    writer.submit(queued)  # behind the stuck batch
    began = time.monotonic()
    with trio.fail_after(5):
        await first.wait()
    assert 0.25 <= time.monotonic() - began < 2
    assert isinstance(first.error, OperationTimeout)
    assert str(first.error) == "the test store: no answer within 0.3 s"
    assert writer.stuck
    with trio.fail_after(5):
        await queued.wait()
    assert isinstance(queued.error, OperationTimeout)
    # While stuck, a new job fails at once instead of queuing behind the stuck one.
    late = Job()
    writer.submit(late)
    assert late.settled
    assert isinstance(late.error, OperationTimeout)
    assert "still running past its deadline" in str(late.error)
    gate.open()
    await trio.to_thread.run_sync(_until, lambda: not writer.stuck)
    assert gate.ran == [first]  # the job given up on before it began never ran
    again = Job()
    writer.submit(again)
    with trio.fail_after(5):
        await again.wait()
    assert again.error is None
    assert gate.ran == [first, again]


@pytest.mark.real_clock
async def test_a_job_past_its_deadline_queued_behind_an_unwatched_one_makes_the_writer_stuck(
    gate: _Gate,
) -> None:
    """A batch nobody waits for (a turn's sync) can hang: the first job queued behind it
    that passes its deadline makes the writer stuck, so the next fails at once."""
    writer: Writer[Job] = Writer(gate.work, deadline=0.3)
    writer.submit(Job())  # nobody waits for it
    await trio.to_thread.run_sync(gate.entered.wait)
    queued = Job()
    writer.submit(queued)
    with trio.fail_after(5):
        await queued.wait()
    assert isinstance(queued.error, OperationTimeout)
    assert writer.stuck
    late = Job()
    writer.submit(late)
    assert late.settled
    assert "still running past its deadline" in str(late.error)


@pytest.mark.real_clock
async def test_a_deadline_seen_after_its_batch_returned_leaves_the_writer_going() -> None:
    """On a loaded machine the Trio side can see a job's deadline pass after its batch
    returned, before the batch's settling reaches it: the job fails, and the writer goes
    on (it stayed stuck for good when that happened while the worker gathered its next
    batch, and every later job failed "still running past its deadline")."""
    returned = threading.Event()
    ran: list[Job] = []

    def work(batch: Sequence[Job]) -> None:
        ran.extend(batch)
        returned.set()

    writer: Writer[Job] = Writer(work, deadline=LIMIT, gather=2.0)
    first = Job()
    writer.submit(first)
    # No checkpoint until the abandon: the batch's settling waits for this task, and the
    # worker, its batch returned, gathers for its next one meanwhile.
    returned.wait(timeout=LIMIT)
    time.sleep(0.05)  # noqa: ASYNC251 (blocking on purpose: no checkpoint before the abandon)
    writer.abandon(first)  # the deadline, seen before the settling
    assert isinstance(first.error, OperationTimeout)
    assert not writer.stuck
    again = Job()
    writer.submit(again)
    with trio.fail_after(5):
        await again.wait()
    assert again.error is None
    assert ran == [first, again]


@pytest.mark.real_clock
async def test_a_deadline_seen_after_its_batch_returned_leaves_the_next_batch_unstuck() -> None:
    """As above, with the worker already at its next batch when the Trio side sees the
    deadline: the late job fails alone, and a job submitted while that next batch works
    queues behind it (the next batch holds nothing past a deadline: the writer is not
    stuck)."""
    returned, entered, release = threading.Event(), threading.Event(), threading.Event()
    ran: list[Job] = []

    def work(batch: Sequence[Job]) -> None:
        ran.extend(batch)
        if len(ran) == 1:
            returned.set()
        else:
            entered.set()
            release.wait(LIMIT)

    writer: Writer[Job] = Writer(work, deadline=LIMIT)
    first, second = Job(), Job()
    try:
        writer.submit(first)
        # No checkpoint until the abandon: the first batch's settling waits for this task.
        returned.wait(timeout=LIMIT)
        time.sleep(0.05)  # noqa: ASYNC251 (blocking on purpose: the worker has left)
        writer.submit(second)  # a worker takes it at once
        entered.wait(timeout=LIMIT)
        writer.abandon(first)  # the deadline, seen before the settling
        assert isinstance(first.error, OperationTimeout)
        assert not writer.stuck
        third = Job()
        writer.submit(third)
        assert third.error is None  # queued behind the second, not failed at once
    finally:
        release.set()
    with trio.fail_after(5):
        await second.wait()
        await third.wait()
    assert second.error is None
    assert third.error is None
    assert ran == [first, second, third]


def _until(check: object) -> None:
    deadline = time.monotonic() + 10
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


# -- a hung fsync does not hang dispose -----------------------------------------------------


class _HungFsync:
    """``os.fdatasync`` as the JSONL writer calls it: blocked while `hang` is set, until
    `release` (a disk that stopped answering, then came back)."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.released = threading.Event()
        self.hang.set()

    def release(self) -> None:
        self.hang.clear()
        self.released.set()


@pytest.fixture
def hung_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HungFsync]:
    hung = _HungFsync()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if hung.hang.is_set():
            hung.released.wait(timeout=LIMIT)
        real(fd)

    monkeypatch.setattr(jsonl_module.os, "fdatasync", fdatasync)
    try:
        yield hung
    finally:
        hung.release()


@pytest.mark.real_clock
@pytest.mark.parametrize("sync", ["turn", "always"])
async def test_a_hung_fsync_does_not_hang_dispose(
    tmp_path: Path, hung_fsync: _HungFsync, sync: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = JsonlPersistence(tmp_path, sync=sync, fsync_timeout=0.5)  # type: ignore[arg-type]
    with trio.fail_after(LIMIT):
        async with open_runtime(model=ScriptedModel(), persistence=store) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s")
            handle.agent.send("hello")
            began = time.monotonic()
            await handle.agent.when_idle()
            turn = time.monotonic() - began
            began = time.monotonic()
            await handle.dispose()
            disposed = time.monotonic() - began
    # "turn" never waits for its fsync; "always" gives up at the deadline.
    assert turn < (0.4 if sync == "turn" else 3)
    assert disposed < 3  # one deadline at most, with room for a loaded machine
    assert f"cannot fsync {store.path('s')}: no answer within 0.5 s" in caplog.text
    # Everything was written to the OS, and the session was let go: it opens again.
    hung_fsync.release()
    async with open_runtime(model=ScriptedModel(), persistence=store) as rt:
        again = await rt.agents.resume(agent_id="a", session_id="s")
        ends = [e for e in again.agent.session.events if isinstance(e, TurnEnd)]
        assert [type(e.reason) for e in ends] == [Completed]
        await again.dispose()


@pytest.mark.real_clock
async def test_a_close_past_its_deadline_still_releases_the_lock(
    tmp_path: Path, hung_fsync: _HungFsync
) -> None:
    store = JsonlPersistence(tmp_path, fsync_timeout=0.3)
    log = await store.create(_header("s"))
    log.append(TurnStart(turn=1, trigger=MessageTrigger(USER), seq=0, time=time.time()))
    with trio.fail_after(5), pytest.raises(PersistenceError, match=r"no answer within 0\.3 s"):
        await log.close()
    assert not Path(store.path("s")).with_suffix(".lock").exists()
    hung_fsync.release()
    # The next open repairs what the file holds: the turn without its end is closed.
    _, events, log = await store.open("s")
    assert [type(e) for e in events] == [TurnStart, TurnEnd]
    assert isinstance(events[1], TurnEnd)
    assert isinstance(events[1].reason, Interrupted)
    await log.close()


@pytest.mark.real_clock
async def test_runtime_exit_with_a_hung_fsync_pays_the_deadline_once(
    tmp_path: Path, hung_fsync: _HungFsync
) -> None:
    """Agents are stopped one after another, last created first; with the disk hung the
    first close waits out the deadline and the writer is stuck, so the others fail at once."""
    store = JsonlPersistence(tmp_path, fsync_timeout=0.5)
    model = ScriptedModel([[Hang()]] * 4)
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model, persistence=store) as rt:
            for number in range(4):
                handle = await rt.agents.create(agent_id=f"a{number}", session_id=f"s{number}")
                handle.agent.send("hello")  # a turn in flight: its dispose writes its end
            began = time.monotonic()
        took = time.monotonic() - began
    assert took < 1.5, took  # one deadline (0.5 s), not four
    assert not list(tmp_path.glob("*.lock"))


@pytest.mark.real_clock
async def test_a_commit_blocked_by_another_writer_fails_at_its_deadline(tmp_path: Path) -> None:
    """SQLite: another process holds the database's write lock; the write-ahead's commit
    gives up at ``commit_timeout``, the turn ends in error, dispose does not wait, and
    the session resumes once the lock is gone."""
    path = tmp_path / "store.sqlite"
    store = SqlitePersistence(path, commit_timeout=0.5)
    with trio.fail_after(LIMIT):
        async with open_runtime(model=ScriptedModel(), persistence=store) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s")
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")  # the write lock, held
            try:
                began = time.monotonic()
                handle.agent.send("hello")
                await handle.agent.when_idle()
                turn = time.monotonic() - began
                began = time.monotonic()
                await handle.dispose()
                disposed = time.monotonic() - began
            finally:
                other.execute("ROLLBACK")
                other.close()
            ends = [e for e in handle.agent.session.events if isinstance(e, TurnEnd)]
            assert isinstance(ends[-1].reason, Errored)
            assert "database is locked" in ends[-1].reason.message or (
                "no answer within 0.5 s" in ends[-1].reason.message
            ), ends[-1].reason.message
            assert turn < 3, turn
            assert disposed < 3, disposed
            # The lock gone, the commit that outlived its deadline returns; then it resumes.
            await trio.to_thread.run_sync(_until, lambda: not store.writer.stuck)
            again = await rt.agents.resume(agent_id="a", session_id="s")
            await again.dispose()
    store.close()


def _header(session_id: str) -> SessionHeader:
    return new_header(session_id, cwd=os.getcwd())


def test_the_store_url_sets_the_fsync_and_commit_deadlines(tmp_path: Path) -> None:
    jsonl = store_from_url(f"jsonl:{tmp_path / 'j'}?fsync_timeout=0.25")
    assert isinstance(jsonl, JsonlPersistence)
    assert (jsonl.root, jsonl.fsync_timeout) == (tmp_path / "j", 0.25)
    sqlite = store_from_url(f"sqlite:{tmp_path / 'db.sqlite'}?commit_timeout=1.5")
    assert isinstance(sqlite, SqlitePersistence)
    assert (sqlite.path, sqlite.writer.deadline) == (str(tmp_path / "db.sqlite"), 1.5)
    sqlite.close()
    default = store_from_url(f"jsonl:{tmp_path / 'j'}")
    assert isinstance(default, JsonlPersistence)
    assert default.fsync_timeout == DEADLINE
    for bad in ("fsync_timeout=soon", "fsync_timeout=0", "commit_timeout=1", "fsync_timeout"):
        with pytest.raises(StoreError, match=r"the only option is \?fsync_timeout=SECONDS"):
            store_from_url(f"jsonl:{tmp_path / 'j'}?{bad}")


# -- a supervisor whose children are independent ------------------------------------------


async def test_stop_together_waits_out_every_grace_at_once() -> None:
    cancelled: list[str] = []

    def child(name: str) -> ChildSpec:
        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                cancelled.append(name)
                with cleanup_scope():
                    await trio.sleep(1.0)  # a slow cleanup, inside the grace

        return ChildSpec(name, run, shutdown=2.0)

    began = trio.current_time()
    async with Supervisor([child("a"), child("b"), child("c")], stop_together=True):
        pass
    assert trio.current_time() - began == pytest.approx(1.0)  # once, not three times
    assert sorted(cancelled) == ["a", "b", "c"]
    cancelled.clear()
    began = trio.current_time()
    async with Supervisor([child("a"), child("b"), child("c")]):
        pass
    assert trio.current_time() - began == pytest.approx(3.0)  # the default: one by one
    assert cancelled == ["c", "b", "a"]


# -- ACP: every session torn down at once ------------------------------------------------


def _stubborn(name: str, record: Path) -> dict[str, object]:
    return {
        "name": name,
        "command": sys.executable,
        "args": [str(SERVERS), "ignore-eof"],
        "env": [{"name": "MCP_RECORD", "value": str(record)}],
    }


@pytest.mark.real_clock
@pytest.mark.parametrize("how", ["sigterm", "eof"])
async def test_sessions_whose_servers_ignore_sigterm_are_torn_down_within_one_grace(
    tmp_path: Path, how: str
) -> None:
    record = tmp_path / "record"
    with trio.fail_after(LIMIT):
        async with acp_process(tmp_path / "home", "--model", "scripted:0") as node:
            for number in range(4):
                params = {"cwd": str(tmp_path), "mcpServers": [_stubborn(f"s{number}", record)]}
                answer = await node.call("session/new", params)
                assert "result" in answer, answer
            while len(pids(record)) < 4:  # session/new waits at most 2 s for its server
                await trio.sleep(0.05)
            servers = pids(record)
            began = time.monotonic()
            if how == "sigterm":
                node.process.send_signal(signal.SIGTERM)
                code = await node.process.wait()
            else:
                code = await node.close()
            took = time.monotonic() - began
    assert code == 0
    assert not [pid for pid in servers if alive(pid)]
    # One server's stop (stdin closed, SIGTERM, SIGKILL: ~4.5 s), not four in a row.
    assert took < TEARDOWN_GRACE + 2.5, took


class _AllowingEditor:
    """The editor: allows each command once, records nothing."""

    async def session_update(self, session_id: str, update: object, **kwargs: object) -> None:
        pass

    async def request_permission(
        self, session_id: str, tool_call: object, options: list[Any], **kwargs: object
    ) -> schema.RequestPermissionResponse:
        (once,) = [o for o in options if o.kind == "allow_once"]
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id=once.option_id)
        )

    def on_connect(self, conn: object) -> None:
        pass


@pytest.mark.real_clock
def test_sessions_whose_bash_tasks_ignore_sigterm_are_torn_down_within_one_grace(
    tmp_path: Path,
) -> None:
    record = tmp_path / "shells"
    # The shell ignores SIGTERM (its sleeps die of it, the loop goes on): only SIGKILL ends it.
    stubborn = f"trap '' TERM; echo $$ >> {record}; while :; do sleep 0.2; done"
    arguments = {"command": stubborn, "description": "stubborn", "run_in_background": True}
    prompt = [acp.text_block("tool: bash " + json.dumps(arguments))]

    async def scenario() -> float:
        command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
        env = {k: v for k, v in os.environ.items() if k != "GREENROOM_STORE"}
        env["GREENROOM_HOME"] = str(tmp_path / "home")
        async with acp.spawn_agent_process(_AllowingEditor(), *command, env=env, cwd=tmp_path) as (
            conn,
            process,
        ):
            await conn.initialize(protocol_version=1)
            for _ in range(4):
                session = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                answer = await conn.prompt(session_id=session, prompt=prompt)
                assert answer.stop_reason == "end_turn"
            while len(_shells(record)) < 4:
                await asyncio.sleep(0.02)
            began = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
            return time.monotonic() - began

    took = asyncio.run(asyncio.wait_for(scenario(), LIMIT))
    assert not [pid for pid in _shells(record) if alive(pid)]
    assert took < TEARDOWN_GRACE, took  # one kill grace (3 s), not one per session


def _shells(record: Path) -> list[int]:
    return [int(line) for line in record.read_text().split()] if record.exists() else []
