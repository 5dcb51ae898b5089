"""Costs counted rather than timed: Python calls, task steps and traced bytes per op.

The same on every machine: a row of these says what a timed ratio cannot (whether a
change added work, or the machine is slower today).
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio


class _Steps(trio.abc.Instrument):
    """Counts task steps: each is one pass of a task through Trio's scheduler."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


class Profile(msgspec.Struct, frozen=True):
    """What one op costs, counted rather than timed: the same on every machine."""

    calls: float  # Python function calls and coroutine resumptions
    steps: float  # task steps (scheduler passes)
    kept: float  # traced bytes it leaves alive (the session log's events)


def _counted(variant: Callable[[int], Awaitable[float]], m: int) -> tuple[int, int, int]:
    """Calls, task steps and traced peak bytes of one run of `variant` over `m` ops."""
    calls = 0

    def count(_frame: object, event: str, _arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    steps = _Steps()
    gc.collect()
    tracemalloc.start()
    sys.setprofile(count)
    try:
        trio.run(variant, m, instruments=[steps])
    finally:
        sys.setprofile(None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return calls, steps.steps, peak


def profile(variant: Callable[[int], Awaitable[float]], m: int) -> Profile:
    """Per op: the difference between runs of 2m and m ops, over m (the setup cancels out)."""
    small, large = _counted(variant, m), _counted(variant, 2 * m)
    calls, steps, kept = ((b - a) / m for a, b in zip(small, large, strict=True))
    return Profile(calls=calls, steps=steps, kept=kept)


#: Why `instructions` counted nothing, when it could not.
NO_VALGRIND = "skipped: no valgrind"


def _collected(argv: Sequence[str]) -> int:
    """Instructions callgrind counted over the whole run of `argv` (every thread)."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dicts' probes in every run
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind reported no count: {done.stderr[-500:]}")
    return int(found.group(1))


def instructions(module: str, variant: str, m: int) -> float | None:
    """Instructions per op under callgrind: ``python -m module variant N`` run for N = m
    and 2m, the difference over m (start-up and imports cancel out). None when valgrind
    is not installed (`NO_VALGRIND`)."""
    if shutil.which("valgrind") is None:
        return None
    small, large = (_collected([sys.executable, "-m", module, variant, str(n)]) for n in (m, 2 * m))
    return (large - small) / m
