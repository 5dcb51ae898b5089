"""`greenroom.lines.LineBuffer` alone: bytes in, bounded lines out, however they are chunked."""

from __future__ import annotations

import tracemalloc

import hypothesis
import hypothesis.strategies as st
import pytest

from greenroom.lines import LineBuffer, LineTooLong


def drain(buffer: LineBuffer) -> list[bytes | str]:
    """Every line the buffer holds now, with "too long" for each refused one."""
    out: list[bytes | str] = []
    while True:
        try:
            line = buffer.next_line()
        except LineTooLong:
            out.append("too long")
            continue
        if line is None:
            return out
        out.append(line)


def read(chunks: list[bytes], limit: int) -> list[bytes | str]:
    buffer = LineBuffer(limit)
    out: list[bytes | str] = []
    for chunk in chunks:
        buffer.feed(chunk)
        out += drain(buffer)
    if rest := buffer.rest():
        out.append(rest)
    return out


def test_lines_come_out_whole_and_the_last_one_counts_without_its_newline() -> None:
    assert read([b"one\ntw", b"o\n\nthr", b"ee"], limit=10) == [b"one", b"two", b"", b"three"]


def test_a_line_past_the_limit_is_refused_once_and_the_next_one_served() -> None:
    assert read([b"12345678901\nok\n"], limit=10) == ["too long", b"ok"]
    # Refused as soon as it is past the limit, not when its newline comes.
    buffer = LineBuffer(10)
    buffer.feed(b"x" * 11)
    assert drain(buffer) == ["too long"]
    buffer.feed(b"x" * 1000)
    assert drain(buffer) == []  # the rest of it is dropped as it comes
    buffer.feed(b"xx\nnext\n")
    assert drain(buffer) == [b"next"]
    assert buffer.rest() == b""


def test_a_line_of_exactly_the_limit_is_taken() -> None:
    assert read([b"x" * 10 + b"\n", b"y" * 10], limit=10) == [b"x" * 10, b"y" * 10]


def test_the_tail_of_a_refused_line_at_the_end_of_input_is_not_a_line() -> None:
    assert read([b"ok\n" + b"x" * 50], limit=10) == [b"ok", "too long"]


@hypothesis.given(
    st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20),
    st.data(),
)
def test_any_chunking_gives_the_same_lines(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    expected = [line if len(line) <= 20 else "too long" for line in lines]
    assert read(chunks, limit=20) == expected


class Recorder:
    """A `Dropped` that records what it was fed, and how much at most at once."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.piece = bytearray()
        self.largest = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self.piece += data
        self.largest = max(self.largest, len(data))

    def end(self) -> None:
        self.lines.append(bytes(self.piece))
        self.piece.clear()


@pytest.mark.parametrize("chunk", [7, 100, 1_000_000])  # past the limit before, or with, its end
def test_a_line_past_the_limit_goes_by_its_dropped_whole_and_is_not_kept(chunk: int) -> None:
    line = bytes(b for b in range(256) if b != 10) * 40 + b"z" * 10_000  # 20,200 bytes
    recorder = Recorder()
    buffer = LineBuffer(20_000, recorder)
    data = b"ok\n" + line + b"\nnext\n" + line
    taken: list[bytes | str] = []
    for start in range(0, len(data), chunk):
        buffer.feed(data[start : start + chunk])
        taken += drain(buffer)
    assert buffer.rest() == b""  # the last one ends with the input
    assert taken == [b"ok", "too long", b"next", "too long"]
    assert recorder.lines == [line, line]
    if chunk < 20_000:  # once past the limit, a piece at a time
        assert recorder.largest <= 20_000 + chunk


class Counter:
    """A `Dropped` that counts what goes by, and keeps none of it."""

    def __init__(self) -> None:
        self.fed = 0
        self.ended = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self.fed += len(data)

    def end(self) -> None:
        self.ended += 1


def test_a_line_far_past_the_limit_costs_the_limit_and_a_chunk() -> None:
    counter = Counter()
    buffer = LineBuffer(1_000_000, counter)
    chunk = b"y" * 65536
    tracemalloc.start()
    try:
        for _ in range(800):  # 52 MB, one line
            buffer.feed(chunk)
            assert drain(buffer) in ([], ["too long"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000 + 4 * 65536
    buffer.feed(b"\nnext\n")
    assert drain(buffer) == [b"next"]
    assert (counter.fed, counter.ended) == (800 * 65536, 1)
