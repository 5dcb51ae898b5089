"""The launcher: one process per runtime that starts commands confined by the kernel.

Run as a script (``python -I -S launcher.py HOME``, stdin the control socket,
``HOME`` this process's cgroup v2 directory or empty), it reads launch
requests and serves each on a thread of its own, which restricts itself and
then starts the child with ``posix_spawn`` (a ``vfork``: nothing of this
process is copied), so the child starts with the thread's restrictions: they
are per thread, and a child inherits its creator thread's. Greenroom cannot do
this itself: its threads are Trio's, a restriction is for good, and
``preexec_fn`` runs the interpreter in a ``fork`` of the whole runtime beside
Trio's worker threads (costly, and unsafe). Forking this process instead, to
restrict the child between fork and exec, was measured and rejected: each
fork of a Python process copied its page tables and faulted its pages back
(1.4 ms of CPU a command in a VM, against 0.5 ms for the thread).

The launch's thread, in this order: enters the spawn's cgroups (this whole
process for the v2 one, moved back once the child runs; the thread alone for
the v1 limit ones, ``tasks``), and, for a confined launch: sets
``no_new_privs``, drops the capabilities that reach under the sandbox
(`DROPPED_CAPABILITIES`; a root command's only), enters its Landlock domain (a
ruleset built for it) and, when it is read only, installs a seccomp filter
(`read_only_filter`) that refuses opening sockets and changing files'
metadata; then it changes to the child's directory and spawns it, in a session
of its own. A failure comes back as the launch's answer.

The thread shares its domain with the child, and a domain's processes may
signal each other: while the thread lives, the child could kill or stop this
process through it. So a confined child is started gated: its fd 3 is a pipe
this process closes only once that thread is gone (``pidfd_open`` with
``PIDFD_THREAD``, or ``/proc`` before Linux 6.9), and its program reads fd 3
before anything else (greenroom starts bash with ``read -u 3`` first, and any
other program through ``sh``, which reads it and execs the program: the
launch's ``runner``). Nothing of this process is in a child's domain
by the time the child's own code runs.

The protocol, over the control socket (a stream: greenroom writes a 4-byte
length and a launch request, its first byte carrying four descriptors: the
reply socket, then the child's stdin, stdout and stderr) and over each
launch's own reply socket (a ``SOCK_SEQPACKET`` pair end, one reply per
packet): ``["Started", pid]`` (with the child's pidfd), or ``["Failed", errno,
message]``; then, once the child has exited, ``["Exited", returncode]``. Each
is JSON, the array form of the msgspec Structs greenroom declares them as
(`greenroom.sandbox.sandboxes.Launch`, ``Started``...). An exited child stays
a zombie, so its pid (and its process group's id) names no one else, until
greenroom closes its end of the reply socket: then it is reaped. A reply
socket closed before the child exited gets its process group SIGKILLed. When
the control socket ends (greenroom closed it, or died), every child's group is
SIGKILLed and the launcher exits.

Stdlib only (the interpreter runs with ``-I -S``): greenroom imports this
module for the probes of what the kernel offers.

Landlock is reached through `ctypes` (system calls 444 to 446); `landlock_abi` and
`read_only_filter` are the probes greenroom imports.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import errno
import json
import os
import platform
import select
import signal
import socket
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

# -- the protocol --------------------------------------------------------------------------


class _Confinement:
    """What a confined child may do beyond reading: the directories (and all beneath) it may
    write, the device files it may write; ``read_only``: it opens no socket and changes no
    file's metadata either (`read_only_filter`). Read from ``[writable, devices, read_only]``."""

    __slots__ = ("devices", "read_only", "writable")

    def __init__(self, writable: list[str], devices: list[str], read_only: bool) -> None:
        self.writable = writable
        self.devices = devices
        self.read_only = read_only


