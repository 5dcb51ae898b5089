"""`Sandboxes`: a runtime's processes started confined and contained, and what holds.

A process greenroom starts (a bash command, an MCP stdio server) is started
with a `Sandbox`: its access (`Access`), whose session it is, and that
session's directories. What the access means:

* ``read-only``: every file readable, nothing writable but the session's
  private temporary directory (``TMPDIR`` is set to it) and a few devices
  (`DEVICES`: ``/dev/null`` and the like); no socket can be opened;
* ``workspace-write``: also writable: the session's directories and the cache
  directories of `SandboxSettings` (``~/.cache``, ``~/.npm``, ``~/.cargo``:
  package managers' caches, pip's among them); the network is open;
* ``full-access``: nothing confined.

The confinement is the kernel's (see `greenroom.sandbox.launcher`): a
Landlock domain per process, which also keeps its signals and abstract unix
sockets from reaching outside it (so a command cannot kill greenroom, its
keeper or the launcher, even as root), and, read only, a seccomp filter (no
socket, no change of a file's metadata).
Wherever this process may make cgroups, every process is also contained: in
a cgroup of its own, under its session's (`greenroom.sandbox.cgroups`), which
its end kills. `Protections` say what holds on this kernel (`protections`);
what does not is not pretended: a confined access the kernel cannot give runs
unconfined, and the callers that promise more (the ``bash`` tool's modes)
check `protections` first.

Processes are started by the launcher, one process per runtime, started at
the first spawn that needs it; a spawn without a sandbox, or with nothing to
confine or contain it, is started as before (``trio.lowlevel.open_process``).
Either way it is a marked `greenroom.procs.MarkedProcess`, and its `Child.end` kills
what it left: its process group, its cgroup, whatever carries its mark.

The names: `Sandboxes.spawn` and `Sandboxes.shell` start a process (a command through bash)
in a `Sandbox`; each session's ``TMPDIR`` and cgroups are made on first use and go with its
last process once the session ended (`Sandboxes.end_session`); `describe` and `confines` say
what the protections give. A started process is a `Child` (`wait`, `signal_group`, `end`).
The launcher's client speaks its wire Structs (`Launch`, `Confinement`, `ChildStarted`,
`Failed`, `Exited`: JSON arrays); `launching` says whether it is starting a process of a
Trio run's, which a test's virtual clock holds still for.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Final, Literal, Protocol, TypeAlias

import msgspec
import trio

from greenroom.procs import KILL_WAIT, MarkedProcess, exited, owner
from greenroom.protocol.events import Protections
from greenroom.sandbox import launcher
from greenroom.sandbox.cgroups import Containment, Places, SessionGroup, SpawnGroup

logger = logging.getLogger("greenroom.sandbox")

#: What a process may change: see the module.
Access: TypeAlias = Literal["read-only", "workspace-write", "full-access"]
ACCESSES: Final[tuple[Access, ...]] = ("read-only", "workspace-write", "full-access")

#: The devices a confined process may write (and ``ioctl``).
DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: Seconds the launcher has to exit once its control socket is closed.
_LAUNCHER_EXIT: Final = 5.0


class Confinement(msgspec.Struct, frozen=True, array_like=True):
    """A launch's confinement, as the launcher reads it (`greenroom.sandbox.launcher`)."""

    writable: list[str]
    devices: list[str]
    read_only: bool


class Launch(msgspec.Struct, frozen=True, array_like=True):
    """A launch request, as the launcher reads it."""

    argv: list[str]
    runner: list[str]
    cwd: str
    env: dict[str, str]
    cgroup: str | None
    limits: list[str]
    confinement: Confinement | None


class ChildStarted(msgspec.Struct, frozen=True, array_like=True, tag="Started"):
    pid: int


class Failed(msgspec.Struct, frozen=True, array_like=True, tag=True):
    errno: int
    message: str


class Exited(msgspec.Struct, frozen=True, array_like=True, tag=True):
    returncode: int


