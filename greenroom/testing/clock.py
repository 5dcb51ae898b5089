"""Virtual time for tests: a Trio run on the autojump clock that holds still while real work
is under way, and fails at once when it deadlocks.

`virtual_run` (a Trio run on the autojump clock, failing past `VIRTUAL_DEADLINE`) and
`HoldClockWhileThreadsWork` (the instrument that holds it): greenroom's own suite runs on
both.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import trio
import trio.testing

from greenroom.sandbox import launching
from greenroom.session.persistence.writer import writers_busy

#: Virtual seconds a test may take before it is taken for a deadlock (nothing left to run
#: but waits: the autojump clock jumps straight here).
VIRTUAL_DEADLINE: Final = 3600.0


class HoldClockWhileThreadsWork(trio.abc.Instrument):
    """Pauses the autojump `clock` while a ``trio.to_thread`` call or a persistence's writer
    works, or the sandbox's launcher starts a process for this run.

    A file write in a worker thread is real progress the test waits for; jumping virtual
    time past it would race virtual deadlines (a store's among them) against the disk.
    Threads start and finish inside task steps, so checking after each step is enough.
    """

    def __init__(self, clock: trio.testing.MockClock) -> None:
        self.clock = clock

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        token = trio.lowlevel.current_trio_token()
        busy = (
            trio.to_thread.current_default_thread_limiter().borrowed_tokens > 0
            or writers_busy(token)
            or launching(token)
        )
        threshold = math.inf if busy else 0.0
        if self.clock.autojump_threshold != threshold:
            self.clock.autojump_threshold = threshold


def virtual_run(
    fn: Callable[[], Awaitable[Any]],
    *,
    clock: trio.abc.Clock | None = None,
    instruments: Sequence[trio.abc.Instrument] = (),
) -> Any:
    """``trio.run(fn)`` in virtual time: on the autojump clock (unless given one), held
    still while threads work, failing with `TimeoutError` past `VIRTUAL_DEADLINE` virtual
    seconds. pytest-trio's ``run=`` for a test (`greenroom.testing.plugin` marks its tests
    with it)."""
    if clock is None:
        mock = trio.testing.MockClock(autojump_threshold=0)
        clock, instruments = mock, [*instruments, HoldClockWhileThreadsWork(mock)]

    async def bounded() -> Any:
        try:
            with trio.fail_after(VIRTUAL_DEADLINE):
                return await fn()
        except trio.TooSlowError:
            raise TimeoutError(
                f"still running after {VIRTUAL_DEADLINE:g} virtual seconds: a deadlock?"
            ) from None

    return trio.run(bounded, clock=clock, instruments=instruments)