class _Launch:
    """Start ``argv`` (its program looked up on the ``PATH`` of ``env``, from ``cwd``) in
    ``cwd``, in the cgroup v2 directory ``cgroup`` (None: none) and the v1 ones ``limits``,
    confined by ``confinement`` (None: not confined; else gated, see the module), run by
    ``runner`` if given (its program given whole: ``sh -c SCRIPT sh``, then ``argv``). Read
    from ``[argv, runner, cwd, env, cgroup, limits, confinement]``."""

    __slots__ = ("argv", "cgroup", "confinement", "cwd", "env", "limits", "runner")

    def __init__(self, wire: list[object]) -> None:
        argv, runner, cwd, env, cgroup, limits, confinement = wire
        assert isinstance(argv, list)
        assert isinstance(runner, list)
        assert isinstance(cwd, str)
        assert isinstance(env, dict)
        assert cgroup is None or isinstance(cgroup, str)
        assert isinstance(limits, list)
        self.argv: list[str] = argv
        self.runner: list[str] = runner
        self.cwd = cwd
        self.env: dict[str, str] = env
        self.cgroup = cgroup
        self.limits: list[str] = limits
        self.confinement = None
        if confinement is not None:
            assert isinstance(confinement, list)
            self.confinement = _Confinement(*confinement)


#: The descriptor a confined child's program must read to its end before it does anything.
GATE_FD: Final = 3
#: The descriptors a launch request carries: the reply socket, stdin, stdout, stderr.
LAUNCH_FDS: Final = 4
#: The most bytes one reply packet takes.
REPLY_BYTES: Final = 4096
HEADER: Final = struct.Struct("!I")

# -- Landlock ------------------------------------------------------------------------------

_SYS_LANDLOCK_CREATE_RULESET: Final = 444  # the same number on every architecture
_SYS_LANDLOCK_ADD_RULE: Final = 445
_SYS_LANDLOCK_RESTRICT_SELF: Final = 446
_CREATE_RULESET_VERSION: Final = 1
_RULE_PATH_BENEATH: Final = 1

FS_WRITE_FILE: Final = 1 << 1
FS_REMOVE_DIR: Final = 1 << 4
FS_REMOVE_FILE: Final = 1 << 5
FS_MAKE_CHAR: Final = 1 << 6
FS_MAKE_DIR: Final = 1 << 7
FS_MAKE_REG: Final = 1 << 8
FS_MAKE_SOCK: Final = 1 << 9
FS_MAKE_FIFO: Final = 1 << 10
FS_MAKE_BLOCK: Final = 1 << 11
FS_MAKE_SYM: Final = 1 << 12
FS_REFER: Final = 1 << 13  # ABI 2
FS_TRUNCATE: Final = 1 << 14  # ABI 3
FS_IOCTL_DEV: Final = 1 << 15  # ABI 5
NET_BIND_TCP: Final = 1 << 0  # ABI 4
NET_CONNECT_TCP: Final = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0  # ABI 6
SCOPE_SIGNAL: Final = 1 << 1

#: Every access that changes the file system, by the ABI that brought it. Reads and
#: execution are not handled: the whole file system stays readable.
_WRITES: Final = (
    (
        1,
        FS_WRITE_FILE
        | FS_REMOVE_DIR
        | FS_REMOVE_FILE
        | FS_MAKE_CHAR
        | FS_MAKE_DIR
        | FS_MAKE_REG
        | FS_MAKE_SOCK
        | FS_MAKE_FIFO
        | FS_MAKE_BLOCK
        | FS_MAKE_SYM,
    ),
    (2, FS_REFER),
    (3, FS_TRUNCATE),
    (5, FS_IOCTL_DEV),
)
#: What may be granted on a file that is not a directory.
_FILE_ACCESS: Final = FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)


def _check(result: int) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def landlock_abi() -> int:
    """The Landlock ABI the kernel offers (0: none: not built in, or not enabled)."""
    result = _syscall(
        _SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION
    )
    return max(int(result), 0)