_replies: Final = msgspec.json.Decoder(ChildStarted | Failed | Exited)
#: What a confined child reads first: the launcher's gate, closed once nothing of the
#: launcher is in the child's domain (`greenroom.sandbox.launcher`).
_BASH_GATE: Final = f"read -r -u {launcher.GATE_FD} _; exec {launcher.GATE_FD}<&-; "
_SH_RUNNER: Final = [
    "/bin/sh",
    "-c",
    f'read -r _ <&{launcher.GATE_FD}; exec "$@" {launcher.GATE_FD}<&-',
    "sh",
]
_encode: Final = msgspec.json.Encoder().encode


class Sandbox(msgspec.Struct, frozen=True, gc=False):
    """How one process runs: its `access`, the `session` it is for (whose temporary
    directory and cgroups it gets; None: the runtime's own), and that session's
    directories (`roots`, writable under ``workspace-write``)."""

    access: Access
    session: str | None = None
    roots: tuple[str, ...] = ()


class SandboxSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A runtime's sandbox settings (``open_runtime(sandbox=...)``).

    ``cache_dirs``: written by ``workspace-write`` commands besides their session's
    directories (``~`` is the user's home; one that does not exist when a command starts
    stays unwritable for it). ``pids``, ``memory``: the most processes (threads count)
    and bytes of memory one session's processes may have at once, where a cgroup
    controller can hold them (None: no limit).
    """

    cache_dirs: tuple[str, ...] = ("~/.cache", "~/.npm", "~/.cargo")
    pids: int | None = 4096
    memory: int | None = 8 * 1024**3

    def __post_init__(self) -> None:
        for name in ("pids", "memory"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"SandboxSettings.{name} must be a positive int or None")


def confines(protections: Protections, access: Access) -> bool:
    """Whether the kernel gives `access` as the module says (``full-access`` always)."""
    if access == "full-access":
        return True
    if protections.filesystem == 0:
        return False
    return access != "read-only" or protections.read_only


def describe(protections: Protections) -> str:
    """What holds, in a line: each protection that does, then those that do not."""
    held: list[str] = []
    missing: list[str] = []
    (held if protections.filesystem else missing).append(
        f"writes confined (Landlock ABI {protections.filesystem})"
        if protections.filesystem
        else "writes confined (no Landlock)"
    )
    (held if protections.read_only else missing).append(
        "read only: network off, no metadata changes (seccomp)"
    )
    (held if protections.signals else missing).append("no signal leaves the sandbox")
    (held if protections.cgroup else missing).append("each command killed with its cgroup")
    for name, limit, unit in (
        ("processes", protections.pids, ""),
        ("memory", protections.memory, " bytes"),
    ):
        if limit is None:
            missing.append(f"{name} limit")
        else:
            held.append(f"{name} per session <= {limit:,}{unit}")
    line = "holds: " + "; ".join(held) if held else "holds: nothing"
    return f"{line}; unavailable: {'; '.join(missing)}" if missing else line


class Child(Protocol):
    """A process started through `Sandboxes.spawn`.

    ``pid`` names it, and its process group (it leads a session of its own); one
    the launcher started stays a zombie until `end`, so the pid is not reused
    before (one started directly is reaped by `wait`, as ``trio.Process`` is).
    `wait` returns its exit code (or minus the signal that killed it); `end`, once
    it has exited, kills what it left (its group, its cgroup, whatever carries its
    mark) and waits for that.
    """

    pid: int
    stdin: trio.abc.SendStream | None
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream | None

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def signal_group(self, sig: signal.Signals) -> None: ...

    async def end(self, wait: float = KILL_WAIT) -> None:
        """Once `wait` returned: SIGKILL what the process left and wait up to `wait`
        seconds for it to exit; then let the pid go. Idempotent; call it shielded."""
        ...


class Sandboxes:
    """A runtime's sandbox: what the kernel offers (`protections`), the launcher, the cgroups,
    each session's temporary directory. An async context manager: closing it ends
    whatever is left (after the runtime's processes have been ended by their owners)."""

    __slots__ = ("_containment", "_launcher", "_sessions", "_told", "protections", "settings")

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        abi = launcher.landlock_abi()
        machine = platform.machine()
        places = Places.probe()
        self._containment: Containment | None = None
        limits: dict[str, int] = {}
        if places.v2 is not None:
            wanted = {"pids": self.settings.pids, "memory": self.settings.memory}
            containment = Containment(places, {h: v for h, v in wanted.items() if v is not None})
            self._containment = containment
            limits = containment.limited
        self.protections = Protections(
            filesystem=abi,
            read_only=abi > 0 and _seccomp() and launcher.read_only_filter(machine) is not None,
            signals=abi >= 6,
            cgroup=self._containment is not None,
            pids=limits.get("pids"),
            memory=limits.get("memory"),
        )
        home = self._containment.home if self._containment is not None else None
        self._launcher = _Launcher(home or "")
        self._sessions: dict[str | None, _Session] = {}
        self._told: set[str] = set()

    def first_told(self, session: str) -> bool:
        """True the first time it is asked for `session` since its last `end_session`: the
        session's life should be told what holds (its log says it once per life)."""
        if session in self._told:
            return False
        self._told.add(session)
        return True

    async def __aenter__(self) -> Sandboxes:
        if self.protections.filesystem == 0 and not self.protections.cgroup:
            logger.warning(
                "this kernel offers no sandbox for commands (no Landlock, no cgroup of ours):"
                " they run with this process's full power"
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with trio.CancelScope(shield=True):
            for key in list(self._sessions):
                await self._forget(key)
            await self._launcher.aclose()
            if self._containment is not None:
                self._containment.close()

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        sandbox: Sandbox | None,
        stdin: Literal["null", "pipe"] = "null",
        stderr: Literal["pipe", "inherit"] = "pipe",
    ) -> Child:
        """Start `argv` as a process of its own session (its group's leader), marked, with
        `env` (``TMPDIR`` the session's temporary directory when it is confined), in
        `sandbox` as far as the kernel gives it (None: unconfined and uncontained, as
        without a sandbox). Raises `OSError` when it could not start (a missing program:
        `FileNotFoundError`). Its stdout is a pipe; stdin and stderr as asked. Confined,
        it is started through ``sh``, which waits for the launcher's gate first."""
        return await self._start(argv, argv, _SH_RUNNER, cwd, env, sandbox, stdin, stderr)

    async def shell(
        self, command: str, *, cwd: str, env: Mapping[str, str], sandbox: Sandbox | None
    ) -> Child:
        """`spawn` ``bash -c command`` (stdin ``/dev/null``); confined, the same bash waits
        for the launcher's gate before the command (no second program)."""
        argv = ["bash", "-c", command]
        gated = ["bash", "-c", _BASH_GATE + command]
        return await self._start(argv, gated, [], cwd, env, sandbox, "null", "pipe")

    async def _start(
        self,
        argv: Sequence[str],
        gated: Sequence[str],
        runner: list[str],
        cwd: str,
        env: Mapping[str, str],
        sandbox: Sandbox | None,
        stdin: Literal["null", "pipe"],
        stderr: Literal["pipe", "inherit"],
    ) -> Child:
        confined = (
            sandbox is not None
            and sandbox.access != "full-access"
            and confines(self.protections, sandbox.access)
        )
        if sandbox is None or not (confined or self._containment is not None):
            return await _Direct.start(argv, cwd, env, stdin, stderr)
        session = self._session(sandbox.session)
        env = dict(env)
        confinement = None
        if confined:
            env["TMPDIR"] = session.tmpdir()
            confinement = self._confinement(sandbox, session)
        group = session.spawn_group()
        session.live += 1
        key = sandbox.session

        async def ended() -> None:
            await self._spawn_ended(key)

        try:
            return await _Launched.start(
                self._launcher,
                ended,
                gated if confined else argv,
                runner if confined else [],
                cwd,
                env,
                stdin,
                stderr,
                group,
                confinement,
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                if group is not None:
                    with trio.move_on_after(KILL_WAIT):
                        await exited(group.kill())
                    await group.remove()
                await ended()
            raise

    def _confinement(self, sandbox: Sandbox, session: _Session) -> Confinement:
        writable = [session.tmpdir()]
        if sandbox.access == "workspace-write":
            writable.extend(sandbox.roots)
            writable.extend(os.path.expanduser(d) for d in self.settings.cache_dirs)
        return Confinement(writable, list(DEVICES), sandbox.access == "read-only")

    def _session(self, key: str | None) -> _Session:
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(self._containment)
        session.ending = False  # a session live again (resumed) before its last spawn ended
        return session

    async def end_session(self, key: str) -> None:
        """The session ended: its temporary directory and cgroups go once its last process
        has (now, if none is left)."""
        self._told.discard(key)
        session = self._sessions.get(key)
        if session is not None:
            session.ending = True
            if session.live == 0:
                await self._forget(key)

    async def _spawn_ended(self, key: str | None) -> None:
        session = self._sessions.get(key)
        if session is None:
            return
        session.live -= 1
        if session.ending and session.live == 0:
            await self._forget(key)

    async def _forget(self, key: str | None) -> None:
        session = self._sessions.pop(key)
        await session.remove()


class _Session:
    """One session's places: its temporary directory and cgroups (each made on first use),
    and how many of its processes have not ended."""

    __slots__ = ("_containment", "_group", "_tmpdir", "ending", "live")

    def __init__(self, containment: Containment | None) -> None:
        self._containment = containment
        self._group: SessionGroup | None = None
        self._tmpdir: str | None = None
        self.live = 0
        self.ending = False

    def tmpdir(self) -> str:
        if self._tmpdir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="greenroom-tmp-")
        return self._tmpdir

    def spawn_group(self) -> SpawnGroup | None:
        if self._containment is None:
            return None
        if self._group is None:
            self._group = self._containment.session()
        return self._group.spawn()

    async def remove(self) -> None:
        if self._group is not None:
            self._group.remove()
        if self._tmpdir is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(shutil.rmtree, self._tmpdir, True)


def _seccomp() -> bool:
    """Whether this kernel takes seccomp filters."""
    try:
        with open("/proc/self/status") as status:
            return any(line.startswith("Seccomp_filters:") for line in status)
    except OSError:
        return False


class _Direct:
    """A process started here, as without a sandbox (``trio.lowlevel.open_process``)."""

    __slots__ = ("_process", "_spawn", "pid", "stderr", "stdin", "stdout")

    def __init__(self, process: trio.Process, spawn: MarkedProcess) -> None:
        self._process = process
        self._spawn = spawn
        assert process.stdout is not None
        self.pid = process.pid
        self.stdin = process.stdin
        self.stdout: trio.abc.ReceiveStream = process.stdout
        self.stderr = process.stderr

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        stdin: Literal["null", "pipe"],
        stderr: Literal["pipe", "inherit"],
    ) -> _Direct:
        spawn = owner().spawn(dict(env))
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.DEVNULL if stdin == "null" else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr == "pipe" else None,
            cwd=cwd,
            env=spawn.env,
            start_new_session=True,
        )
        spawn.started(process.pid)
        return cls(process, spawn)

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def end(self, wait: float = KILL_WAIT) -> None:
        self.signal_group(signal.SIGKILL)
        sweep = self._spawn.end()
        if sweep is not None:
            with trio.move_on_after(wait):
                await exited(sweep.kill())


