"""``greenroom demo``: a supervision tree at work, in virtual time.

A root supervisor runs a steady worker, a flaky worker that crashes and is
restarted with backoff, and a nested one_for_all supervisor of two workers;
then it shuts down in reverse start order, one child's cleanup overrunning its
grace. Every exit record and the tree are printed as they happen. Time is
Trio's `MockClock` with autojump, so the story's seconds cost none.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing

from greenroom.supervisor import (
    Backoff,
    ChildSpec,
    ExitRecord,
    Supervisor,
    cleanup_scope,
)


def _say(text: str) -> None:
    print(f"[t={trio.current_time():5.2f}s] {text}", flush=True)


def _on_exit(record: ExitRecord) -> None:
    detail = f" ({record.exception})" if record.exception else ""
    _say(
        f"exit  {record.supervisor}/{record.child}: {record.outcome},"
        f" restarts={record.restarts}{detail}"
    )


def _worker(name: str, *, crash_every: float | None = None, cleanup: float = 0.0) -> ChildSpec:
    async def start(*, task_status: trio.TaskStatus[None]) -> None:
        _say(f"start {name}")
        task_status.started()
        try:
            if crash_every is None:
                await trio.sleep_forever()
            await trio.sleep(crash_every)
            raise RuntimeError(f"{name} lost its connection")
        except trio.Cancelled as cancel:
            _say(f"stop  {name}: {cancel.reason}")
            with cleanup_scope() as scope:
                await trio.sleep(cleanup)
            if scope.cancelled_caught:
                _say(f"cut   {name}: cleanup overran its grace")
            raise

    return ChildSpec(name, start, shutdown=1.0)


def _nested(
    name: str, children: list[ChildSpec], listener: Callable[[ExitRecord], object]
) -> ChildSpec:
    async def start(*, task_status: trio.TaskStatus[Supervisor]) -> None:
        async with Supervisor(children, name=name, strategy="one_for_all") as nested:
            nested.add_exit_listener(listener)
            task_status.started(nested)
            await trio.sleep_forever()

    return ChildSpec(name, start, shutdown="infinity")


async def supervision_story() -> None:
    """The demo's body; prints as it goes."""
    children = [
        _worker("steady"),
        _worker("flaky", crash_every=1.5),
        _nested("pool", [_worker("pool-1"), _worker("pool-2", cleanup=5.0)], _on_exit),
    ]
    backoff = Backoff(initial=0.25, maximum=2.0, jitter=0.0)
    async with Supervisor(children, name="root", intensity=5, period=10, backoff=backoff) as root:
        root.add_exit_listener(_on_exit)
        print(root.tree().render())
        await trio.sleep(4)
        _say("the tree after four seconds:")
        print(root.tree().render())
        _say("shutting down: reverse start order, each child within its grace")
    _say("root closed; every child stopped")


def run_demo() -> None:
    trio.run(supervision_story, clock=trio.testing.MockClock(autojump_threshold=0))