def handled_writes(abi: int) -> int:
    """The file system writes a ruleset of `abi` handles."""
    handled = 0
    for since, access in _WRITES:
        if abi >= since:
            handled |= access
    return handled


def ruleset(confinement: _Confinement, abi: int) -> int:
    """A Landlock ruleset's descriptor (close-on-exec) for `confinement` under `abi`.

    Every write is refused but beneath its writable directories (all writes) and on its
    devices (writing, truncating, ``ioctl``); paths that do not exist, or that this
    process cannot reach, are skipped. TCP
    bind and connect are refused too when it is read only (ABI 4; its seccomp filter
    refuses every socket); signals and abstract unix sockets do not reach outside the
    domain (ABI 6).
    """
    handled = handled_writes(abi)
    network = NET_BIND_TCP | NET_CONNECT_TCP if confinement.read_only and abi >= 4 else 0
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    attr = _RulesetAttr(handled, network, scoped)
    fd = _check(_syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0))
    try:
        for path in confinement.writable:
            _allow(fd, path, handled)
        for path in confinement.devices:
            _allow(fd, path, handled & _FILE_ACCESS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _allow(ruleset_fd: int, path: str, access: int) -> None:
    try:
        place = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, PermissionError):  # nothing to write there, then
        return
    try:
        if not os.path.isdir(f"/proc/self/fd/{place}"):
            access &= _FILE_ACCESS
        rule = _PathBeneath(access, place)
        _check(
            _syscall(_SYS_LANDLOCK_ADD_RULE, ruleset_fd, _RULE_PATH_BENEATH, ctypes.byref(rule), 0)
        )
    finally:
        os.close(place)


# -- seccomp: what read only refuses beyond Landlock ---------------------------------------

_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_SET_SECCOMP: Final = 22
_PR_CAPBSET_DROP: Final = 24
_SECCOMP_MODE_FILTER: Final = 2
_RET_ALLOW: Final = 0x7FFF0000
_RET_ERRNO: Final = 0x00050000
_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_JGE_K: Final = 0x35
_RET_K: Final = 0x06
_X32: Final = 0x40000000

#: Per machine (``uname -m``): its audit architecture, and the system calls a read-only
#: command may not make: those that reach a network (``socket``; ``io_uring_setup``, since
#: io_uring opens sockets without a system call a filter sees), and those that change a
#: file's mode, owner, times or extended attributes, which Landlock does not handle.
_READ_ONLY_REFUSED: Final = {
    "x86_64": (
        0xC000003E,
        (
            41,  # socket
            425,  # io_uring_setup
            90,  # chmod
            91,  # fchmod
            268,  # fchmodat
            452,  # fchmodat2
            92,  # chown
            93,  # fchown
            94,  # lchown
            260,  # fchownat
            132,  # utime
            235,  # utimes
            261,  # futimesat
            280,  # utimensat
            188,  # setxattr
            189,  # lsetxattr
            190,  # fsetxattr
            463,  # setxattrat
            197,  # removexattr
            198,  # lremovexattr
            199,  # fremovexattr
            466,  # removexattrat
        ),
    ),
    "aarch64": (
        0xC00000B7,
        (
            198,  # socket
            425,  # io_uring_setup
            52,  # fchmod
            53,  # fchmodat
            452,  # fchmodat2
            54,  # fchownat
            55,  # fchown
            88,  # utimensat
            5,  # setxattr
            6,  # lsetxattr
            7,  # fsetxattr
            463,  # setxattrat
            14,  # removexattr
            15,  # lremovexattr
            16,  # fremovexattr
            466,  # removexattrat
        ),
    ),
}


