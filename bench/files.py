"""File tools: ``read_file`` of a 1 MB file with the safe open, against plain opens.

The file is 1 MiB of source-like lines (about 33 bytes each, so the
2,000-line cap binds at about 66 KB) in a subdirectory of the session's root;
the page cache holds it. Per read, in microseconds: the median of K reads,
the variants compared taking turns read by read:

* ours: what ``read_file`` runs in its worker thread: `Roots` of the session's
  directory, `confine.open_regular` (the walk from the root's descriptor,
  ``O_NOFOLLOW`` each step, the fstat checks, ``O_NONBLOCK`` cleared), then
  `read_window` under the default `ReadCaps` and `Window.render`;
* against a plain ``open(path, "rb")`` doing the same capped read
  (`read_window` over its ``read``, then `Window.render`): the goal row,
  the cost of the safe open itself;
* against a plain ``open(path, "rb").read(n)`` of the n bytes the capped read
  shows, decoded: no line is looked for, so the ratio is the price of the
  line cap (finding 2,000 line ends in CPython), not of the confinement;
* the whole tool call (``await`` the ``read_file`` tool, its thread hop
  included) against ``await trio.to_thread.run_sync`` of the plain capped
  read: what a caller sees.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import trio

from bench.report import Row, compare
from greenroom.actors.types import Agent, ToolInvocation
from greenroom.tools.confine import Roots, open_regular
from greenroom.tools.files import ReadArgs, ReadCaps, file_tools, read_window

SCENARIO = "files"
_SIZE = 1 << 20
_PATH = "src/module.py"
_WORDS = ["def", "return", "self", "value", "for", "in", "if", "else", "import", "from"]


def _make(root: Path) -> Path:
    rng = random.Random(23)
    lines, size = [], 0
    while size < _SIZE:
        line = "    " + " ".join(rng.choices(_WORDS, k=rng.randint(2, 10))) + "\n"
        lines.append(line)
        size += len(line)
    path = root / _PATH
    path.parent.mkdir()
    path.write_text("".join(lines)[:_SIZE])
    return path


def _ours(root: str, caps: ReadCaps) -> str:
    fd, _, _ = open_regular(Roots(root), _PATH)
    try:
        window = read_window(lambda n: os.read(fd, n), 1, caps.lines, caps.bytes)
        return window.render(_PATH, caps.bytes)
    finally:
        os.close(fd)


def _plain_capped(path: Path, caps: ReadCaps) -> str:
    with open(path, "rb") as file:
        return read_window(file.read, 1, caps.lines, caps.bytes).render(_PATH, caps.bytes)


def _interleaved(k: int, *variants: Callable[[], object]) -> list[float]:
    """Microseconds per call of each variant: the median of K calls, the variants taking
    turns call by call (a median, not a mean: one preempted call on a shared machine
    must not decide a repeat)."""
    gc.collect()
    spent: list[list[float]] = [[] for _ in variants]
    for _ in range(k):
        for times, work in zip(spent, variants, strict=True):
            t0 = time.perf_counter()
            work()
            times.append(time.perf_counter() - t0)
    return [statistics.median(times) * 1e6 for times in spent]


class _Header:
    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.additional_directories: list[str] = []


class _Session:
    def __init__(self, cwd: str) -> None:
        self.header = _Header(cwd)


class _Caller:
    """All ``read_file`` reads of its caller: the session's directories."""

    def __init__(self, cwd: str) -> None:
        self.session = _Session(cwd)


async def _calls(root: str, path: Path, caps: ReadCaps, k: int) -> tuple[float, float]:
    """Median microseconds per ``read_file`` tool call, and per thread hop of the plain
    capped read."""
    (tool,) = [t for t in file_tools(caps) if t.name == "read_file"]
    invocation = ToolInvocation("c", "read_file", "{}", cast(Agent, _Caller(root)))
    args = ReadArgs(path=_PATH)
    await trio.to_thread.run_sync(_plain_capped, path, caps)  # the thread cache warmed
    gc.collect()
    ours: list[float] = []
    plain: list[float] = []
    for _ in range(k):  # interleaved, so that both meet the same machine
        t0 = time.perf_counter()
        await tool.run(args, invocation)
        t1 = time.perf_counter()
        await trio.to_thread.run_sync(_plain_capped, path, caps)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        plain.append(t2 - t1)
    return statistics.median(ours) * 1e6, statistics.median(plain) * 1e6


def run(repeats: int, quick: bool) -> list[Row]:
    k = 50 if quick else 500
    caps = ReadCaps()
    ours: list[float] = []
    plain: list[float] = []
    bare: list[float] = []
    call: list[float] = []
    hop: list[float] = []
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        path = _make(Path(tmp))
        shown = len(_ours(tmp, caps).encode())
        if _ours(tmp, caps) != _plain_capped(path, caps):
            raise RuntimeError("the safe read and the plain one disagree")

        def bare_read() -> str:
            with open(path, "rb") as file:
                return file.read(shown).decode("utf-8", "replace")

        for _ in range(repeats):
            times = _interleaved(k, lambda: _ours(tmp, caps), lambda: _plain_capped(path, caps))
            ours.append(times[0])
            plain.append(times[1])
            bare.append(_interleaved(k, bare_read)[0])
            tool, threaded = trio.run(_calls, tmp, path, caps, k)
            call.append(tool)
            hop.append(threaded)
    metric = f"read_file of a 1 MiB file, capped at {caps.lines:,} lines ({shown:,} bytes shown)"
    return [
        compare(
            SCENARIO,
            metric,
            "us",
            ours,
            baseline="plain open(), the same capped read",
            raw=plain,
            max_ratio=1.2,
        ),
        compare(
            SCENARIO,
            metric,
            "us",
            ours,
            baseline="plain open().read(n) of the bytes shown",
            raw=bare,
            note="no line ends looked for: the ratio is the line cap's price, not the safe open's",
        ),
        compare(
            SCENARIO,
            f"{metric}, the tool call",
            "us",
            call,
            baseline="to_thread.run_sync(plain open(), the same capped read)",
            raw=hop,
        ),
    ]
