"""`JsonlPersistence`: one JSON-lines file per session (the embedded default).

Line 1 is the `SessionHeader` (``"type": "session"``), then one event per
line. Only a line that ends in a newline counts: a crash mid-write leaves at
most one torn line at the end, which `load` drops.

A live session (`create`, `open`) holds ``<stem>.lock`` (`SessionLock`) and
keeps its file open for appends (`JsonlLog`). Its writes are ``os.write``
calls on the Trio thread, at the agent's write-ahead points: a copy into the
page cache, which costs microseconds, less than a hop to a thread. Its
fsyncs, the part that waits on the disk, run on the persistence's `Writer`,
coalesced per file. Creating, opening and reading a file run in
``trio.to_thread``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import BinaryIO, Final

import msgspec
import trio

from greenroom.protocol.events import (
    SESSION_VERSION,
    ConfigSet,
    SessionEvent,
    SessionHeader,
    TurnEnd,
    UserMessage,
)
from greenroom.session.persistence.answers import AnswersBeside
from greenroom.session.persistence.base import (
    DEADLINE,
    SYNC_POLICIES,
    CorruptLog,
    Events,
    Interruption,
    NotASessionLog,
    PersistenceError,
    SessionExists,
    SessionNotFound,
    Stored,
    StoredSession,
    SyncPolicy,
    UnsupportedVersion,
    repair,
)
from greenroom.session.persistence.blobs import put_files, read_files, remove_files
from greenroom.session.persistence.lock import SessionLock
from greenroom.session.persistence.writer import Job, Writer
from greenroom.session.session import TITLE_KEY, title_of
from greenroom.session.store import check_session_id

logger = logging.getLogger("greenroom.persistence")

#: The longest file-name stem an encoded session id may take (file systems allow 255 bytes).
MAX_ENCODED_ID: Final = 200
_SAFE: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
SUFFIX: Final = ".jsonl"
LOCK_SUFFIX: Final = ".lock"
BLOBS_SUFFIX: Final = ".blobs"
#: The folder beside a log where answers to its decisions wait (`answers`).
ANSWERS_SUFFIX: Final = ".answers"
#: Under ``sync="turn"``, how long the writer lets turn ends gather before an fsync: fsyncs
#: back to back would slow every write to the file they sync. A close cuts it short.
TURN_SYNC_DELAY: Final = 0.002


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


class JsonlPersistence(AnswersBeside):
    """Session logs as ``<root>/<encoded id>.jsonl`` (see the module docstring).

    ``sync`` is the `SyncPolicy` of every log it opens (default ``"turn"``);
    ``fsync_timeout`` the seconds an fsync may take before its waiter stops
    waiting (`OperationTimeout`). The root is made (mode 0700) when the first
    session is created.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        sync: SyncPolicy = "turn",
        fsync_timeout: float = DEADLINE,
    ) -> None:
        if sync not in SYNC_POLICIES:
            raise ValueError(f"sync must be one of {SYNC_POLICIES}, got {sync!r}")
        if not fsync_timeout > 0:
            raise ValueError(
                f"fsync_timeout must be a positive number of seconds, got {fsync_timeout!r}"
            )
        self.root = Path(root)
        # A session's file names are joined as text, never made into Paths: pathlib interns
        # each name it parses, and a name interned per session churns the interpreter's table
        # of interned strings (each one let go holds its slot until the table is rebuilt, at
        # up to twice the size).
        self._directory = os.fspath(self.root)
        self.sync: SyncPolicy = sync
        self.fsync_timeout = fsync_timeout
        delay = TURN_SYNC_DELAY if sync == "turn" else 0.0
        # Set by a close waiting on an fsync: the writer stops letting turn ends gather.
        self.hurry = threading.Event()
        # Its errors name no store: the log that waited names the file.
        self._writer: Writer[_Fsync] = Writer(
            partial(_fsync_batch, delay, self.hurry), deadline=fsync_timeout
        )

    def check_session_id(self, session_id: str) -> None:
        encode_session_id(session_id)

    def path(self, session_id: str) -> str:
        return os.path.join(self._directory, encode_session_id(session_id) + SUFFIX)

    def blob_dir(self, session_id: str) -> str:
        """Where the session's blobs are: a directory beside its log (`blobs.put_files`)."""
        return os.path.join(self._directory, encode_session_id(session_id) + BLOBS_SUFFIX)

    async def create(self, header: SessionHeader) -> JsonlLog:
        path = self.path(header.id)
        return await trio.to_thread.run_sync(self._create_sync, path, header)

    async def open(
        self, session_id: str, *, interrupted: Interruption = "close"
    ) -> tuple[SessionHeader, Events, JsonlLog]:
        path = self.path(session_id)
        return await trio.to_thread.run_sync(self._open_sync, path, session_id, interrupted)

    async def load(self, session_id: str) -> tuple[SessionHeader, Events]:
        path = self.path(session_id)
        header, events, _, _ = await trio.to_thread.run_sync(_read_log, path, session_id)
        return header, events + repair(events)

    async def list(self) -> Stored:
        return await trio.to_thread.run_sync(self._list_sync)

    async def delete(self, session_id: str) -> None:
        path = self.path(session_id)
        await trio.to_thread.run_sync(self._delete_sync, path, session_id)

    async def put_blobs(self, session_id: str, blobs: Mapping[str, bytes]) -> None:
        directory, durable = self.blob_dir(session_id), self.sync != "os"
        await trio.to_thread.run_sync(partial(put_files, directory, blobs, durable=durable))

    async def read_blobs(self, session_id: str, digests: Sequence[str]) -> dict[str, bytes]:
        return await trio.to_thread.run_sync(read_files, self.blob_dir(session_id), digests)

    def answer_dir(self, session_id: str) -> str:
        """Where answers to the session's decisions wait for its next holder (`answers`)."""
        return os.path.join(self._directory, encode_session_id(session_id) + ANSWERS_SUFFIX)

    # -- in a worker thread ------------------------------------------------------

    def _create_sync(self, path: str, header: SessionHeader) -> JsonlLog:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = SessionLock.acquire(_lock_path(path), header.id)
        try:
            temp = os.path.join(self._directory, f".create-{secrets.token_hex(8)}.tmp")
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
                    raise SessionExists(
                        f"session {header.id!r} is stored already at {path}"
                    ) from None
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
            _fsync_directory(self._directory)
            return JsonlLog(self, header.id, path, lock, next_seq=0)
        except BaseException:
            lock.release()
            raise

    def _open_sync(
        self, path: str, session_id: str, interrupted: Interruption
    ) -> tuple[SessionHeader, Events, JsonlLog]:
        if not os.path.exists(path):
            raise SessionNotFound(f"no stored session {session_id!r} (looked for {path})")
        lock = SessionLock.acquire(_lock_path(path), session_id)
        try:
            header, events, keep, size = _read_log(path, session_id)
            closers = repair(events, interrupted)
            if keep != size or closers:
                with open(path, "r+b") as file:
                    file.truncate(keep)
                    file.seek(keep)
                    file.write(_encoder.encode_lines(closers))
                    file.flush()
                    os.fsync(file.fileno())
                if closers:
                    logger.info("closed interrupted turn of session %r in %s", session_id, path)
            events += closers
            return header, events, JsonlLog(self, session_id, path, lock, next_seq=len(events))
        except BaseException:
            lock.release()
            raise

    def _list_sync(self) -> Stored:
        stored: Stored = []
        try:
            with os.scandir(self._directory) as entries:
                paths = [entry.path for entry in entries if entry.name.endswith(SUFFIX)]
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return stored  # no root (yet), or not one to read: none, as a glob of it finds
        for path in paths:
            try:
                with open(path, "rb") as file:
                    header = _decode_header(path, file.readline().rstrip(b"\n"))
                    head = file.read(_TITLE_SCAN).split(b"\n")[:-1]  # whole lines
                    tail = _tail(file)
            except (OSError, PersistenceError) as exc:
                logger.warning("skipping %s: %s", path, exc)
                continue
            title = _written_title(tail) or _written_title(head) or _first_title(head)
            updated = _last_time(tail) or header.created_at / 1000
            stored.append(StoredSession(header, title, updated))
        stored.sort(key=lambda s: (-s.updated_at, s.header.id))
        return stored

    def _delete_sync(self, path: str, session_id: str) -> None:
        if not os.path.exists(path):
            return
        lock = SessionLock.acquire(_lock_path(path), session_id)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            _fsync_directory(self._directory)
            remove_files(self.blob_dir(session_id))
            remove_files(self.answer_dir(session_id))
        finally:
            lock.release()