def _instruction(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def read_only_filter(machine: str) -> bytes | None:
    """The seccomp program (classic BPF) of a read-only command: the calls of
    `_READ_ONLY_REFUSED` fail (``EACCES``), as does every call of another ABI (i386,
    x32: their numbers differ, and 32-bit programs are rare enough to refuse); the rest
    go through. None for a machine without a table."""
    known = _READ_ONLY_REFUSED.get(machine)
    if known is None:
        return None
    arch, calls = known
    program = [
        _instruction(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _instruction(_JEQ_K, 0, len(calls) + 3, arch),  # another ABI: to the ERRNO return
        _instruction(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        _instruction(_JGE_K, len(calls) + 1, 0, _X32),  # x32 shares the architecture
    ]
    for index, call in enumerate(calls):
        program.append(_instruction(_JEQ_K, len(calls) - index, 0, call))
    program.append(_instruction(_RET_K, 0, 0, _RET_ALLOW))
    program.append(_instruction(_RET_K, 0, 0, _RET_ERRNO | errno.EACCES))
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


#: Capabilities a confined root command loses (from its bounding set, so its exec gets
#: none of them): those that act on the kernel, the machine or other processes beneath
#: Landlock (loading modules, raw I/O, BPF, ptrace, mounts and namespaces, the network's
#: configuration, the clock, rebooting).
DROPPED_CAPABILITIES: Final = (
    12,  # CAP_NET_ADMIN
    13,  # CAP_NET_RAW
    16,  # CAP_SYS_MODULE
    17,  # CAP_SYS_RAWIO
    19,  # CAP_SYS_PTRACE
    21,  # CAP_SYS_ADMIN
    22,  # CAP_SYS_BOOT
    25,  # CAP_SYS_TIME
    27,  # CAP_MKNOD
    30,  # CAP_AUDIT_CONTROL
    32,  # CAP_MAC_OVERRIDE
    33,  # CAP_MAC_ADMIN
    34,  # CAP_SYSLOG
    38,  # CAP_PERFMON
    39,  # CAP_BPF
    40,  # CAP_CHECKPOINT_RESTORE
)


# -- the launcher --------------------------------------------------------------------------

_PIDFD_THREAD: Final = os.O_EXCL  # Linux 6.9: a pidfd of one thread
#: Signals the launcher ignores or handles, set back to their defaults in a child.
_DEFAULTS: Final = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT)


class _Child:
    __slots__ = ("exited", "pid", "pidfd", "released", "reply")

    def __init__(self, pid: int, pidfd: int, reply: socket.socket) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.reply = reply
        self.exited = False
        self.released = False


class _Spawning:
    """One launch on its thread: what it enters, how it is confined, and what came of it."""

    __slots__ = ("_done", "cgroup", "domain", "error", "launch", "limits", "pid", "stdio", "tid")

    def __init__(
        self,
        launch: _Launch,
        stdio: list[int],
        cgroup: int | None,
        limits: list[int],
        domain: int | None,
    ) -> None:
        self.launch = launch
        self.stdio = stdio
        self.cgroup = cgroup
        self.limits = limits
        self.domain = domain
        self.pid: int | None = None
        self.tid = 0
        self.error: OSError | None = None
        self._done = _thread.allocate_lock()

    def run(self, launcher: _Launcher) -> None:
        """Spawn on a new thread; return once it has, or failed."""
        self._done.acquire()
        _thread.start_new_thread(self._spawn, (launcher,))
        self._done.acquire()

    def _spawn(self, launcher: _Launcher) -> None:
        self.tid = _thread.get_native_id()
        try:
            if self.cgroup is not None:
                os.write(self.cgroup, b"0")  # this process: v2 moves no single thread
            for tasks in self.limits:
                os.write(tasks, str(self.tid).encode())  # this thread only
            if self.domain is not None:
                launcher.confine(self.launch, self.domain)
            launch = self.launch
            os.chdir(launch.cwd)
            program = _program(launch.argv[0], launch.env)
            argv = [*launch.runner, program, *launch.argv[1:]] if launch.runner else launch.argv
            actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(self.stdio)]
            self.pid = os.posix_spawn(
                argv[0] if launch.runner else program,
                argv,
                launch.env,
                file_actions=actions,
                setsid=True,
                setsigdef=_DEFAULTS,
            )
        except OSError as exc:
            self.error = exc
        finally:
            self._done.release()


def _program(name: str, env: dict[str, str]) -> str:
    """`name` looked up on the ``PATH`` of `env`, as ``subprocess`` does; `OSError` if it
    is not there (a runner would report that only once started)."""
    if "/" in name:
        if not os.path.exists(name):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
        if not os.access(name, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return name
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))


