"""`LineBuffer`: bytes in, newline-terminated lines out, each bounded; no I/O (h11's way).

The reader of a stream feeds it what it receives and takes whole lines out;
the buffer never waits, reads or writes, so one buffer serves the ACP
reader (stdin, a socket) and the MCP stdio transport (a server's stdout)
alike, and is tested without either.
"""

from __future__ import annotations

from typing import Final

#: How much of a line past the limit its `LineTooLong` keeps: enough for a frame's leading
#: members (a JSON-RPC id), never the line.
HEAD: Final = 4096


class LineTooLong(Exception):
    """A line grew past the buffer's limit. Raised once per such line, as soon as it is
    past the limit; the buffer then drops it, up to and with its newline.

    ``head`` is the line's first `HEAD` bytes (a reader may scan it, say for an id to
    answer); the rest is gone.
    """

    def __init__(self, limit: int, head: bytes) -> None:
        super().__init__(f"a line longer than {limit} bytes")
        self.head = head


class LineBuffer:
    """A stream's bytes, cut into lines of at most `limit` bytes (without the newline).

    Each byte is searched for a newline once, however the stream is chunked,
    and a taken line's bytes are dropped in place, so reading a stream costs
    time linear in its size and memory of about one line plus one chunk.
    """

    __slots__ = ("_buffer", "_limit", "_scanned", "_skipping")

    def __init__(self, limit: int) -> None:
        self._limit = limit
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
                    buffer.clear()
                    self._scanned = 0
                    return None
                self._scanned = len(buffer)
                if self._scanned > self._limit:
                    self._skipping = True
                    head = bytes(buffer[:HEAD])
                    buffer.clear()
                    self._scanned = 0
                    raise LineTooLong(self._limit, head)
                return None
            self._scanned = 0
            if self._skipping:
                del buffer[: end + 1]
                self._skipping = False
                continue
            if end > self._limit:
                head = bytes(buffer[: min(end, HEAD)])
                del buffer[: end + 1]
                raise LineTooLong(self._limit, head)
            line = bytes(buffer[:end])
            del buffer[: end + 1]  # cheap: a bytearray drops its head in place
            return line

    def rest(self) -> bytes:
        """At the end of input: what follows the last newline (the last line, if it lacked
        one; empty if nothing does, or if it is the rest of a line past the limit)."""
        rest = b"" if self._skipping else bytes(self._buffer)
        self._buffer.clear()
        self._scanned = 0
        self._skipping = False
        return rest