class _Fsync(Job):
    """One fsync of a log's file; ``covers`` is the seq it made durable (set by the batch)."""

    __slots__ = ("covers", "log", "started")

    def __init__(self, log: JsonlLog) -> None:
        super().__init__()
        self.log = log
        self.started = False
        self.covers = 0


def _fsync_batch(delay: float, hurry: threading.Event, jobs: Sequence[_Fsync]) -> None:
    """The writer's work: after `delay` (cut short once `hurry` is set, which it clears),
    one fsync per file, covering every write it saw before it began (a request made
    meanwhile rides on a job not yet started)."""
    if delay:
        hurry.wait(delay)
        hurry.clear()
    done: dict[int, tuple[int, BaseException | None]] = {}
    for job in jobs:
        job.started = True
        fd = job.log.fd
        if fd not in done:
            covers = job.log.written  # written before this read: the fsync below covers it
            try:
                os.fdatasync(fd)
                done[fd] = (covers, None)
            except OSError as exc:
                done[fd] = (covers, exc)
        job.covers, job.error = done[fd]


class JsonlLog:
    """One live JSONL session: its file open for appends, its lock, what waits to be written.

    See `SessionLog` for the contract. `write_ahead` writes inline and never
    checkpoints; `flush` writes, then fsyncs as the policy says; `close`
    writes, fsyncs (unless ``"os"``), closes the file and releases the lock.
    """

    __slots__ = (
        "_closed",
        "_lock",
        "_pending",
        "_persistence",
        "_size",
        "_sync",
        "_synced",
        "append",
        "fd",
        "path",
        "session_id",
        "written",
    )

    def __init__(
        self,
        persistence: JsonlPersistence,
        session_id: str,
        path: str,
        lock: SessionLock,
        *,
        next_seq: int,
    ) -> None:
        self._persistence = persistence
        self.session_id = session_id
        self.path = path
        self._lock = lock
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._size = os.fstat(self.fd).st_size
        self._pending: list[SessionEvent] = []  # one list for the log's life: see `append`
        # The list's own append: one call per event, no frame of ours (the hottest call of a
        # turn). It never blocks or raises.
        self.append: Callable[[SessionEvent], None] = self._pending.append
        self.written = next_seq  # the seq after the last event written to the OS
        self._synced = next_seq  # ... and after the last one an fsync covered
        self._sync: _Fsync | None = None  # the latest fsync asked for
        self._closed = False

    async def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        await self._persistence.put_blobs(self.session_id, blobs)

    async def read_blobs(self, digests: Sequence[str]) -> dict[str, bytes]:
        return await self._persistence.read_blobs(self.session_id, digests)

    async def write_ahead(self) -> None:
        """Write what is pending to the OS, inline (no checkpoint)."""
        self._write()

    async def flush(self) -> None:
        self._write()
        policy = self._persistence.sync
        if policy == "always":
            await self._synced_to(self.written)
        elif policy == "turn" and self._synced < self.written:
            job = self._sync
            if job is None or job.started or job.settled:  # else the queued one covers it
                self._fsync()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            try:
                self._write()
                if self._persistence.sync != "os":
                    await self._synced_to(self.written, hurry=True)
            finally:
                if self._sync is not None and not self._sync.settled:
                    # Not under a running fsync, unless it passed its deadline: then the
                    # fd is closed under it (the kernel keeps the file until it returns).
                    await self._sync.wait()
                os.close(self.fd)
                self.fd = -1  # a late write fails (EBADF) instead of reaching a reused fd
                self._lock.release()
                if self._pending:
                    logger.error(
                        "session %r: %d events never reached %s",
                        self.session_id,
                        len(self._pending),
                        self.path,
                    )

    def _write(self) -> None:
        if (self._closed and self.fd < 0) or not self._pending:
            return
        data = _encoder.encode_lines(self._pending)
        try:
            written = os.write(self.fd, data)  # _write_all, inline: a turn's one write
            if written < len(data):
                _write_rest(self.fd, memoryview(data)[written:])
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self._size)  # leave no partial batch behind
            raise PersistenceError(
                f"session {self.session_id!r}: cannot write {self.path}: {exc}"
            ) from exc
        self._size += len(data)
        self.written = self._pending[-1].seq + 1
        self._pending.clear()

    def _fsync(self) -> _Fsync:
        """An fsync that will cover everything written so far (a queued one is shared)."""
        job = self._sync
        if job is None or job.started or job.settled:
            job = self._sync = _Fsync(self)
            job.on_settled = self._fsynced
            self._persistence._writer.submit(job)
        return job

    def _fsynced(self, job: Job) -> None:
        assert isinstance(job, _Fsync)
        if job.error is None:
            self._synced = max(self._synced, job.covers)
        else:
            logger.error(
                "session %r: fsync of %s failed: %s", self.session_id, self.path, job.error
            )

    async def _synced_to(self, seq: int, *, hurry: bool = False) -> None:
        """Wait until an fsync covers `seq`; `hurry` (a close) cuts the turn delay short."""
        while self._synced < seq:
            job = self._fsync()
            if hurry:
                self._persistence.hurry.set()
            await job.wait()  # shielded: the fsync runs to its end either way
            if job.error is not None:
                raise PersistenceError(
                    f"session {self.session_id!r}: cannot fsync {self.path}: {job.error}"
                ) from job.error


