"""`LocalBashExecutor`: ``bash -c`` in its own process group, on this machine.

* Each command is a fresh non-login ``bash -c`` with stdin closed, started in
  a new session (so its process group id is its pid) by the runtime's
  `greenroom.sandbox.Sandboxes`, in its request's sandbox (none: as any
  process greenroom starts, unconfined, in no cgroup), with an environment
  scrubbed of names matching KEY, SECRET, TOKEN, PASSWORD, PASS, PWD, AUTH,
  CRED or DSN, and of SSH_AUTH_SOCK, and set up for plain output
  (``NO_COLOR=1``, ``TERM=dumb``, ``PAGER=cat``, ``GIT_PAGER=cat``).
* Stopping a command signals its whole group: SIGTERM, then SIGKILL once the
  shell has exited or `KILL_GRACE` seconds have passed; the shell is always
  reaped (its orphaned children are reaped by init, as they would be anyway).
* Each stream keeps a `TAIL_BYTES` tail in memory; once a stream outgrows it,
  the whole stream also goes to a private spill file (directory 0700, file
  0600, created exclusively), so memory stays bounded whatever a command
  writes. A spill file holds at most ``max_spill`` bytes (`MAX_SPILL_FILE`,
  256 MiB, by default), so the disk is bounded too: past it the stream is
  counted (``dropped``), not kept, and the results say how much.
* Each command is a `greenroom.procs.MarkedProcess`: its environment carries its
  mark (``GREENROOM_OWNER``). When the shell exits, whatever it left in its
  group is SIGKILLed at once, and then everything in its cgroup (where it has
  one) and whatever still carries its mark (detached by ``setsid`` or a double
  fork), waited for up to `greenroom.procs.KILL_WAIT` (`greenroom.sandbox.Child.end`):
  a command's background children do not outlive it. Should greenroom die,
  its keeper ends them (see `greenroom.procs`).
* Background tasks run in the executor's nursery. A finished task's record
  (its tails, its spill files) is kept until `forget`, and at most
  `FINISHED_KEPT` per owner token: the oldest goes first. Closing the executor
  kills every running task and waits until each is reaped, then removes the
  spill directory.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import os
import re
import signal
from collections.abc import Callable
from types import TracebackType
from typing import Final

import trio

from greenroom.hooks import Disposers, Listeners
from greenroom.protocol.events import PROGRESS_BYTES
from greenroom.sandbox import Child, Sandboxes
from greenroom.spill import MAX_SPILL_FILE, SpillDir
from greenroom.tools.bash.seam import (
    DEFAULT_TIMEOUT_MS,
    MAX_TIMEOUT_MS,
    PROGRESS_INTERVAL,
    TAIL_BYTES,
    BashExecRequest,
    BashExecSpec,
    BashOutput,
    BashRunResult,
    BashTask,
    OutputProgress,
    StreamOutput,
    TaskDoneListener,
    TaskStatus,
    UnknownTask,
)

logger = logging.getLogger("greenroom.bash")

#: Seconds between SIGTERM and SIGKILL.
KILL_GRACE: Final = 3.0
#: Seconds to keep reading a command's pipes after it exited (a child it left may hold them).
DRAIN_GRACE: Final = 1.0
#: Finished task records kept per owner token (``None`` included) until forgotten.
FINISHED_KEPT: Final = 256
_SECRET_NAME: Final = re.compile(
    "KEY|SECRET|TOKEN|PASSWORD|PASS|PWD|AUTH|CRED|DSN|SSH_AUTH_SOCK", re.IGNORECASE
)


def scrubbed_environment(environ: dict[str, str]) -> dict[str, str]:
    """`environ` without anything whose name looks like a credential (or the SSH agent)."""
    env = {name: value for name, value in environ.items() if not _secret(name)}
    env.update(NO_COLOR="1", TERM="dumb", PAGER="cat", GIT_PAGER="cat")
    return env


@functools.lru_cache(maxsize=4096)
def _secret(name: str) -> bool:
    # Cached: every spawn filters the whole environment, whose names rarely change, and
    # the pattern over 30-odd names was 44 us of each bash call's start.
    return _SECRET_NAME.search(name) is not None and name not in ("PWD", "OLDPWD")


class _Capture:
    """One stream: a bounded tail in memory, the whole stream in a spill file once it overflows,
    up to the spill directory's ``file_cap`` bytes; past that, counted (``dropped``), not kept.
    """

    __slots__ = (
        "_room",
        "_spill_fd",
        "_spills",
        "dropped",
        "read_to",
        "spill_path",
        "tail",
        "total",
    )

    def __init__(self, spills: SpillDir) -> None:
        self._spills = spills
        self.tail = bytearray()
        self.total = 0
        self.read_to = 0  # stream offset up to which read_output has delivered
        self._spill_fd: int | None = None
        self.spill_path: str | None = None
        self._room = spills.file_cap  # bytes the spill file may still take
        self.dropped = 0

    def feed(self, data: bytes | bytearray) -> None:
        self.total += len(data)
        if self._spill_fd is None and self.total > TAIL_BYTES:
            self._open_spill()  # the tail still holds the whole stream so far
        if self._spill_fd is not None and self._spill_fd >= 0:
            self._spill(data)
        self.tail += data
        if len(self.tail) > TAIL_BYTES:
            del self.tail[: len(self.tail) - TAIL_BYTES]

    def _open_spill(self) -> None:
        try:
            fd, path = self._spills.create(".out")
        except OSError:
            logger.warning("could not open a spill file; output beyond the tail is lost")
            self.spill_path = None
            self._spill_fd = -1
            return
        self._spill_fd, self.spill_path = fd, path
        self._spill(bytes(self.tail))

    def _spill(self, data: bytes | bytearray) -> None:
        assert self._spill_fd is not None
        if len(data) <= self._room:
            _write_all(self._spill_fd, data)
            self._room -= len(data)
            return
        if self._room:
            _write_all(self._spill_fd, data[: self._room])
        self.dropped += len(data) - self._room
        self._room = 0

    def close(self) -> None:
        if self._spill_fd is not None and self._spill_fd >= 0:
            os.close(self._spill_fd)
            self._spill_fd = -1

    def discard(self) -> None:
        """Close and delete the spill file, if any."""
        self.close()
        if self.spill_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.spill_path)

    def output(self) -> StreamOutput:
        return StreamOutput(
            self.tail.decode("utf-8", "replace"),
            self.total > TAIL_BYTES,
            self.spill_path,
            self.dropped,
        )

    def unread(self) -> tuple[str, bool]:
        """The output since the last call, and whether some of it already left the tail."""
        kept_from = self.total - len(self.tail)
        lossy = self.read_to < kept_from
        start = max(self.read_to, kept_from) - kept_from
        self.read_to = self.total
        return self.tail[start:].decode("utf-8", "replace"), lossy


class _LiveTail:
    """Both streams' last `PROGRESS_BYTES`, as they arrived, for a running command's progress.

    The chunks read are kept as they are (no copy per chunk: a flood of small reads
    costs a reference each), those wholly before the tail dropped; the tail's text is
    joined only when a notice is made.
    """

    __slots__ = ("_chunks", "_kept", "reported", "total")

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes | bytearray] = collections.deque()
        self._kept = 0  # bytes in `_chunks`
        self.total = 0
        self.reported = 0  # `total` at the last notice

    def feed(self, data: bytes | bytearray) -> None:
        self.total += len(data)
        chunks = self._chunks
        chunks.append(data)
        self._kept += len(data)
        while self._kept - len(chunks[0]) >= PROGRESS_BYTES:
            self._kept -= len(chunks.popleft())

    def text(self) -> str:
        tail = b"".join(self._chunks)[-PROGRESS_BYTES:]
        start = 0
        while start < len(tail) and start < 3 and tail[start] & 0xC0 == 0x80:
            start += 1  # a character the cut split: not shown as a replacement mark
        return tail[start:].decode("utf-8", "replace")


async def _report(live: _LiveTail, progress: OutputProgress) -> None:
    """Tell `progress` the new output, at most every `PROGRESS_INTERVAL` seconds. A tick is
    what paces it, so a command that writes in bursts costs a notice per tick at most."""
    while True:
        await trio.sleep(PROGRESS_INTERVAL)
        if live.total != live.reported:
            live.reported = live.total
            progress(live.text(), live.total)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    if fd < 0:
        return
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Command:
    """One running ``bash -c``: its process, its two captures, and how to stop it."""

    __slots__ = ("_ended", "child", "stderr", "stdout")

    def __init__(self, child: Child, spills: SpillDir) -> None:
        self.child = child
        self._ended: trio.Event | None = None  # set once `end` has run, by whichever path
        self.stdout = _Capture(spills)
        self.stderr = _Capture(spills)

    @classmethod
    async def spawn(cls, spec: BashExecSpec, spills: SpillDir, sandboxes: Sandboxes) -> _Command:
        child = await sandboxes.shell(
            spec.command,
            cwd=spec.workdir,
            env=scrubbed_environment(dict(os.environ)),
            sandbox=spec.sandbox,
        )
        return cls(child, spills)

    async def finish(
        self, kill_after: float = math.inf, progress: OutputProgress | None = None
    ) -> bool:
        """Pump both pipes until the process exits and they drain; True if it timed out.

        Past `kill_after` the group is terminated; on a cancel of the caller it is
        terminated and reaped (shielded) before the cancel propagates. With
        `progress`, the output so far is told as `BashExecutor.run` says.
        """
        child = self.child
        assert child.stdout is not None
        assert child.stderr is not None
        timed_out = False
        try:
            async with trio.open_nursery() as nursery:
                drained = [trio.Event(), trio.Event()]
                live = None
                if progress is not None:
                    live = _LiveTail()
                    nursery.start_soon(_report, live, progress)
                nursery.start_soon(_pump, child.stdout, self.stdout, drained[0], live)
                nursery.start_soon(_pump, child.stderr, self.stderr, drained[1], live)
                try:
                    with trio.move_on_after(kill_after) as waiting:
                        await child.wait()
                    if waiting.cancelled_caught:
                        timed_out = True
                        await self.terminate()
                except BaseException:
                    with trio.CancelScope(shield=True):
                        await self.terminate()
                    raise
                # What the shell left running dies with it, now, while the group id
                # cannot yet belong to anyone else.
                await self._end()
                with trio.move_on_after(DRAIN_GRACE):  # a child it left may hold the pipes
                    for event in drained:
                        await event.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.stdout.close()
            self.stderr.close()
        return timed_out

    async def terminate(self) -> None:
        """SIGTERM the group; SIGKILL it once the shell is gone or `KILL_GRACE` ran out; reap.

        The SIGKILL goes to the group either way: what the shell leaves behind
        after a TERM is a straggler. Idempotent.
        """
        child = self.child
        child.signal_group(signal.SIGTERM)
        with trio.move_on_after(KILL_GRACE):
            await child.wait()
        child.signal_group(signal.SIGKILL)
        await child.wait()
        await self._end()

    async def _end(self) -> None:
        """End what the shell left: its group, its cgroup, what carries its mark (`Child.end`).

        Both ends of a killed task (its watch, its kill) come here: the second
        waits for the first's, so the task ends only once it is done.
        """
        if self._ended is not None:
            await self._ended.wait()
            return
        self._ended = trio.Event()
        try:
            with trio.CancelScope(shield=True):
                await self.child.end()
        finally:
            self._ended.set()

    @property
    def exit_code(self) -> int | None:
        code = self.child.returncode
        return code if code is not None and code >= 0 else None

    @property
    def signal_name(self) -> str | None:
        code = self.child.returncode
        if code is None or code >= 0:
            return None
        try:
            return signal.Signals(-code).name
        except ValueError:
            return str(-code)


async def _pump(
    stream: trio.abc.ReceiveStream,
    capture: _Capture,
    drained: trio.Event,
    live: _LiveTail | None,
) -> None:
    try:
        while chunk := await stream.receive_some(65536):
            capture.feed(chunk)
            if live is not None:
                live.feed(chunk)
        drained.set()
    finally:
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            await stream.aclose()


class _TaskRecord:
    __slots__ = ("command", "done", "id", "killed", "owner", "spec", "status")

    def __init__(self, task_id: str, spec: BashExecSpec, command: _Command) -> None:
        self.id = task_id
        self.spec = spec
        self.owner = spec.owner
        self.command = command
        self.status: TaskStatus = "running"
        self.killed = False
        self.done = trio.Event()

    def snapshot(self) -> BashTask:
        finished = self.status != "running"
        return BashTask(
            id=self.id,
            command=self.spec.command,
            status=self.status,
            exit_code=self.command.exit_code if finished else None,
            signal=self.command.signal_name if finished else None,
        )


class LocalBashExecutor:
    """Runs commands as local processes; an async context manager that owns its background tasks.

    ``default_workdir`` is where a request without a workdir runs;
    ``max_spill`` the most bytes one stream's spill file holds (the rest of
    the stream is counted, not kept, and the results say so); ``sandboxes``
    where a request's sandbox is made (the runtime's; without one, the executor
    opens its own and closes it with itself).
    """

    def __init__(
        self,
        default_workdir: str,
        *,
        max_spill: int = MAX_SPILL_FILE,
        sandboxes: Sandboxes | None = None,
    ) -> None:
        if not os.path.isabs(default_workdir):
            raise ValueError(f"default_workdir must be absolute, got {default_workdir!r}")
        if isinstance(max_spill, bool) or not isinstance(max_spill, int) or max_spill <= 0:
            raise ValueError(f"max_spill must be a positive number of bytes, got {max_spill!r}")
        self.default_workdir = default_workdir
        self._tasks: dict[str, _TaskRecord] = {}
        self._finished: dict[str | None, collections.deque[str]] = {}  # by owner, oldest first
        self._count = 0
        self._listeners: Listeners[BashTask] = Listeners("bash task completions")
        self._nursery: trio.Nursery | None = None
        self._nursery_manager = trio.open_nursery()
        self._spills = SpillDir("greenroom-bash-", file_cap=max_spill)
        self._closed = False
        self._own_sandboxes = sandboxes is None
        self._sandboxes = Sandboxes() if sandboxes is None else sandboxes

    @property
    def sandboxes(self) -> Sandboxes:
        return self._sandboxes

    @property
    def spills(self) -> SpillDir:
        """Where the tasks' whole outputs go once past their tails (a file per stream)."""
        return self._spills

    async def __aenter__(self) -> LocalBashExecutor:
        if self._own_sandboxes:
            await self._sandboxes.__aenter__()
        self._nursery = await self._nursery_manager.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with trio.CancelScope(shield=True):
            await self._close()
        return bool(await self._nursery_manager.__aexit__(exc_type, exc, tb))

    async def _close(self) -> None:
        self._closed = True
        self._listeners.clear()  # no notice fires after close
        for record in self._tasks.values():
            if record.status == "running":
                self.kill(record.id)
        for record in self._tasks.values():
            await record.done.wait()
        self._spills.close()
        if self._own_sandboxes:
            await self._sandboxes.__aexit__(None, None, None)

    # -- the seam ------------------------------------------------------------------

    def resolve(self, request: BashExecRequest) -> BashExecSpec:
        """Absolute workdir (the request's, else the default) and a timeout capped at 600 s."""
        if not request.command.strip():
            raise ValueError("command must be a non-empty string")
        workdir = request.workdir or self.default_workdir
        if not os.path.isabs(workdir):
            workdir = os.path.join(self.default_workdir, workdir)
        if not os.path.isdir(workdir):
            raise ValueError(f"workdir {workdir!r} is not an existing directory")
        timeout = DEFAULT_TIMEOUT_MS if request.timeout_ms is None else request.timeout_ms
        if timeout <= 0:
            raise ValueError(f"timeout_ms must be positive, got {timeout}")
        return BashExecSpec(
            command=request.command,
            workdir=workdir,
            timeout_ms=min(timeout, MAX_TIMEOUT_MS),
            owner=request.owner,
            sandbox=request.sandbox,
        )

    async def run(
        self, spec: BashExecSpec, progress: OutputProgress | None = None
    ) -> BashRunResult:
        """Run in the foreground, telling `progress` the output so far (see the seam). A
        cancel of the caller kills the group, reaps, then propagates."""
        command = await _Command.spawn(spec, self._spills, self._sandboxes)
        timed_out = await command.finish(spec.timeout_ms / 1000, progress)
        return BashRunResult(
            exit_code=command.exit_code,
            signal=command.signal_name,
            timed_out=timed_out,
            timeout_ms=spec.timeout_ms,
            stdout=command.stdout.output(),
            stderr=command.stderr.output(),
        )

    async def start(self, spec: BashExecSpec) -> BashTask:
        """Start in the background (no timeout); returns at once with the task's id."""
        if self._closed or self._nursery is None:
            raise RuntimeError("the bash executor is closed")
        command = await _Command.spawn(spec, self._spills, self._sandboxes)
        self._count += 1
        record = _TaskRecord(f"bash-{self._count}", spec, command)
        self._tasks[record.id] = record
        self._nursery.start_soon(self._watch, record, name=record.id)
        return record.snapshot()

    def owner_of(self, task_id: str) -> str | None:
        record = self._tasks.get(task_id)
        return record.owner if record is not None else None

    def read_output(self, task_id: str) -> BashOutput:
        record = self._record(task_id)
        out, out_lossy = record.command.stdout.unread()
        err, err_lossy = record.command.stderr.unread()
        delta = out + (f"[stderr]\n{err}" if err else "")
        return BashOutput(
            task=record.snapshot(),
            delta=delta,
            lossy=out_lossy or err_lossy,
            stdout_spill_path=record.command.stdout.spill_path,
            stderr_spill_path=record.command.stderr.spill_path,
            dropped=record.command.stdout.dropped + record.command.stderr.dropped,
        )

    async def wait(self, task_id: str) -> BashTask:
        """Wait until the task has ended and its shell is reaped; its final snapshot."""
        record = self._record(task_id)
        await record.done.wait()
        return record.snapshot()

    def forget(self, task_id: str) -> None:
        """Drop a finished task's record and delete its spill files; a no-op while it runs."""
        record = self._tasks.get(task_id)
        if record is None or record.status == "running":
            return
        del self._tasks[task_id]
        finished = self._finished[record.owner]
        finished.remove(task_id)
        if not finished:
            del self._finished[record.owner]
        record.command.stdout.discard()
        record.command.stderr.discard()

    def kill(self, task_id: str) -> bool:
        """Stop a running task's group (TERM, then KILL); False if it had already finished."""
        record = self._record(task_id)
        if record.status != "running" or record.killed:
            return False
        record.killed = True
        assert self._nursery is not None
        self._nursery.start_soon(record.command.terminate, name=f"kill {task_id}")
        return True

    def get(self, task_id: str) -> BashTask | None:
        record = self._tasks.get(task_id)
        return record.snapshot() if record is not None else None

    def list(self) -> list[BashTask]:
        return [record.snapshot() for record in self._tasks.values()]

    def on_task_done(
        self, listener: TaskDoneListener, *, scope: Disposers | None = None
    ) -> Callable[[], None]:
        """Call ``listener(task)`` once per task when it ends; never after the executor closed."""
        return self._listeners.add(listener, scope=scope)

    async def end_session(self, session: str) -> None:
        await self._sandboxes.end_session(session)

    # -- internals -----------------------------------------------------------------------

    async def _watch(self, record: _TaskRecord) -> None:
        try:
            await record.command.finish()
        finally:
            record.status = "killed" if record.killed else "completed"
            record.done.set()
        self._listeners.notify(record.snapshot())
        finished = self._finished.setdefault(record.owner, collections.deque())
        finished.append(record.id)
        while len(finished) > FINISHED_KEPT:
            self.forget(finished[0])

    def _record(self, task_id: str) -> _TaskRecord:
        record = self._tasks.get(task_id)
        if record is None:
            raise UnknownTask(task_id)
        return record
