"""`Parking`: tasks parked until something they wait for happens."""

from __future__ import annotations

from collections.abc import Awaitable
from functools import partial

import trio


class Parking:
    """Tasks parked until the next `wake`.

    `park` blocks the calling task until a `wake` that comes after it, or
    until it is cancelled; it never returns early and never spins. A
    cancelled task leaves nothing behind. `wake` reschedules every task
    parked at that moment, in the order they parked, and never checkpoints;
    with none parked it costs one truth test. What the tasks wait for is the
    owner's state: a woken task looks at it again and parks again if it
    must.
    """

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: list[trio.lowlevel.Task] = []

    def __len__(self) -> int:
        """How many tasks are parked now."""
        return len(self._tasks)

    def park(self) -> Awaitable[None]:
        """Awaited, blocks until the next `wake` (a checkpoint: a cancel lands here).

        Trio's own awaitable is handed back rather than a coroutine, so a
        parked task holds no frame of ours.
        """
        task = trio.lowlevel.current_task()
        self._tasks.append(task)
        return trio.lowlevel.wait_task_rescheduled(partial(self._abort, task))  # noqa: ASYNC105

    def wake(self) -> None:
        """Reschedule every task parked now."""
        if self._tasks:
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                trio.lowlevel.reschedule(task)

    def _abort(self, task: trio.lowlevel.Task, _: object) -> trio.lowlevel.Abort:
        self._tasks.remove(task)
        return trio.lowlevel.Abort.SUCCEEDED
