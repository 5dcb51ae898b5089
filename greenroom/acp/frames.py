"""Frames in: a byte stream cut into lines, and each line decoded into what it is.

`decode_frame` never raises: whatever a peer sends (any bytes, any JSON, any
nesting, any size up to `MAX_FRAME`) comes back as an `IncomingRequest`, an
`IncomingNotification`, an `IncomingReply` to a request of ours, an `Unread`
reply (one nested too deep to decode: it fails the request it answers), or a
`Bad` frame carrying the JSON-RPC error to answer it with (and the id to
answer, when the frame had a usable one); what greenroom sends is
`greenroom.protocol.acp`'s. A line past `MAX_FRAME` is never decoded nor
kept: `FrameScan` reads its members as it goes by, and `dropped` tells what
it was (a reply to fail, or a frame to answer). `read_lines` hands
every newline-terminated line to its callback as a frame, and the last one
at end of input even without its newline.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Final, NamedTuple

import msgspec
import trio

from greenroom.lines import LineBuffer, LineTooLong
from greenroom.protocol.acp import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, RequestId

#: The longest frame the reader accepts; a longer line is answered with an error and skipped.
MAX_FRAME: Final = 8 * 1024 * 1024
#: The least frame limit a server may be given (``greenroom serve --max-frame``): below it
#: a client's ``initialize`` with its capabilities and a short prompt might not fit.
MIN_FRAME: Final = 4096


class IncomingRequest(NamedTuple):
    id: RequestId
    method: str
    params: msgspec.Raw


class IncomingNotification(NamedTuple):
    method: str
    params: msgspec.Raw


class IncomingReply(NamedTuple):
    """A peer's answer to a request greenroom sent (``result`` or ``error`` is set)."""

    id: RequestId
    result: msgspec.Raw | msgspec.UnsetType
    error: msgspec.Raw | msgspec.UnsetType


class Unread(NamedTuple):
    """A reply of the peer's that could not be read (too large, or nested too deep): it fails
    the request of ours it answers, saying ``why``."""

    id: RequestId
    why: str


class Bad(NamedTuple):
    """A frame to answer with this error; ``id`` is None when the frame had no usable id."""

    id: RequestId
    code: int
    message: str


Frame = IncomingRequest | IncomingNotification | IncomingReply | Unread | Bad

NO_PARAMS: Final = msgspec.Raw(b"{}")


class _Envelope(msgspec.Struct, gc=False):
    """A JSON-RPC frame with every member left raw, so each is checked on its own."""

    jsonrpc: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    id: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    method: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_envelope = msgspec.json.Decoder(_Envelope)
_id = msgspec.json.Decoder(int | str | None)
_version = msgspec.json.Decoder(object)
_method = msgspec.json.Decoder(str)


def decode_frame(line: bytes) -> Frame:
    """What `line` (one frame, without its newline) is; never raises."""
    try:
        envelope = _envelope.decode(line)
    except msgspec.ValidationError:
        if line.lstrip()[:1] == b"[":
            return Bad(None, INVALID_REQUEST, "a frame must be one JSON-RPC object (no batches)")
        return Bad(None, INVALID_REQUEST, "a frame must be one JSON-RPC object")
    except msgspec.DecodeError as exc:
        return Bad(None, PARSE_ERROR, f"not JSON: {exc}")
    except RecursionError:
        return _too_deep(line)
    try:
        return _classify(envelope)
    except msgspec.DecodeError as exc:  # invalid UTF-8 inside the id or the method
        return Bad(None, PARSE_ERROR, f"not JSON: {exc}")


