"""``python -m bench._counted_calls OUT -m MODULE [ARG ...]``: run MODULE as ``python -m``
would, counting the Python calls of its main thread, and write their number to the file OUT
when it exits (however it exits).

What `bench.counting` counts in-process (function calls and coroutine resumptions, under
``sys.setprofile``), for an agent that is a process of its own: `bench.acp` takes the
difference of two runs, of M and 2M prompts, so that start-up and teardown cancel out.
Calls made in worker threads are not counted (greenroom makes none per prompt under the
default sync policy but its fsyncs, which are system calls).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    out, flag, module, *args = sys.argv[1:]
    if flag != "-m":
        raise SystemExit("usage: python -m bench._counted_calls OUT -m MODULE [ARG ...]")
    calls = 0

    def count(_frame: object, event: str, _arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.argv = [module, *args]
    sys.setprofile(count)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.setprofile(None)
        Path(out).write_text(f"{calls}\n")


if __name__ == "__main__":
    main()
