"""Bounded texts: a long text is cut with a marker, its whole kept in a spill file.

* `SpillDir`: a private directory (0700, made on first use) of spill files
  (0600, created exclusively, never reused), removed whole by `close`. Bash's
  output streams and long tool results each keep one.
* `cut`: ``limit`` characters of a text, most from its start and the last
  `TAIL` from its end (where a command's exit code, a tool's status or an
  earlier marker are), and between them a marker line saying how much was
  cut there and where the whole text is.
* `find_marker`: the first marker in a text, if any (``greenroom sessions
  show`` prints it beside a short preview).
* `TextCap`: the cut of one configured limit, spilling the whole text first.

Limits count characters (what a model's context and an editor's view count),
not bytes.

`DEFAULT_MAX_TOOL_RESULT` is the runtime's default cut of a tool's result; a `SpillDir`
holds at most `MAX_SPILLED` bytes in all.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
import threading
from typing import Final

import trio

#: The most characters of a tool's result the model and the log are given, by default
#: (``open_runtime(max_tool_result=...)``): about 25,000 tokens.
DEFAULT_MAX_TOOL_RESULT: Final = 100_000

#: The most bytes `SpillDir.keep` writes into one directory in all, by default: a model that
#: asks for a 50 MB result again and again fills this much of the disk, no more.
MAX_SPILLED: Final = 1024**3

#: The most bytes one file a caller fills through `SpillDir.create` should hold, by default
#: (``LocalBashExecutor(max_spill=...)``: a bash stream's spill file): past it a stream is
#: counted, not kept. A background `yes` writes about 1.3 GB a second.
MAX_SPILL_FILE: Final = 256 * 1024**2

#: The characters of a text's end a cut keeps (at most a tenth of its limit).
TAIL: Final = 1_000

_MARKER: Final = re.compile(r"^\[\d+ of \d+ characters were cut here; [^\n]*\]$", re.M)


class SpillDir:
    """A private directory of spill files; nothing exists until the first file is made.

    Safe to use from worker threads (a long result is written from one).
    After `close` no file can be made (`OSError`), so a thread abandoned by a
    cancel cannot leave a directory behind. `keep` writes at most `budget`
    bytes in all. A file a caller of `create` fills is its own to bound, to at
    most `file_cap` bytes (not enforced here: the caller writes it, and knows
    what to count instead).
    """

    __slots__ = ("_closed", "_lock", "_path", "_prefix", "_spent", "budget", "file_cap")

    def __init__(
        self, prefix: str, budget: int = MAX_SPILLED, *, file_cap: int = MAX_SPILL_FILE
    ) -> None:
        self._prefix = prefix
        self.file_cap = file_cap
        self._path: str | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.budget = budget
        self._spent = 0

    def create(self, suffix: str) -> tuple[int, str]:
        """A new empty file, open for writing (its descriptor, its path); raises `OSError`."""
        with self._lock:
            if self._closed:
                raise OSError(f"the spill directory {self._path or self._prefix!r} is closed")
            if self._path is None:
                self._path = tempfile.mkdtemp(prefix=self._prefix)  # mode 0700
            path = os.path.join(self._path, f"{secrets.token_hex(8)}{suffix}")
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path

    def keep(self, text: str, suffix: str = ".txt") -> str:
        """Write all of `text` (UTF-8) to a new file; its path. A failed write leaves no file;
        one past the budget is not begun (`OSError` saying so)."""
        data = text.encode("utf-8", "replace")
        with self._lock:
            if self._spent + len(data) > self.budget:
                raise OSError(
                    f"{len(data):,} bytes would take the spill files past their budget of"
                    f" {self.budget:,} bytes"
                )
            self._spent += len(data)
        try:
            fd, path = self.create(suffix)
        except OSError:
            self._refund(len(data))
            raise
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            self._refund(len(data))
            raise
        finally:
            os.close(fd)
        return path

    def files(self) -> list[str]:
        """The paths of the files in the directory now (none before the first is made)."""
        with self._lock:
            path = self._path
        if path is None:
            return []
        return [os.path.join(path, name) for name in os.listdir(path)]

    def _refund(self, size: int) -> None:
        with self._lock:
            self._spent -= size

    def close(self) -> None:
        """Remove the directory and every file in it; idempotent."""
        with self._lock:
            self._closed = True
            path, self._path = self._path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def cut(text: str, limit: int, whole: str) -> str:
    """`text` if it has at most `limit` characters; else `limit` of them, the last
    ``min(TAIL, limit // 10)`` from its end, and before those the marker line
    ``[N of M characters were cut here; <whole>]`` (`whole`: where the whole text is)."""
    if len(text) <= limit:
        return text
    tail = min(TAIL, limit // 10)
    marker = f"[{len(text) - limit} of {len(text)} characters were cut here; {whole}]"
    end = f"\n{text[len(text) - tail :]}" if tail else ""
    return f"{text[: limit - tail]}\n{marker}{end}"


def find_marker(text: str) -> str | None:
    """The first marker line in `text` (as `cut` writes it), or None."""
    found = _MARKER.search(text)
    return found.group(0) if found else None


class TextCap:
    """Cuts a text past `limit` characters, keeping the whole of it in a spill file first.

    ``option`` names the setting `limit` came from: a limit that is not a
    positive int is a `ValueError` naming it.
    """

    __slots__ = ("_spills", "limit")

    def __init__(self, limit: int, spills: SpillDir, *, option: str) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"{option} must be a positive number of characters, got {limit!r}")
        self.limit = limit
        self._spills = spills

    async def __call__(self, text: str) -> str:
        """`text` itself if short enough; else cut, the marker naming the spill file (or
        why none could be written). A cancel abandons the write (the file, if any, goes
        with its directory)."""
        if len(text) <= self.limit:
            return text
        try:
            path = await trio.to_thread.run_sync(self._spills.keep, text, abandon_on_cancel=True)
        except OSError as exc:
            return cut(text, self.limit, f"the whole text could not be kept: {exc}")
        return cut(text, self.limit, f"the whole text is in {path}")