def _lock_path(path: str) -> str:
    """The lock file of the log at `path`: ``<stem>.lock`` beside it."""
    return path.removesuffix(SUFFIX) + LOCK_SUFFIX


def _read_log(path: str, session_id: str) -> tuple[SessionHeader, Events, int, int]:
    """The header and the longest whole, seq-contiguous prefix; where it ends; the file size."""
    try:
        with open(path, "rb") as file:
            data = file.read()
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
        return header, events, end, len(data)
    events, keep = _longest_prefix(path, data, first + 1, end)
    return header, events, keep, len(data)


#: How far into a log, and back from its end, `list` looks for its title and last time.
_TITLE_SCAN: Final = 64 * 1024
_user_message = msgspec.json.Decoder(UserMessage)
_config_set = msgspec.json.Decoder(ConfigSet)
_WRITTEN_TITLE: Final = b'"type":"config/set"'


class _Timed(msgspec.Struct):
    time: float = 0.0


_timed = msgspec.json.Decoder(_Timed)


def _tail(file: BinaryIO) -> list[bytes]:
    """The lines of `file`'s last `_TITLE_SCAN` bytes (the first may be a part of one, the
    last piece, torn or empty, is left out)."""
    size = os.fstat(file.fileno()).st_size
    file.seek(max(0, size - _TITLE_SCAN))
    return file.read().split(b"\n")[:-1]


