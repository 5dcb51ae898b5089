"""The leak-check instrument and the virtual deadline that every test runs under."""

from __future__ import annotations

import time

import pytest
import trio
import trio.lowlevel
import trio.testing

from tests.conftest import TaskLeakCheck, bounded


async def _sleeper() -> None:
    await trio.sleep_forever()


def _run_fake_test(body: object) -> TaskLeakCheck:
    check = TaskLeakCheck()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(body, name="<test 'fake'>")

    trio.run(main, instruments=[check])
    return check


def test_a_task_that_outlives_the_test_is_reported() -> None:
    async def leaky() -> None:
        trio.lowlevel.spawn_system_task(_sleeper, name="stray")

    assert _run_fake_test(leaky).leaked == ["stray"]


def test_tasks_that_end_with_the_test_are_not_reported() -> None:
    async def tidy() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_sleeper, name="child")
            await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()

    assert _run_fake_test(tidy).leaked == []


def test_a_deadlocked_virtual_time_test_fails_at_once() -> None:
    async def deadlocked() -> None:
        await trio.Event().wait()  # nothing will ever set it

    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"still running after 3600\.0 virtual seconds"):
        trio.run(bounded(deadlocked, 3600.0), clock=trio.testing.MockClock(autojump_threshold=0))
    assert time.monotonic() - started < 5