class _Launched:
    """A process the launcher started: its exit comes on its reply socket, and it stays
    a zombie (its pid and group id taken) until `end` closes that socket."""

    __slots__ = (
        "_ended",
        "_group",
        "_on_end",
        "_pidfd",
        "_reply",
        "_returncode",
        "_spawn",
        "_waited",
        "pid",
        "stderr",
        "stdin",
        "stdout",
    )

    def __init__(
        self,
        on_end: Callable[[], Awaitable[None]],
        spawn: MarkedProcess,
        group: SpawnGroup | None,
        started: tuple[int, int, trio.socket.SocketType],
        streams: tuple[
            trio.abc.SendStream | None, trio.abc.ReceiveStream, trio.abc.ReceiveStream | None
        ],
    ) -> None:
        self._on_end = on_end
        self._spawn = spawn
        self._group = group
        self.pid, self._pidfd, self._reply = started
        self.stdin, self.stdout, self.stderr = streams
        self._returncode: int | None = None
        self._waited = trio.Lock()
        self._ended = False

    @classmethod
    async def start(
        cls,
        via: _Launcher,
        on_end: Callable[[], Awaitable[None]],
        argv: Sequence[str],
        runner: list[str],
        cwd: str,
        env: dict[str, str],
        stdin: Literal["null", "pipe"],
        stderr: Literal["pipe", "inherit"],
        group: SpawnGroup | None,
        confinement: Confinement | None,
    ) -> _Launched:
        spawn = owner().spawn(env)
        request = Launch(
            list(argv),
            runner,
            cwd,
            spawn.env,
            None if group is None else group.directory,
            [] if group is None else group.limits,
            confinement,
        )
        ours: list[int] = []  # our ends of the pipes
        theirs: list[int] = []  # the child's, closed once sent
        try:
            if stdin == "null":
                theirs.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            else:
                read, write = os.pipe2(os.O_CLOEXEC)
                theirs.append(read)
                ours.append(write)
            for kind in ("pipe", stderr):
                if kind == "pipe":
                    read, write = os.pipe2(os.O_CLOEXEC)
                    ours.append(read)
                    theirs.append(write)
            stdio = (theirs[0], theirs[1], theirs[2] if stderr == "pipe" else 2)
            started = await via.launch(request, stdio)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        spawn.started(started[0])
        fds = iter(ours)
        streams = (
            None if stdin == "null" else trio.lowlevel.FdStream(next(fds)),
            trio.lowlevel.FdStream(next(fds)),
            trio.lowlevel.FdStream(next(fds)) if stderr == "pipe" else None,
        )
        return cls(on_end, spawn, group, started, streams)

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        async with self._waited:
            if self._returncode is None:
                self._returncode = await self._exit()
        return self._returncode

    async def _exit(self) -> int:
        data = await self._reply.recv(launcher.REPLY_BYTES)
        if data:
            reply = _replies.decode(data)
            if isinstance(reply, Exited):
                return reply.returncode
        # The launcher is gone (killed): the process is no longer its child, nor ours.
        logger.warning("the sandbox launcher exited; killing its process %d", self.pid)
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        await trio.lowlevel.wait_readable(self._pidfd)
        return -signal.SIGKILL

    def signal_group(self, sig: signal.Signals) -> None:
        if self._ended:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def end(self, wait: float = KILL_WAIT) -> None:
        if self._ended:
            return
        self.signal_group(signal.SIGKILL)
        self._ended = True
        pidfds = [] if self._group is None else self._group.kill()
        sweep = self._spawn.end()
        if sweep is not None:
            pidfds.extend(sweep.kill())
        try:
            with trio.move_on_after(wait):
                await exited(pidfds)
            if self._group is not None:
                await self._group.remove()
        finally:
            self._reply.close()  # the launcher reaps it now
            os.close(self._pidfd)
            await self._on_end()