def _classify(envelope: _Envelope) -> Frame:
    request_id: RequestId = None
    if envelope.id is not msgspec.UNSET:
        try:
            request_id = _id.decode(envelope.id)
        except msgspec.ValidationError:
            return Bad(
                None,
                INVALID_REQUEST,
                f"id must be a string, an integer or null, got {bytes(envelope.id)[:40]!r}",
            )
    if envelope.method is msgspec.UNSET:
        if envelope.id is not msgspec.UNSET and (
            envelope.result is not msgspec.UNSET or envelope.error is not msgspec.UNSET
        ):
            return IncomingReply(request_id, envelope.result, envelope.error)
        return Bad(request_id, INVALID_REQUEST, "a frame needs a method (or is a response)")
    try:
        method = _method.decode(envelope.method)
    except msgspec.ValidationError:
        return Bad(request_id, INVALID_REQUEST, "method must be a string")
    # Checked on what the peer asks, not on its replies to us: a sloppy reply still
    # settles the request it answers.
    if envelope.jsonrpc is msgspec.UNSET or _version.decode(envelope.jsonrpc) != "2.0":
        return Bad(request_id, INVALID_REQUEST, 'jsonrpc must be "2.0"')
    params = NO_PARAMS if envelope.params is msgspec.UNSET else envelope.params
    if envelope.id is msgspec.UNSET:
        return IncomingNotification(method, params)
    return IncomingRequest(request_id, method, params)


# -- frames too large or too deep to decode -------------------------------------------------

#: At the top level: a string's opening quote, or a structural byte.
_TOP: Final = re.compile(rb'["{}\[\],:]')
#: Inside a member's value: a string's opening quote, or a run of brackets.
_NESTED: Final = re.compile(rb'"|[{\[]+|[}\]]+')
#: A string's body: up to its closing quote, the end of the piece, or a backslash ending it.
_BODY: Final = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
#: Whole strings, found from outside one (so always in step: a quote it meets opens one).
_STRINGS: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS: Final = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))
_QUOTE, _BACKSLASH, _COLON, _OBJECT = b'"'[0], b"\\"[0], b":"[0], b"{"[0]
_OPEN, _CLOSE, _KEY_BEFORE = frozenset(b"{["), frozenset(b"}]"), frozenset(b"{,")
#: Nesting past this, under a top-level member, names that member as the deep one.
_DEEP: Final = 64
#: The most bytes of a member's name or of an id a scan keeps: a longer name is none it looks
#: for, a longer id not one to answer with (greenroom's own are a few bytes).
_KEPT: Final = 1024
#: The most top-level members a scan reads: a JSON-RPC frame has three or four, so past
#: these the line is no frame, and the rest of it is not looked at.
_MEMBERS: Final = 64
#: Inside a member's value the scan takes this many bytes at a time in bulk (strings
#: dropped, brackets counted), byte by byte only the stretch where the value ends.
_WINDOW: Final = 4096

_name = msgspec.json.Decoder(str)


