"""``python -m bench._counted_calls OUT -m MODULE [ARG ...]``: run MODULE as ``python -m``
would, counting the Python calls of all its threads, and write their number to the file OUT
when it exits (however it exits).

What `bench.counting` counts in-process (function calls and coroutine resumptions, under
``sys.setprofile``), for an agent that is a process of its own, and in every thread it
starts (``threading.setprofile``: a store's writer thread works for each turn): `bench.acp`
takes the difference of two runs, of M and 2M prompts, so that start-up and teardown cancel
out.
"""

from __future__ import annotations

import itertools
import runpy
import sys
import threading
from pathlib import Path


def main() -> None:
    out, flag, module, *args = sys.argv[1:]
    if flag != "-m":
        raise SystemExit("usage: python -m bench._counted_calls OUT -m MODULE [ARG ...]")
    calls = itertools.count()  # one counter for every thread: `next` is atomic

    def count(_frame: object, event: str, _arg: object) -> None:
        if event == "call":
            next(calls)

    sys.argv = [module, *args]
    threading.setprofile(count)
    sys.setprofile(count)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        Path(out).write_text(f"{next(calls)}\n")


if __name__ == "__main__":
    main()
