"""`greenroom.acp.frames.FrameScan` alone: a line's top-level members, found by a streaming
scan, however the line is cut into pieces.

The oracle is the reader's own decode: for a frame msgspec can read, the scan
finds the id, the method and the reply members that `decode_frame` finds; nested
past what msgspec reads, the same as the frame before it was nested; for any
bytes at all, it never raises and the pieces it is fed in change nothing.
"""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import hypothesis.strategies as st
import msgspec
import pytest

from greenroom.acp.frames import (
    Bad,
    FrameScan,
    IncomingNotification,
    IncomingReply,
    IncomingRequest,
    Unread,
    decode_frame,
)

# Text that looks like members, so that a scan that reads inside strings is caught.
TRAPS = ['"id":"gr-1"', '{"method":"x"}', "]]]}", "[[{", "\\", '\\"', "\u00e9", '"result":1']

texts = st.text(max_size=12) | st.sampled_from(TRAPS)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["id", "method", "result", "a"]) | texts, inner)
    ),
    max_leaves=12,
)
ids = (
    st.none()
    | st.integers(-(2**70), 2**70)
    | st.text(max_size=16)
    | st.text(min_size=1100, max_size=1200)  # longer than any id a scan keeps
    | values
)
NAMES = ["jsonrpc", "id", "method", "params", "result", "error"]


def _escaped(name: str) -> str:
    """A member's name as JSON with every character escaped: the same name to a decoder (a
    character past the BMP as its UTF-16 surrogate pair, as JSON escapes it)."""
    units = name.encode("utf-16-be")
    pairs = (int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2))
    return '"' + "".join(f"\\u{unit:04x}" for unit in pairs) + '"'


@st.composite
def frames(draw: st.DrawFn) -> str:
    """A JSON object: some of a frame's members, some others, in any order and spacing, a
    name at times escaped, a value at times large (past the scan's window)."""
    members: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True)):
        members[name] = draw(ids if name == "id" else values)
    members |= draw(st.dictionaries(texts.filter(lambda t: t not in NAMES), values, max_size=3))
    order = draw(st.permutations(list(members)))
    colon, comma = draw(st.sampled_from([(":", ","), (": ", ", "), (" :\t", " ,  ")]))
    parts = []
    for name in order:
        key = _escaped(name) if draw(st.integers(0, 5)) == 0 else json.dumps(name)
        value = json.dumps(members[name], ensure_ascii=draw(st.booleans()))
        if name != "id" and draw(st.integers(0, 7)) == 0:  # past the scan's window
            n = draw(st.integers(0, 3000))
            value = draw(
                st.sampled_from(
                    [
                        "[" + ",".join(['"a\\"]"'] * n) + "]",
                        "[" * (n % 50) + value + "]" * (n % 50),  # not past the deep mark
                        "[" + ",".join(["[]"] * n) + "]",
                        json.dumps("x" * n * 3),
                    ]
                )
            )
        parts.append(key + colon + value)
    return "{" + comma.join(parts) + "}"


def scan(line: bytes, cuts: list[int] | None = None) -> tuple[object, ...]:
    """What a scan fed `line` in the pieces `cuts` makes finds."""
    scanner = FrameScan()
    edges = sorted(cuts or [])
    view = memoryview(line)
    for start, stop in zip([0, *edges], [*edges, len(line)], strict=True):
        scanner.feed(view[start:stop])
    scanner.end()
    return scanner.id, scanner.method, scanner.reply, scanner.deep


_id = msgspec.json.Decoder(int | str | None)


def decoded(line: bytes) -> tuple[object, ...]:
    """What the reader's decode finds in a frame it can read: id, method?, reply members?"""
    members = json.loads(line)
    try:
        usable = _id.decode(json.dumps(members["id"]).encode())
    except (KeyError, msgspec.DecodeError):
        usable = None
    frame = decode_frame(line)
    if isinstance(frame, IncomingRequest | IncomingReply | Bad) and frame.id is not None:
        assert frame.id == usable  # the oracle reads ids as the reader does
    return usable, "method" in members, "result" in members or "error" in members, None


def _kept(expected: tuple[object, ...]) -> tuple[object, ...]:
    """`expected` as a scan finds it: an id longer than it keeps is none."""
    if isinstance(expected[0], str) and len(expected[0]) >= 1100:
        return (None, *expected[1:])
    return expected


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(frames(), st.data())
def test_the_scan_finds_what_the_decoder_finds_in_any_pieces(
    text: str, data: st.DataObject
) -> None:
    line = text.encode()
    cuts = data.draw(st.lists(st.integers(0, len(line)), max_size=8))
    expected = _kept(decoded(line))
    found = scan(line, cuts)
    assert found[:3] == expected[:3]
    assert found == scan(line)


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(frames(), st.sampled_from([*NAMES, "other"]), st.data())
def test_nested_too_deep_to_decode_it_finds_the_same_and_names_the_deep_member(
    text: str, member: str, data: st.DataObject
) -> None:
    shallow = json.loads(text)
    depth = data.draw(st.integers(10_000, 50_000))  # past any recursion limit hypothesis sets
    deep = text[:-1] + ("," if shallow else "") + f'"{member}":' + "[" * depth + "]" * depth + "}"
    line = deep.encode()
    with pytest.raises(RecursionError):
        json.loads(line)
    cuts = data.draw(st.lists(st.integers(0, len(line)), max_size=8))
    shallow[member] = []
    expected = decoded(json.dumps(shallow).encode())
    expected = _kept(expected)
    assert scan(line, cuts) == (*expected[:3], member)
    frame = decode_frame(line)
    if expected[2] and not expected[1]:
        assert frame == Unread(expected[0], "the client's reply is nested too deep to decode")
    else:
        assert isinstance(frame, Bad)
        assert (frame.id, frame.code) == (expected[0], -32602 if member == "params" else -32600)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.binary(max_size=2000) | frames().map(str.encode), st.data())
def test_any_bytes_in_any_pieces_scan_alike_and_never_raise(
    line: bytes, data: st.DataObject
) -> None:
    if data.draw(st.booleans()):  # cut short: a line that ends inside a string, an escape, a value
        line = line[: data.draw(st.integers(0, len(line)))]
    cuts = data.draw(st.lists(st.integers(0, len(line)), max_size=8))
    assert scan(line, cuts) == scan(line)


def test_a_member_past_the_sixty_fourth_is_not_looked_at() -> None:
    members = ",".join(f'"m{i}":{i}' for i in range(63))
    assert scan(b'{%s,"id":"gr-1"}' % members.encode())[0] == "gr-1"
    assert scan(b'{%s,"m":0,"id":"gr-1"}' % members.encode())[0] is None


def test_a_notification_or_request_is_still_read_as_one() -> None:
    line = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}'
    assert isinstance(decode_frame(line), IncomingNotification)
    assert scan(line) == (None, True, False, None)
