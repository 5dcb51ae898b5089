"""`JsonlPersistence`: one JSON-lines file per session (the embedded default).

Line 1 is the `SessionHeader` (``"type": "session"``), then one event per
line. Only a line that ends in a newline counts: a crash mid-write leaves at
most one torn line at the end, which `load` drops. File I/O runs in worker
threads (`trio.to_thread.run_sync`), one session at a time per session.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TypeAlias

import msgspec
import trio

from greenroom.protocol.events import SESSION_VERSION, SessionEvent, SessionHeader, TurnEnd
from greenroom.session.persistence.base import (
    CorruptLog,
    NotASessionLog,
    PersistenceError,
    SeqMismatch,
    SessionExists,
    SessionNotFound,
    UnsupportedVersion,
    repair,
)
from greenroom.session.store import check_session_id

logger = logging.getLogger("greenroom.persistence")

#: The longest file-name stem an encoded session id may take (file systems allow 255 bytes).
MAX_ENCODED_ID: Final = 200
_SAFE: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
SUFFIX: Final = ".jsonl"

Events: TypeAlias = list[SessionEvent]
Headers: TypeAlias = list[SessionHeader]

_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(SessionEvent)


class _AnyHeader(msgspec.Struct, tag_field="type", tag="session"):
    """Just enough of a header line to check its version before trusting the rest."""

    version: int


_header_probe = msgspec.json.Decoder(_AnyHeader)
_header_decoder = msgspec.json.Decoder(SessionHeader)


def encode_session_id(session_id: str) -> str:
    """A file-name stem for `session_id`: letters, digits, ``-`` and ``_`` kept, all else %XX.

    No encoded id contains a separator, a dot or a NUL, so none can name a
    file outside the root. Raises `ValueError` for an id too long to store.
    """
    check_session_id(session_id)
    stem = "".join(
        chr(byte) if byte in _SAFE else f"%{byte:02X}" for byte in session_id.encode("utf-8")
    )
    if len(stem) > MAX_ENCODED_ID:
        raise ValueError(
            f"session id is too long to store: {len(stem)} bytes once encoded"
            f" (at most {MAX_ENCODED_ID}); it starts {session_id[:40]!r}"
        )
    return stem


class JsonlPersistence:
    """Session logs as ``<root>/<encoded id>.jsonl`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._next_seq: dict[str, int] = {}
        self._locks: dict[str, trio.Lock] = {}

    def check_session_id(self, session_id: str) -> None:
        encode_session_id(session_id)

    def path(self, session_id: str) -> Path:
        return self.root / (encode_session_id(session_id) + SUFFIX)

    async def create(self, header: SessionHeader) -> None:
        path = self.path(header.id)
        async with self._lock(header.id):
            await trio.to_thread.run_sync(self._create_sync, path, header)
            self._next_seq[header.id] = 0

    async def append(self, session_id: str, events: Sequence[SessionEvent]) -> None:
        if not events:
            return
        path = self.path(session_id)
        async with self._lock(session_id):
            expected = self._next_seq.get(session_id)
            if expected is None:
                _, stored = await trio.to_thread.run_sync(self._load_sync, path, session_id)
                expected = len(stored)
            if events[0].seq != expected:
                raise SeqMismatch(
                    f"session {session_id!r}: append starts at seq {events[0].seq},"
                    f" but {path} holds {expected} events"
                )
            await trio.to_thread.run_sync(_write_durably, path, _encoder.encode_lines(events))
            self._next_seq[session_id] = expected + len(events)

    async def load(self, session_id: str) -> tuple[SessionHeader, Events]:
        path = self.path(session_id)
        async with self._lock(session_id):
            header, events = await trio.to_thread.run_sync(self._load_sync, path, session_id)
            self._next_seq[session_id] = len(events)
            return header, events

    async def list(self) -> Headers:
        return await trio.to_thread.run_sync(self._list_sync)

    # -- in a worker thread ------------------------------------------------------

    def _create_sync(self, path: Path, header: SessionHeader) -> None:
        temp = self.root / f".create-{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                _write_all(fd, _encoder.encode(header) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, path)  # atomic, and fails if the session exists
            except FileExistsError:
                raise SessionExists(f"session {header.id!r} already exists at {path}") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        _fsync_directory(self.root)

    def _load_sync(self, path: Path, session_id: str) -> tuple[SessionHeader, Events]:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SessionNotFound(f"no stored session {session_id!r} (looked for {path})") from None
        end = data.rfind(b"\n") + 1  # a line without its newline is torn
        first = data.find(b"\n")
        if first < 0:
            raise NotASessionLog(f"{path}: empty, or no complete first line")
        header = _decode_header(path, data[:first])
        if header.id != session_id:
            raise NotASessionLog(f"{path}: its header names session {header.id!r}")
        body = memoryview(data)[first + 1 : end]
        try:  # the common case: every line whole and in order, decoded in one call
            events: Events = _event_decoder.decode_lines(body)
            intact = all(event.seq == index for index, event in enumerate(events))
        except msgspec.DecodeError:
            intact = False
        if intact:
            keep = end
        else:
            events, keep = _longest_prefix(path, data, first + 1, end)
        closers = repair(events)
        if keep != len(data) or closers:
            with open(path, "r+b") as file:
                file.truncate(keep)
                file.seek(keep)
                file.write(_encoder.encode_lines(closers))
                file.flush()
                os.fsync(file.fileno())
            if closers:
                logger.info("closed interrupted turn of session %r in %s", session_id, path)
        return header, events + closers

    def _list_sync(self) -> Headers:
        headers = []
        for path in sorted(self.root.glob("*" + SUFFIX)):
            try:
                with open(path, "rb") as file:
                    headers.append(_decode_header(path, file.readline().rstrip(b"\n")))
            except (OSError, PersistenceError) as exc:
                logger.warning("skipping %s: %s", path, exc)
        return headers

    def _lock(self, session_id: str) -> trio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = trio.Lock()
        return lock


def _decode_header(path: Path, raw: bytes) -> SessionHeader:
    try:
        probe = _header_probe.decode(raw)
    except msgspec.DecodeError:
        raise NotASessionLog(f"{path}: line 1 is not a session header") from None
    if probe.version != SESSION_VERSION:
        raise UnsupportedVersion(
            f"{path}: session log version {probe.version}"
            f" (this greenroom reads version {SESSION_VERSION})"
        )
    try:
        return _header_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise NotASessionLog(f"{path}: line 1 is not a valid session header: {exc}") from None


def _longest_prefix(path: Path, data: bytes, start: int, end: int) -> tuple[Events, int]:
    """The seq-contiguous prefix of the lines in ``data[start:end]``, and its end offset."""
    lines = data[start:end].split(b"\n")[:-1]
    events: Events = []
    keep = start
    for index, raw in enumerate(lines):
        try:
            event: SessionEvent | None = _event_decoder.decode(raw)
        except msgspec.DecodeError:
            event = None
        if event is None or event.seq != len(events):
            _check_tail(path, index + 2, lines[index:])
            break
        events.append(event)
        keep += len(raw) + 1
    return events, keep


def _check_tail(path: Path, number: int, rest: list[bytes]) -> None:
    """A bad line is a torn tail unless a ``turn/end`` follows it: then the log is corrupt."""
    for raw in rest[1:]:
        try:
            event = _event_decoder.decode(raw)
        except msgspec.DecodeError:
            continue
        if isinstance(event, TurnEnd):
            raise CorruptLog(
                f"{path}: line {number} is corrupt or out of order,"
                " before the log's last turn/end; not repairing it"
            )


def _write_durably(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # leave no partial batch behind
            raise
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