class FrameScan:
    """A frame's top-level members as far as a scan tells, for a line that cannot be decoded:
    one past `MAX_FRAME`, or nested too deep.

    Fed the line in pieces of any size (`feed`), then told its end (`end`), it keeps
    the same few fields whatever the line's size or nesting: the depth, whether it is
    inside a string, and at most `_KEPT` bytes of the member name or the id being read;
    never the line. It tells the top-level ``id`` (a string, an integer or null; None
    when there is none, or none usable), whether a ``method`` is named, whether a
    ``result`` or an ``error`` is (`answers`: a reply, when no method is), and
    ``deep``, the member whose value nests past `_DEEP` levels. Strings are skipped
    whole, escapes and all, so nothing inside a value is taken for a member, and so is
    every member's value: in bulk, at C speed, but for the stretch where it ends. At
    most `_MEMBERS` top-level members are read, so the work done a byte at a time is
    bounded whatever the line. Never raises; a line that is not a JSON object has no
    members.
    """

    __slots__ = (
        "_depth",
        "_escaped",
        "_in_string",
        "_kept",
        "_key",
        "_members",
        "_previous",
        "_value_key",
        "deep",
        "id",
        "method",
        "reply",
    )

    def __init__(self) -> None:
        self._depth = 0  # -1 once the top-level object is over (or there is none)
        self._in_string = False
        self._escaped = False  # a piece ended inside a string's escape
        self._previous = 0  # the last structural byte at the top level
        self._kept: bytearray | None = None  # a member's name, or the id's value, being read
        self._key: str | None = None  # the name just read
        self._value_key: str | None = None  # the member whose value is being read
        self._members = 0
        self.id: RequestId = None
        self.method = False
        self.reply = False
        self.deep: str | None = None

    @property
    def answers(self) -> bool:
        """The frame is a reply: it names no method, but a result or an error."""
        return self.reply and not self.method

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Scan the next piece of the line (not kept once this returns)."""
        position, end = 0, len(data)
        bytewise = 0  # inside a value, scanned byte by byte up to here (where it ends)
        while position < end and self._depth >= 0:
            if self._in_string:
                position = self._string(data, position, end)
            elif self._depth <= 1:
                position = self._top(data, position, end)
            elif position < bytewise:
                position = self._nested(data, position, bytewise)
            else:
                position, bytewise = self._skip(data, position, end)

    def end(self) -> FrameScan:
        """The line is over (an id at its very end, unclosed, still counts); returns itself."""
        if not self._in_string and self._depth == 1:
            self._value_end()
        return self

    def _keep(self, piece: bytes | bytearray | memoryview) -> None:
        kept = self._kept
        if kept is not None and len(kept) <= _KEPT:
            kept += piece[: _KEPT + 1 - len(kept)]  # one byte past: too long to be used

    def _string(self, data: bytes | bytearray | memoryview, position: int, end: int) -> int:
        if self._escaped:
            self._escaped = False
            self._keep(data[position : position + 1])
            position += 1
        stop = _body_end(data, position, end)
        if stop == end or data[stop] == _BACKSLASH:  # the string goes on in the next piece
            self._keep(data[position:end])
            self._escaped = stop < end
            return end
        self._keep(data[position : stop + 1])
        self._in_string = False
        if self._kept is not None and self._value_key is None:  # a member's name
            name, self._kept = bytes(self._kept), None
            self._key = None
            if len(name) <= _KEPT:
                with contextlib.suppress(msgspec.DecodeError):
                    self._key = _name.decode(name)
        return stop + 1

    def _top(self, data: bytes | bytearray | memoryview, position: int, end: int) -> int:
        match = _TOP.search(data, position, end)
        at = end if match is None else match.start()
        self._keep(data[position:at])  # the id's bytes, if it is not a string
        if match is None:
            return end
        byte = data[at]
        if self._depth == 0:
            self._depth = 1 if byte == _OBJECT else -1
        elif byte == _QUOTE:
            self._in_string = True
            if self._previous in _KEY_BEFORE:
                self._kept, self._value_key = bytearray(b'"'), None
            else:
                self._keep(b'"')
        elif byte in _OPEN:
            self._depth = 2
            if self._value_key == "id":
                self._kept = None  # an object or an array: no usable id
        elif byte in _CLOSE:
            self._value_end()
            self._depth = -1
        elif byte == _COLON:
            self._members += 1
            if self._members > _MEMBERS:
                self._depth = -1
                return end
            key = self._value_key = self._key
            self._key = None
            if key == "method":
                self.method = True
            elif key in ("result", "error"):
                self.reply = True
            elif key == "id":
                self.id = None
                self._kept = bytearray()
        else:  # a comma
            self._value_end()
        self._previous = byte
        return at + 1

    def _nested(self, data: bytes | bytearray | memoryview, position: int, end: int) -> int:
        """A value's last stretch, a token (a string's start, a run of brackets) at a time."""
        match = _NESTED.search(data, position, end)
        if match is None:
            return end
        at, stop = match.span()
        byte = data[at]
        if byte == _QUOTE:
            self._in_string = True
        elif byte in _OPEN:
            self._depth += stop - at
            if self._depth > _DEEP + 1 and self.deep is None:
                self.deep = self._value_key
        else:
            self._depth -= stop - at
            if self._depth <= 0:
                self._depth = -1  # the top-level object closed with the value
            elif self._depth == 1:
                self._previous = b"]"[0]
        return stop

    def _skip(
        self, data: bytes | bytearray | memoryview, position: int, end: int
    ) -> tuple[int, int]:
        """Inside a value: the next `_WINDOW` bytes in bulk if the value goes on past them
        (returns where they end, and 0); else ``(position, where they end)``, for
        `_nested` to find where the value ends."""
        stop = min(position + _WINDOW, end)
        rest = _STRINGS.sub(b"", data[position:stop])
        tail = rest.find(b'"')  # a string the window ends inside: its other quotes are escaped
        brackets = (rest if tail < 0 else rest[:tail]).translate(None, _NOT_BRACKETS)
        closes = brackets.count(b"]") + brackets.count(b"}")
        depth, opens = self._depth, len(brackets) - closes
        may_end = depth - closes <= 1
        may_deepen = self.deep is None and depth + opens > _DEEP + 1
        if may_end or may_deepen:
            walk = list(accumulate(map(_STEPS.__getitem__, brackets)))  # depth, less `depth`
            if may_end and depth + min(walk) <= 1:
                return position, stop
            if may_deepen and depth + max(walk) > _DEEP + 1:
                self.deep = self._value_key
        self._depth = depth + opens - closes
        if tail >= 0:
            self._in_string = True
            self._escaped = _body_end(rest, tail + 1, len(rest)) < len(rest)
        return stop, 0

    def _value_end(self) -> None:
        if self._value_key == "id":
            kept, self._kept = self._kept, None
            if kept is not None and len(kept) <= _KEPT:
                self.id = _scalar_id(bytes(kept))
        self._value_key = None


def _body_end(data: bytes | bytearray | memoryview, position: int, end: int) -> int:
    """Where a string's body from `position` stops: at its closing quote, at `end`, or at a
    backslash that `end` cuts from what it escapes."""
    match = _BODY.match(data, position, end)
    assert match is not None  # an empty body matches
    return match.end()


def _too_deep(line: bytes) -> Frame:
    """A frame too deeply nested to decode: a reply fails the request it answers; anything
    else is answered, with its id if the scan finds one, -32602 if the nesting is in
    ``params``."""
    scan = FrameScan()
    scan.feed(line)
    scan.end()
    if scan.answers:
        return Unread(scan.id, "the client's reply is nested too deep to decode")
    if scan.deep == "params":
        return Bad(scan.id, INVALID_PARAMS, "invalid params: nested too deep to decode")
    return Bad(scan.id, INVALID_REQUEST, "a frame nested too deep to decode")


def dropped(scan: FrameScan, most: int = MAX_FRAME) -> Unread | Bad:
    """What a line over `most` bytes (`MAX_FRAME` unless a server sets its own), scanned
    whole as it went by, was."""
    limit = f"a frame longer than {most:,} bytes, the most greenroom reads"
    if scan.answers:
        return Unread(scan.id, f"the client's reply is {limit}: dropped unread")
    return Bad(scan.id, INVALID_REQUEST, f"{limit}: dropped unread")


def _scalar_id(raw: bytes) -> RequestId:
    try:
        request_id: RequestId = _id.decode(raw)
        return request_id
    except msgspec.DecodeError:
        return None


class _Oversized:
    """The reader's `greenroom.lines.Dropped`: each line past `MAX_FRAME` scanned as it goes
    by, and told as a frame (`dropped`) once it ends."""

    __slots__ = ("_on_frame", "_scan")

    def __init__(self, on_frame: Callable[[Frame], None]) -> None:
        self._on_frame = on_frame
        self._scan = FrameScan()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._scan.feed(data)

    def end(self) -> None:
        scan, self._scan = self._scan, FrameScan()
        self._on_frame(dropped(scan.end()))


async def read_lines(stream: trio.abc.ReceiveStream, on_frame: Callable[[Frame], None]) -> None:
    """Call `on_frame` with each line of `stream`, decoded (`decode_frame`), until end of
    input (blank lines skipped); a last line without its newline still counts.

    A line longer than `MAX_FRAME` is never kept: it is scanned as it goes by
    (`FrameScan`) and, once it ends, told as what the scan found (`dropped`).
    """
    lines = LineBuffer(MAX_FRAME, _Oversized(on_frame))
    while chunk := await stream.receive_some(65536):
        lines.feed(chunk)
        while True:
            try:
                line = lines.next_line()
            except LineTooLong:
                continue  # told once it ends
            if line is None:
                break
            if line.strip():
                on_frame(decode_frame(line))
    if (rest := lines.rest()).strip():
        on_frame(decode_frame(rest))
