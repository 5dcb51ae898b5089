"""Frames in: a byte stream cut into lines, and each line decoded into what it is.

`decode_frame` never raises: whatever a peer sends (any bytes, any JSON, any
nesting, any size up to `MAX_FRAME`) comes back as a `Request`, a
`Notification`, a `Reply` to a request of ours, or a `Bad` frame carrying
the JSON-RPC error to answer it with (and the id to answer, when the frame
had a usable one). A line past `MAX_FRAME` is never decoded: `dropped` tells
what it was from its start (a reply to fail, or a frame to answer).
`read_lines` hands every newline-terminated line to its callback, and the
last one at end of input even without its newline.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, NamedTuple

import msgspec
import trio

from greenroom.lines import LineBuffer, LineTooLong
from greenroom.protocol.acp import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, RequestId

#: The longest frame the reader accepts; a longer line is answered with an error and skipped.
MAX_FRAME: Final = 8 * 1024 * 1024


class Request(NamedTuple):
    id: RequestId
    method: str
    params: msgspec.Raw


class Notification(NamedTuple):
    method: str
    params: msgspec.Raw


class Reply(NamedTuple):
    """A peer's answer to a request greenroom sent (``result`` or ``error`` is set)."""

    id: RequestId
    result: msgspec.Raw | msgspec.UnsetType
    error: msgspec.Raw | msgspec.UnsetType


class Bad(NamedTuple):
    """A frame to answer with this error; ``id`` is None when the frame had no usable id."""

    id: RequestId
    code: int
    message: str


Frame = Request | Notification | Reply | Bad

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
            return Reply(request_id, envelope.result, envelope.error)
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
        return Notification(method, params)
    return Request(request_id, method, params)


# Strings whole (so brackets inside them are skipped), and the structural bytes.
_TOKEN: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[][{},:]')
#: Nesting past this, under a top-level member, names that member as the deep one.
_DEEP: Final = 64


class _Members(NamedTuple):
    id: RequestId  # the top-level id, if it is a usable one
    keys: frozenset[bytes]  # the top-level members' names, quoted as in the frame
    deep_key: bytes | None  # the member whose value nests past _DEEP


def _members(line: bytes) -> _Members:
    """The top-level object's members, found by a scan without recursion (of a whole
    frame, or of the start of one: a member the start cuts is not found)."""
    depth = 0
    key = value_key = deep_key = None
    keys: set[bytes] = set()
    value_from = 0
    request_id: RequestId = None
    previous = b""
    for match in _TOKEN.finditer(line):
        token = match.group()
        head = token[:1]
        if head in (b"{", b"["):
            depth += 1
            if depth == _DEEP + 1 and deep_key is None:
                deep_key = value_key
        elif head in (b"}", b"]"):
            if depth == 1 and value_key == b'"id"':
                request_id = _scalar_id(line[value_from : match.start()])
            depth -= 1
        elif depth != 1:
            pass
        elif head == b'"' and previous in (b"{", b","):
            key = token
        elif head == b":":
            value_key, value_from = key, match.end()
            if key is not None:
                keys.add(key)
        elif head == b",":
            if value_key == b'"id"':
                request_id = _scalar_id(line[value_from : match.start()])
            value_key = None
        if depth <= 1:
            previous = head
    return _Members(request_id, frozenset(keys), deep_key)


def _too_deep(line: bytes) -> Bad:
    """A frame too deeply nested to decode: answer it, with its id if a scan finds one.

    The member whose value holds the nesting decides the code (``params``: -32602).
    """
    members = _members(line)
    if members.deep_key == b'"params"':
        return Bad(members.id, INVALID_PARAMS, "invalid params: nested too deep to decode")
    return Bad(members.id, INVALID_REQUEST, "a frame nested too deep to decode")


class Dropped(NamedTuple):
    """A line over `MAX_FRAME`, dropped unread, as far as its start tells.

    ``reply`` when the start names no method but a result or an error: the
    peer's answer to ``id``, a request of ours, to be failed rather than
    answered. Otherwise a frame to answer with ``message`` (``id`` None when
    the start holds no usable one, say when a long member comes first).
    """

    id: RequestId
    reply: bool
    message: str


_REPLY_KEYS: Final = frozenset((b'"result"', b'"error"'))


def dropped(head: bytes) -> Dropped:
    """What a line over `MAX_FRAME` whose first bytes are `head` was; never raises."""
    members = _members(head)
    limit = f"a frame longer than {MAX_FRAME:,} bytes, the most greenroom reads"
    if b'"method"' not in members.keys and members.keys & _REPLY_KEYS:
        return Dropped(members.id, True, f"the client's reply is {limit}: dropped unread")
    return Dropped(members.id, False, f"{limit}: dropped unread")


def _scalar_id(raw: bytes) -> RequestId:
    try:
        request_id: RequestId = _id.decode(raw)
        return request_id
    except msgspec.DecodeError:
        return None


async def read_lines(
    stream: trio.abc.ReceiveStream,
    on_line: Callable[[bytes], None],
    on_oversized: Callable[[Dropped], None],
) -> None:
    """Call `on_line` with each line of `stream` until end of input (blank lines skipped).

    A line longer than `MAX_FRAME` is dropped: `on_oversized` is called once
    for it, as soon as it is past the limit, with what its start says it was
    (`dropped`). A last line without its newline still counts.
    """
    lines = LineBuffer(MAX_FRAME)
    while chunk := await stream.receive_some(65536):
        lines.feed(chunk)
        while True:
            try:
                line = lines.next_line()
            except LineTooLong as exc:
                on_oversized(dropped(exc.head))
                continue
            if line is None:
                break
            if line.strip():
                on_line(line)
    if (rest := lines.rest()).strip():
        on_line(rest)
