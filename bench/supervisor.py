"""Supervisor: per-child start and ordered shutdown against a raw nursery.

* start: ``await sup.start_child(spec)`` against ``await nursery.start(fn)``,
  each child parking in ``sleep_forever`` after ``started()``;
* shutdown: the supervisor's ordered exit (one child at a time, last first,
  each with a grace) against ``nursery.cancel_scope.cancel()`` and the nursery's exit.
"""

from __future__ import annotations

import gc
import time

import trio

from bench.report import Row, compare
from greenroom.supervisor import ChildSpec, Supervisor


async def _parked(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    await trio.sleep_forever()


async def _raw(n: int) -> tuple[float, float]:
    async with trio.open_nursery() as nursery:
        t0 = time.perf_counter()
        for _ in range(n):
            await nursery.start(_parked)
        t1 = time.perf_counter()
        nursery.cancel_scope.cancel()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


async def _scoped(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.CancelScope():
        task_status.started()
        await trio.sleep_forever()


async def _raw_scoped(n: int) -> tuple[float, float]:
    """The floor for a child that can be cancelled on its own: one CancelScope each."""
    async with trio.open_nursery() as nursery:
        t0 = time.perf_counter()
        for _ in range(n):
            await nursery.start(_scoped)
        t1 = time.perf_counter()
        nursery.cancel_scope.cancel()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


async def _supervised(n: int) -> tuple[float, float]:
    async with Supervisor(name="bench") as sup:
        t0 = time.perf_counter()
        for i in range(n):
            await sup.start_child(ChildSpec(f"c{i}", _parked, restart="temporary"))
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def run(repeats: int, quick: bool) -> list[Row]:
    n = 2_000 if quick else 10_000
    variants = (_raw, _raw_scoped, _supervised)
    starts: dict[str, list[float]] = {v.__name__: [] for v in variants}
    stops: dict[str, list[float]] = {v.__name__: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            gc.collect()
            start, stop = trio.run(variant, n)
            starts[variant.__name__].append(start)
            stops[variant.__name__].append(stop)
    our_start, our_stop = starts["_supervised"], stops["_supervised"]
    return [
        compare(
            "supervisor",
            f"start per child (N={n})",
            "us",
            our_start,
            baseline="nursery.start",
            raw=starts["_raw"],
            max_ratio=1.5,
        ),
        compare(
            "supervisor",
            f"start per child (N={n})",
            "us",
            our_start,
            baseline="nursery.start+CancelScope",
            raw=starts["_raw_scoped"],
        ),
        compare(
            "supervisor",
            f"ordered shutdown per child (N={n})",
            "us",
            our_stop,
            baseline="nursery cancel",
            raw=stops["_raw"],
            max_ratio=2.0,
        ),
    ]
