"""Every test runs in virtual time, fails at once if it deadlocks, and fails if it leaks a task.

Each async test gets a `trio.testing.MockClock` with ``autojump_threshold=0``
(the autojump clock) unless it is marked ``real_clock`` (it waits on real
processes or sockets and bounds itself with ``trio.fail_after``) or asks for a
clock fixture itself. A virtual-time test runs under a `VIRTUAL_DEADLINE`: a
deadlock makes the clock jump straight to it, so the test fails in real
milliseconds instead of hanging the suite. Each test also runs with a
`TaskLeakCheck` instrument: a task spawned while the test ran that is still
alive when the test's own task ends outlived the runtime that should have
owned it, and fails the test. A test still running after `WALL_LIMIT` real
seconds (a hang no clock can see: a thread stuck, the clock held) stops the
suite with every thread's traceback instead of hanging CI.
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import hypothesis
import psycopg
import pytest
import trio
import trio.testing

from greenroom.testing.clock import HoldClockWhileThreadsWork
from tests.pg_server import PgServer

#: Virtual seconds any virtual-time test may take; far beyond what any test sleeps.
VIRTUAL_DEADLINE = 3600.0
#: Real seconds any one test may take, its fixtures included; the whole suite takes less.
WALL_LIMIT = 600.0

hypothesis.settings.register_profile("greenroom", deadline=None, max_examples=60)
hypothesis.settings.load_profile("greenroom")


class TaskLeakCheck(trio.abc.Instrument):
    """Records the tasks spawned during a test that outlive the test's own task.

    pytest-trio runs the test body in a task named ``<test 'name'>``; fixtures
    run in sibling tasks and are not counted, nor is anything they spawn.
    """

    def __init__(self) -> None:
        self.test_task: trio.lowlevel.Task | None = None
        self.live: set[trio.lowlevel.Task] = set()
        self.leaked: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if self.test_task is None:
            if task.name.startswith("<test "):
                self.test_task = task
        elif task is not self.test_task and self._spawned_by_test(task):
            self.live.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.live.discard(task)
        if task is self.test_task:
            self.leaked = sorted(t.name for t in self.live if not _trio_finalizer(t))

    def _spawned_by_test(self, task: trio.lowlevel.Task) -> bool:
        parent: trio.lowlevel.Task | None = task
        while parent is not None:
            if parent is self.test_task:
                return True
            nursery = parent.parent_nursery
            parent = nursery.parent_task if nursery is not None else None
        # System tasks (trio.lowlevel.spawn_system_task) have no link to the test;
        # once the test started, nothing else spawns them.
        return task.parent_nursery is not None and task.parent_nursery.parent_task.name == "<init>"


def _trio_finalizer(task: trio.lowlevel.Task) -> bool:
    """Trio's own short system task that closes an async generator a library dropped.

    httpx's response iterators are nested async generators that httpx does not
    close when a stream is left early; Trio finalizes them in such a task. It
    belongs to Trio, holds nothing of ours, and ends by itself.
    """
    return task.name.startswith("close asyncgen ")


def virtual_run(
    fn: Callable[[], Awaitable[Any]],
    *,
    clock: trio.abc.Clock | None,
    instruments: Sequence[trio.abc.Instrument],
) -> Any:
    """pytest-trio's runner for every test not marked real_clock."""
    if clock is None:
        clock = trio.testing.MockClock(autojump_threshold=0)
        instruments = [*instruments, HoldClockWhileThreadsWork(clock)]
    return _checked_run(bounded(fn, VIRTUAL_DEADLINE), clock, instruments)


def bounded(fn: Callable[[], Awaitable[Any]], deadline: float) -> Callable[[], Awaitable[Any]]:
    """`fn`, failing with a message once it has run `deadline` seconds of the run's clock."""

    async def run() -> Any:
        try:
            with trio.fail_after(deadline):
                return await fn()
        except trio.TooSlowError:
            pytest.fail(f"still running after {deadline} virtual seconds: a deadlock?")

    return run


def real_run(
    fn: Callable[[], Awaitable[Any]],
    *,
    clock: trio.abc.Clock | None,
    instruments: Sequence[trio.abc.Instrument],
) -> Any:
    """pytest-trio's runner for tests marked real_clock."""
    return _checked_run(fn, clock, instruments)


def _checked_run(
    fn: Callable[[], Awaitable[Any]],
    clock: trio.abc.Clock | None,
    instruments: Sequence[trio.abc.Instrument],
) -> Any:
    check = TaskLeakCheck()
    result = trio.run(fn, clock=clock, instruments=[*instruments, check])
    if check.leaked:
        pytest.fail(f"tasks outlived the test that spawned them: {check.leaked}")
    return result


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server of this worker's, started on first use (tests/pg_server.py).

    Always a cluster of the suite's own, even with ``GREENROOM_TEST_DSN``: a test that asks for
    it by name stops and starts it.
    """
    server = PgServer().start()
    try:
        yield server
    finally:
        server.remove()


def _schema_name() -> str:
    # Unique across xdist workers and suites sharing one GREENROOM_TEST_DSN server.
    return f"test_{os.getpid()}_{next(_schemas)}"


_schemas = itertools.count(1)


@pytest.fixture
def postgres_dsn(request: pytest.FixtureRequest) -> str:
    """A DSN whose tables live in a schema of this test's own.

    The server is ``$GREENROOM_TEST_DSN`` when it is set (a running server), else this worker's
    throwaway one (`pg_server`); always that one for a test that asks for it by name (it stops
    and starts the server under its schema).
    """
    shared = os.environ.get("GREENROOM_TEST_DSN")
    if shared and "pg_server" not in request.fixturenames:
        base = shared
    else:
        base = request.getfixturevalue("pg_server").dsn
    schema = _schema_name()
    with psycopg.connect(base, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}options=-csearch_path%3D{schema}"


_real_stderr = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    # Output capture replaces fd 2 around each test; the tracebacks go to the real one.
    config.stash[_real_stderr] = os.dup(sys.__stderr__.fileno() if sys.__stderr__ else 2)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    faulthandler.dump_traceback_later(WALL_LIMIT, exit=True, file=item.config.stash[_real_stderr])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(tryfirst=True)
def pytest_itemcollected(item: pytest.Item) -> None:
    # Before `-m` selects: `-m postgres` runs every test that needs the server.
    if {"pg_server", "postgres_dsn"} & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # trio_mode marks async tests with trio.run; our marker goes in front of it.
    for item in items:
        if item.get_closest_marker("trio") is None:
            continue
        run = real_run if item.get_closest_marker("real_clock") else virtual_run
        item.add_marker(pytest.mark.trio(run=run), append=False)
