"""``python -m bench._bash_rss WORKDIR TASKS BYTES``: peak RSS of a `LocalBashExecutor` flood.

Run in a fresh interpreter by `bench.bash`, so that ``ru_maxrss`` is this
process's own. After importing greenroom and opening the executor it records
``ru_maxrss`` (the baseline), starts TASKS background tasks that each write
BYTES bytes of ``a`` to stdout, waits until every one has ended, checks that
each stream's spill file holds all of its output, and prints one JSON object:
``{"baseline_kb": ..., "peak_kb": ..., "seconds": ...}`` (``ru_maxrss`` is in
kilobytes on Linux). Closing the executor removes the spill files.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import trio

from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.seam import BashExecRequest, BashTask

#: Seconds the whole flood may take before it counts as a hang.
_TIMEOUT = 300.0


def _maxrss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _check(ex: LocalBashExecutor, ids: list[str], size: int) -> None:
    """Every task completed with exit 0 and its stdout spill file holds all `size` bytes."""
    for task_id in ids:
        output = ex.read_output(task_id)
        if output.task.status != "completed" or output.task.exit_code != 0:
            raise RuntimeError(f"flood task ended badly: {output.task!r}")
        path = output.stdout_spill_path
        spilled = -1 if path is None else os.path.getsize(path)
        if spilled != size or output.stderr_spill_path is not None:
            raise RuntimeError(
                f"{task_id}: stdout spill file holds {spilled} of {size} bytes "
                f"(stderr spill {output.stderr_spill_path!r})"
            )


async def _flood(workdir: str, tasks: int, size: int) -> dict[str, float]:
    finished: list[BashTask] = []
    all_done = trio.Event()

    def done(task: BashTask) -> None:
        finished.append(task)
        if len(finished) == tasks:
            all_done.set()

    with trio.fail_after(_TIMEOUT):
        async with LocalBashExecutor(workdir) as ex:
            baseline = _maxrss_kb()
            ex.on_task_done(done)
            spec = ex.resolve(BashExecRequest(command=f"head -c {size} /dev/zero | tr '\\0' 'a'"))
            t0 = time.perf_counter()
            ids = [(await ex.start(spec)).id for _ in range(tasks)]
            await all_done.wait()
            t1 = time.perf_counter()
            peak = _maxrss_kb()
            _check(ex, ids, size)  # before the close removes the spill files
    return {"baseline_kb": baseline, "peak_kb": peak, "seconds": t1 - t0}


def main(argv: list[str]) -> int:
    workdir, tasks, size = argv[0], int(argv[1]), int(argv[2])
    result = trio.run(_flood, workdir, tasks, size)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
