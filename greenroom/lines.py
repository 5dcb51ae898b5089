"""`LineBuffer`: bytes in, newline-terminated lines out, each bounded; no I/O (h11's way).

The reader of a stream feeds it what it receives and takes whole lines out;
the buffer never waits, reads or writes, so one buffer serves the ACP
reader (stdin, a socket) and the MCP stdio transport (a server's stdout)
alike, and is tested without either.

A line past the buffer's limit raises `LineTooLong`, or, given a `Dropped`, goes to it
piece by piece as it comes, never kept.
"""

from __future__ import annotations

from typing import Protocol


class LineTooLong(Exception):
    """A line grew past the buffer's limit. Raised once per such line, as soon as it is
    past the limit; the buffer then drops it, up to and with its newline (handing each
    piece to its `Dropped`, if it has one)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a line longer than {limit} bytes")


class Dropped(Protocol):
    """What sees every line past a buffer's limit go by, without the buffer keeping it.

    `feed` is called with the line's bytes in order, from its first, in pieces of any
    size (none of them to be kept: the buffer reuses them once `feed` returns); `end`
    once the line is over (at its newline, or at `LineBuffer.rest`: the end of input).
    """

    def feed(self, data: bytes | bytearray | memoryview) -> None: ...

    def end(self) -> None: ...


class LineBuffer:
    """A stream's bytes, cut into lines of at most `limit` bytes (without the newline).

    Each byte is searched for a newline once, however the stream is chunked,
    and a taken line's bytes are dropped in place, so reading a stream costs
    time linear in its size and memory of about one line plus one chunk; a
    line past the limit costs one chunk, whatever its length.
    """

    __slots__ = ("_buffer", "_dropped", "_limit", "_scanned", "_skipping")

    def __init__(self, limit: int, dropped: Dropped | None = None) -> None:
        self._limit = limit
        self._dropped = dropped
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self._skipping = False  # dropping the rest of a line past the limit

    def feed(self, data: bytes | bytearray) -> None:
        """Add what the stream gave."""
        self._buffer += data

    def next_line(self) -> bytes | None:
        """The next whole line (without its newline, maybe blank), or None until more is fed.
        Raises `LineTooLong` for a line past the limit (see there)."""
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n", self._scanned)
            if end < 0:
                if self._skipping:
                    self._drop(len(buffer))
                    return None
                self._scanned = len(buffer)
                if self._scanned > self._limit:
                    self._skipping = True
                    self._drop(len(buffer))
                    raise LineTooLong(self._limit)
                return None
            self._scanned = 0
            if self._skipping:
                self._drop(end, ended=True)
                continue
            if end > self._limit:
                self._drop(end, ended=True)
                raise LineTooLong(self._limit)
            line = bytes(buffer[:end])
            del buffer[: end + 1]  # cheap: a bytearray drops its head in place
            return line

    def rest(self) -> bytes:
        """At the end of input: what follows the last newline (the last line, if it lacked
        one; empty if nothing does, or if it is the rest of a line past the limit, which
        ends here)."""
        if self._skipping and self._dropped is not None:
            self._dropped.end()
        rest = b"" if self._skipping else bytes(self._buffer)
        self._buffer.clear()
        self._scanned = 0
        self._skipping = False
        return rest

    def _drop(self, end: int, *, ended: bool = False) -> None:
        """Drop the buffer's first `end` bytes, of a line past the limit (and its newline, if
        `ended`), handing them to the `Dropped` first."""
        buffer, dropped = self._buffer, self._dropped
        if dropped is not None:
            with memoryview(buffer) as view, view[:end] as piece:
                dropped.feed(piece)
            if ended:
                dropped.end()
        if ended:
            del buffer[: end + 1]
            self._skipping = False
        else:
            buffer.clear()
        self._scanned = 0
