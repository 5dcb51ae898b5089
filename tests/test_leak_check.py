"""The leak-check instrument that every test runs under."""

from __future__ import annotations

import trio
import trio.lowlevel

from tests.conftest import TaskLeakCheck


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