def _last_time(lines: list[bytes]) -> float:
    """The ``time`` of the last of `lines` that holds one (0 if none does)."""
    for line in reversed(lines):
        try:
            return _timed.decode(line).time
        except msgspec.DecodeError:
            continue
    return 0.0


def _written_title(lines: list[bytes]) -> str | None:
    """The last title a model wrote (``config/set title``) among `lines`, if any."""
    for line in reversed(lines):
        if _WRITTEN_TITLE in line:
            try:
                event = _config_set.decode(line)
            except msgspec.DecodeError:
                continue  # a part of a line, where the tail begins
            if event.key == TITLE_KEY:
                return event.value
    return None


def _first_title(head: list[bytes]) -> str | None:
    """The title of the first ``user/message`` among `head`'s lines."""
    for line in head:
        if b'"type":"user/message"' in line:
            try:
                return title_of(_user_message.decode(line).content)
            except msgspec.DecodeError:
                return None
    return None


def _decode_header(path: str, raw: bytes) -> SessionHeader:
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


def _longest_prefix(path: str, data: bytes, start: int, end: int) -> tuple[Events, int]:
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


def _check_tail(path: str, number: int, rest: list[bytes]) -> None:
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


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):
        _write_rest(fd, memoryview(data)[written:])


def _write_rest(fd: int, view: memoryview) -> None:
    """What a short write left (rare: a signal, a full disk), piece by piece."""
    while view:
        view = view[os.write(fd, view) :]


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