#: Launches waiting for the launcher's answer, by the Trio run that waits (see `launching`).
_launching: dict[trio.lowlevel.TrioToken, int] = {}


def launching(token: trio.lowlevel.TrioToken) -> bool:
    """True while a launch of the run `token` names waits for the launcher's answer: real
    work of another process, which a test's virtual clock holds still for (as it does for
    a worker thread's)."""
    return _launching.get(token, 0) > 0


class _Launcher:
    """The launcher process (`greenroom.sandbox.launcher`), started at the first launch and
    again if it died; `aclose` ends it."""

    __slots__ = ("_control", "_home", "_process", "_sending", "_spawn")

    def __init__(self, home: str) -> None:
        self._home = home  # the cgroup v2 directory the launcher is in ("": none of ours)
        self._process: trio.Process | None = None
        self._spawn: MarkedProcess | None = None
        self._control: trio.socket.SocketType | None = None
        self._sending = trio.Lock()  # one request on the control socket at a time

    async def _running(self) -> trio.socket.SocketType:
        """The control socket of the launcher, started now if it is not running."""
        if self._control is not None and self._process is not None:
            if self._process.poll() is None:
                return self._control
            code = self._process.returncode
            logger.warning("the sandbox launcher exited (%s); starting another", code)
            await self.aclose()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spawn = owner().spawn({})
        try:
            self._process = await trio.lowlevel.open_process(
                [sys.executable, "-I", "-S", launcher.__file__, self._home],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                env=spawn.env,
                start_new_session=True,  # a terminal's signals are greenroom's
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        spawn.started(self._process.pid)
        self._spawn = spawn
        self._control = trio.socket.from_stdlib_socket(ours)
        return self._control

    async def launch(
        self, request: Launch, stdio: tuple[int, int, int]
    ) -> tuple[int, int, trio.socket.SocketType]:
        """Have the launcher start `request` with `stdio`: its pid, pidfd and reply socket;
        `OSError` when it did not start.

        A cancel while the launcher answers closes the reply socket, which has the
        launcher kill what it started (`greenroom.sandbox.launcher`)."""
        body = _encode(request)
        frame = memoryview(launcher.HEADER.pack(len(body)) + body)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        reply = trio.socket.from_stdlib_socket(ours)
        token = trio.lowlevel.current_trio_token()
        _launching[token] = _launching.get(token, 0) + 1
        try:
            with trio.CancelScope(shield=True):  # half a request would garble the next
                async with self._sending:
                    control = await self._running()
                    fds = array.array("i", [theirs.fileno(), *stdio])
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
                    try:
                        sent = await control.sendmsg([frame], rights)
                        while sent < len(frame):
                            sent += await control.send(frame[sent:])
                    except OSError as exc:
                        raise OSError(exc.errno, "the sandbox launcher is gone") from exc
            theirs.close()
            data, ancillary, _flags, _address = await reply.recvmsg(
                launcher.REPLY_BYTES, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC
            )
        except BaseException:
            reply.close()
            raise
        finally:
            theirs.close()
            _launching[token] -= 1
            if not _launching[token]:
                del _launching[token]
        pidfds = [
            fd
            for level, kind, payload in ancillary
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
            for fd in array.array("i", payload[: len(payload) - len(payload) % 4])
        ]
        answer = _replies.decode(data) if data else None
        if isinstance(answer, ChildStarted) and len(pidfds) == 1:
            return answer.pid, pidfds[0], reply
        for fd in pidfds:
            os.close(fd)
        reply.close()
        if isinstance(answer, Failed):
            raise OSError(answer.errno, f"{answer.message}: {request.argv[0]!r}")
        raise OSError("the sandbox launcher exited during a launch")

    async def aclose(self) -> None:
        """End the launcher (it kills whatever it still runs), reaped within its time."""
        control, process, spawn = self._control, self._process, self._spawn
        self._control = self._process = self._spawn = None
        if control is None or process is None or spawn is None:
            return
        control.close()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_LAUNCHER_EXIT):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            sweep = spawn.end()
            if sweep is not None:
                with trio.move_on_after(KILL_WAIT):
                    await exited(sweep.kill())
