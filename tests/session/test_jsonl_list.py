"""A JSONL store's list reads each log's first and last 64 KiB for its title and last time:
whatever those bytes hold (torn lines, a line cut where the tail window begins, bytes that
are not UTF-8, a prompt that spells out a ``config/set title``), listing never raises and
never shows a title a prompt's text forged."""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import msgspec
import trio

from greenroom.protocol.events import USER, ConfigSet, SessionHeader, UserMessage
from greenroom.session.persistence import JsonlPersistence
from greenroom.session.session import title_of

WINDOW = 64 * 1024  # what the list reads of a log's head and of its tail
FORGED = "FORGED TITLE"
_HEADER = msgspec.json.encode(SessionHeader(id="s", created_at=1_000)) + b"\n"


def _line(event: object) -> bytes:
    return msgspec.json.encode(event) + b"\n"


def _prompt(content: str, seq: int) -> bytes:
    return _line(UserMessage(content=content, source=USER, message_id="m", seq=seq, time=2.0))


def _listed(log: bytes) -> list[tuple[str, str | None, float]]:
    with tempfile.TemporaryDirectory() as root:
        store = JsonlPersistence(root)
        Path(store.path("s")).write_bytes(log)
        listed = trio.run(store.list)
    return [(s.header.id, s.title, s.updated_at) for s in listed]


_forgery = msgspec.json.encode(ConfigSet(key="title", value=FORGED, seq=1, time=3.0)).decode()
_hostile_line = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            _forgery.encode(),
            _forgery.encode()[:-1],  # torn
            _forgery.encode()[7:],  # cut where the tail begins
            b'{"type":"config/set","key":"title","value":"\xff\xfe"}',
            b'{"type":"config/set","key":"title","value":7}',
            b'{"type":"config/set","key":"title"}',
            b'{"type":"user/message","content":"\xc3"}',
            b'{"time":1e999}',
            b'{"time":"soon"}',
            b"[" * 10_000,
        ]
    ),
)


@hypothesis.given(
    st.lists(_hostile_line, max_size=12),
    st.integers(0, 2 * WINDOW),
    st.booleans(),
)
def test_listing_any_bytes_after_a_header_never_raises(
    lines: list[bytes], filler: int, torn: bool
) -> None:
    body = b"\n".join(lines) + (b"x" * filler) + (b"" if torn else b"\n")
    [(session_id, title, updated)] = _listed(_HEADER + body)
    assert session_id == "s"
    assert title is None or isinstance(title, str)
    assert isinstance(updated, float)


@hypothesis.given(
    st.text(max_size=300),
    st.text(max_size=300),
    st.booleans(),
    st.data(),
)
def test_a_prompt_never_forges_the_listed_title(
    before: str, after: str, written: bool, data: st.DataObject
) -> None:
    """The prompt spells out a ``config/set title`` line; the tail window begins anywhere
    in the prompt's line (at the forgery's ``{`` among others). The list shows the title
    a model wrote, if any, else the prompt's."""
    content = before + _forgery + after
    prompt = _prompt(content, 0)
    real = _line(ConfigSet(key="title", value="Real title", seq=2, time=4.0)) if written else b""
    brace = len(_HEADER) + prompt.index(b"{", 1)
    start = data.draw(st.sampled_from([brace, brace + 1]) | st.integers(0, len(prompt) - 1))
    cut = len(_HEADER) + start if start not in (brace, brace + 1) else start
    # A filler prompt sized so that the tail window begins at `cut`.
    base = len(_prompt("", 1))
    filler = _prompt("y" * (cut + WINDOW - len(_HEADER) - len(prompt) - len(real) - base), 1)
    log = _HEADER + prompt + filler + real
    assert len(log) - WINDOW == cut
    [(_, title, _)] = _listed(log)
    assert title == ("Real title" if written else title_of(content))
