"""`Parking`: tasks parked until something they wait for happens; greenroom's one park/wake.

Every wait of the runtime's own (the agent's task on its inbox, a prompt's
awaiters and readers, a session's readers, `when_idle`) parks here: a task
blocks with no frame of ours and no timer, and costs nothing until woken.
"""

from __future__ import annotations

from collections.abc import Awaitable
from functools import partial

import trio


class Parking:
    """Tasks parked until the next `wake`.

    `park` blocks the calling task until a `wake` that comes after it, or
    until it is cancelled; it never returns early and never spins. A
    cancelled task leaves nothing behind. `wake` reschedules every task
    parked at that moment (in no promised order) and never checkpoints.
    What the tasks wait for is the owner's state: a woken task looks at it
    again and parks again if it must.

    The first task parked takes a slot, the others a list made for them: most
    waits have one waiter (an agent's own task on its inbox, one awaiter of a
    prompt), and an idle agent holds one of these.
    """

    __slots__ = ("_first", "_rest")

    def __init__(self) -> None:
        self._first: trio.lowlevel.Task | None = None
        self._rest: list[trio.lowlevel.Task] | None = None

    def __bool__(self) -> bool:
        """True while a task is parked."""
        return self._first is not None or bool(self._rest)

    def park(self) -> Awaitable[None]:
        """Awaited, blocks until the next `wake` (a checkpoint: a cancel lands here).

        Trio's own awaitable is handed back rather than a coroutine, so a
        parked task holds no frame of ours.
        """
        task = trio.lowlevel.current_task()
        if self._first is None:
            self._first = task
            return trio.lowlevel.wait_task_rescheduled(self._abort_first)  # noqa: ASYNC105
        if self._rest is None:
            self._rest = []
        self._rest.append(task)
        return trio.lowlevel.wait_task_rescheduled(partial(self._abort, task))  # noqa: ASYNC105

    def wake(self) -> None:
        """Reschedule every task parked now."""
        first, self._first = self._first, None
        if first is not None:
            trio.lowlevel.reschedule(first)
        rest = self._rest
        if rest:
            self._rest = None
            for task in rest:
                trio.lowlevel.reschedule(task)

    def _abort_first(self, _: object) -> trio.lowlevel.Abort:
        self._first = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _abort(self, task: trio.lowlevel.Task, _: object) -> trio.lowlevel.Abort:
        assert self._rest is not None
        self._rest.remove(task)
        return trio.lowlevel.Abort.SUCCEEDED