def _wait_gone(tid: int) -> None:
    """Return once the thread `tid` of this process has exited."""
    try:
        fd = os.pidfd_open(tid, _PIDFD_THREAD)
    except ProcessLookupError:
        return
    except OSError:  # before Linux 6.9
        while os.path.exists(f"/proc/self/task/{tid}"):
            time.sleep(0.0001)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


class _Launcher:
    """The launcher's state: the control socket, its home cgroup, the children by their
    descriptors."""

    def __init__(self, control: socket.socket, home: str) -> None:
        self._control = control
        self._poll = select.poll()
        self._poll.register(control, select.POLLIN)
        self._by_fd: dict[int, _Child] = {}
        self._tid = 0  # the thread of the last launch
        self._home = os.open(f"{home}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) if home else None
        self._abi = landlock_abi()
        self._euid = os.geteuid()
        program = read_only_filter(platform.machine())
        self._filter = None if program is None else ctypes.create_string_buffer(program)
        self._fprog = (
            None
            if self._filter is None or program is None
            else _SockFprog(len(program) // 8, ctypes.addressof(self._filter))
        )

    def serve(self) -> None:
        while True:
            for fd, _events in self._poll.poll():
                if fd == self._control.fileno():
                    if not self._request():
                        self._end()
                        return
                    continue
                child = self._by_fd.get(fd)
                if child is None:
                    continue
                if fd == child.pidfd:
                    self._exited(child)
                else:
                    self._released(child)

    def _request(self) -> bool:
        """Read and serve one launch; False once the control socket has ended."""
        header, fds = _receive(self._control, HEADER.size)
        if header is None:
            return False
        try:
            (size,) = HEADER.unpack(header)
            body = _exactly(self._control, size)
            if body is None or len(fds) != LAUNCH_FDS:
                return False
            reply = socket.socket(fileno=fds[0])
            self._launch(_Launch(json.loads(body)), reply, fds[1:])
        finally:
            for fd in fds[1:]:
                os.close(fd)
        return True

    def _launch(self, launch: _Launch, reply: socket.socket, stdio: list[int]) -> None:
        """Start `launch`; answer on `reply` (and keep the child), or say why it did not."""
        gate = os.pipe2(os.O_CLOEXEC) if launch.confinement is not None else None
        try:
            spawning = self._spawn(launch, stdio if gate is None else [*stdio, gate[0]])
        except OSError as exc:
            _send(reply, ["Failed", exc.errno or 0, f"{exc.strerror or exc}"])
            reply.close()
            return
        finally:
            if gate is not None:
                os.close(gate[0])
        pid, pidfd = spawning
        _send(reply, ["Started", pid], pidfd)
        if gate is not None:
            _wait_gone(self._tid)  # nothing of this process is in the child's domain now
            os.close(gate[1])
        child = _Child(pid, pidfd, reply)
        self._by_fd[pidfd] = child
        self._by_fd[reply.fileno()] = child
        self._poll.register(pidfd, select.POLLIN)
        self._poll.register(reply, select.POLLIN)

    def _spawn(self, launch: _Launch, stdio: list[int]) -> tuple[int, int]:
        """Spawn `launch` from a thread of its own: its pid and pidfd."""
        opened: list[int] = []
        try:
            cgroup = None
            if launch.cgroup is not None:
                cgroup = os.open(f"{launch.cgroup}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
                opened.append(cgroup)
            limits = [os.open(f"{d}/tasks", os.O_WRONLY | os.O_CLOEXEC) for d in launch.limits]
            opened.extend(limits)
            domain = None
            if launch.confinement is not None:
                domain = self._domain(launch.confinement)
                opened.append(domain)
            spawning = _Spawning(launch, stdio, cgroup, limits, domain)
            spawning.run(self)
            self._tid = spawning.tid
            if cgroup is not None and self._home is not None:
                os.write(self._home, b"0")  # back home: a spawn's cgroup is killed with it
        finally:
            for fd in opened:
                os.close(fd)
        if spawning.error is not None:
            raise spawning.error
        assert spawning.pid is not None
        return spawning.pid, os.pidfd_open(spawning.pid)  # our child, not reaped: it is there

    def _domain(self, confinement: _Confinement) -> int:
        """The Landlock ruleset of `confinement`; `OSError` if the kernel cannot give it."""
        if self._abi == 0:
            raise OSError(errno.ENOSYS, "Landlock is not available")
        if confinement.read_only and self._fprog is None:
            raise OSError(errno.ENOSYS, f"no seccomp table for {platform.machine()}")
        return ruleset(confinement, self._abi)

    def confine(self, launch: _Launch, domain: int) -> None:
        """Restrict the calling thread (and so what it spawns) as `launch` says."""
        confinement = launch.confinement
        assert confinement is not None
        _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        if self._euid == 0:
            for capability in DROPPED_CAPABILITIES:
                _prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL: an older kernel's
        _check(_syscall(_SYS_LANDLOCK_RESTRICT_SELF, domain, 0))
        if confinement.read_only:
            assert self._fprog is not None
            fprog = ctypes.addressof(self._fprog)
            _check(_prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0))

    def _exited(self, child: _Child) -> None:
        """The child has exited: tell greenroom (it stays a zombie until released)."""
        self._poll.unregister(child.pidfd)
        del self._by_fd[child.pidfd]
        child.exited = True
        result = os.waitid(os.P_PIDFD, child.pidfd, os.WEXITED | os.WNOWAIT)
        os.close(child.pidfd)
        if result is None:
            returncode = -signal.SIGKILL  # cannot be: it is our child, and exited
        elif result.si_code == os.CLD_EXITED:
            returncode = result.si_status
        else:
            returncode = -result.si_status
        if child.released:
            os.waitpid(child.pid, 0)
            return
        _send(child.reply, ["Exited", returncode])

    def _released(self, child: _Child) -> None:
        """Greenroom closed its end: reap the child, or kill its group first if it runs."""
        self._poll.unregister(child.reply)
        del self._by_fd[child.reply.fileno()]
        child.reply.close()
        child.released = True
        if child.exited:
            os.waitpid(child.pid, 0)
        else:
            _kill_group(child.pid)  # reaped once it has exited (its pidfd is still polled)

    def _end(self) -> None:
        """Greenroom is gone or done: kill every child's group; init reaps what is left."""
        for child in self._by_fd.values():
            if not child.exited:
                _kill_group(child.pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _send(reply: socket.socket, message: list[object], fd: int | None = None) -> None:
    """Send one reply; a greenroom that closed its end no longer needs it."""
    ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]
    with contextlib.suppress(OSError):
        reply.sendmsg([json.dumps(message).encode()], ancillary, socket.MSG_NOSIGNAL)


def _receive(control: socket.socket, size: int) -> tuple[bytes | None, list[int]]:
    """`size` bytes and the descriptors sent with them; None at the end of the stream."""
    space = socket.CMSG_SPACE(LAUNCH_FDS * 4)
    data, ancillary, _flags, _address = control.recvmsg(size, space, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    rest = _exactly(control, size - len(data))
    if rest is None:
        for fd in fds:
            os.close(fd)
        return None, []
    return data + rest, fds


def _exactly(control: socket.socket, size: int) -> bytes | None:
    chunks = []
    while size > 0:
        chunk = control.recv(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is greenroom's to handle
    _Launcher(socket.socket(fileno=0), sys.argv[1]).serve()


if __name__ == "__main__":
    main()
