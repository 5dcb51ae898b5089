"""No process outlives its owner: marks on what greenroom starts, and the sweeps that end them.

Every process greenroom starts (a bash command, an MCP stdio server) is a
`MarkedProcess`: its environment carries ``GREENROOM_OWNER``, a ``:``-separated chain
of marks, to which the spawn adds its own, ``<token>.<n>``. The token is
random, one per greenroom process (`ProcessOwner`); ``n`` counts its spawns.
Children inherit the environment, so whatever a spawn starts, in its process
group or detached from it (``setsid``, a double fork), carries the mark, and
a process of a spawn is found by reading ``/proc/PID/environ``. Three sweeps
use it, one for each way an owner ends:

* **The spawn ends** (its shell or server has exited and been reaped, and its
  group SIGKILLed by its caller): `MarkedProcess.end` kills every process still
  carrying the spawn's mark, so a detached child does not outlive the command
  that started it. It looks only at processes started since the spawn: the
  kernel hands pids out in cyclic order, so those are the pids above the
  spawn's up to the last handed out (``ns_last_pid``), each looked at when
  there are few (`_PROBE`, skipping this process's own spawns), else those
  of one ``listdir("/proc")``; every process once the spawn is older than
  `FULL_SCAN_AFTER` (the pids may have gone round since).
* **The greenroom process dies**, even by SIGKILL: a keeper, started once per
  process at its first spawn (this file run as a script, stdlib only, through
  a shell that exits at once, so it is init's child in a session of its own),
  holds the read end of a pipe whose write end only greenroom holds and never
  writes. The pipe's end, however greenroom ended, wakes it: it SIGKILLs
  every process carrying any mark of the token, and the process group of
  each such process that leads one (a member that replaced its environment
  goes with its group), then exits. Each spawn checks that the keeper still
  runs (its end of the pipe is open) and starts another if not.
* **Its cgroups** (where it could make them: `greenroom.sandbox`): every process a
  spawn started, whatever it did to its environment or its process group, is in
  a cgroup under ``greenroom-<token>`` (`cgroup_tree`), which the keeper kills
  (``cgroup.kill``) and removes too, as the next holder's sweep does.
* **The keeper died too** (killed with its owner): the next holder of one of
  the dead process's sessions sweeps every process carrying the dead
  process's token (`sweep_owner`), which the session lock records beside the
  lock (`greenroom.session.persistence.lock`), once it has checked that the
  holder is gone (its pid no longer runs with its start time).

Killing goes through a pidfd opened before the mark is read again, so a pid
reused in between is never signalled. What this does not reach: a process
that rewrote or replaced its environment (``env -i``, a setuid program
whose environment cannot be read) and also left its spawn's process group.

Why not ``PR_SET_PDEATHSIG``: it needs code between fork and exec, and in
Python that is ``preexec_fn``, which turns ``vfork`` into ``fork`` and runs
the interpreter in the child: measured, a ``bash -c true`` went from 2.2 to
3.6 ms. It would also fire when the thread that forked the child exits, and
Trio forks from its thread cache, whose threads exit once idle. And it
covers only the direct child, not what that child started. The keeper covers
every descendant and costs a ``poll`` of its pipe per spawn.

Why not ``PR_SET_CHILD_SUBREAPER``: it is process-wide, so a process
embedding greenroom would adopt every orphan of every child it has, and
nothing tells greenroom's reaper an adopted orphan from another library's
child whose exit status it would steal. The marks find detached descendants
wherever they were re-parented; their new parent (init) reaps them.

Linux only: elsewhere (no ``/proc``) spawns carry the mark but no sweep finds
anything, no keeper starts, and a process's group is all that is killed.

The names: `ProcessOwner` (this process's token, its spawns, its keeper; `owner` gives
it), `MarkedProcess` (one spawn's mark; its `end` tells from the pids handed out since
whether a `Sweep` must look for what still carries it), `exited` (waits on the pidfds of
what was killed), `sweep_owner`, `start_time` and `alive`; this process's cgroups:
`cgroup_places`, `cgroup_tree` (``greenroom-<token>`` in each hierarchy),
`remove_cgroup_tree` (``cgroup.kill``, wait, remove). Run as a script it is the keeper
(stdlib only: the marks, then the cgroups).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

logger = logging.getLogger("greenroom.procs")

#: The environment variable that carries the marks of a process's owners.
MARK_VAR: Final = "GREENROOM_OWNER"
#: A spawn older than this, in seconds, is swept across every process (pids may have wrapped).
FULL_SCAN_AFTER: Final = 1.0
#: Seconds a sweep waits for the processes it SIGKILLed to exit.
KILL_WAIT: Final = 2.0
#: Times a sweep looks again for processes forked while it was killing.
_ROUNDS: Final = 5
#: Pids handed out since a spawn up to which each is looked at, rather than the whole table.
_PROBE: Final = 64
_MARK_ENTRY: Final = MARK_VAR.encode() + b"="
_PROC: Final = "/proc"
_KEEPER_SHELL: Final = 'exec "$0" -I -S "$1" "$2" <&3 3<&- &'

Match = Callable[[list[bytes]], bool]


def _marks(pid: int) -> list[bytes] | None:
    """The marks in `pid`'s environment ([] without any), None if it cannot be read."""
    try:
        fd = os.open(f"{_PROC}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    environ = b"".join(chunks)
    at = environ.find(b"\0" + _MARK_ENTRY)
    if at >= 0:
        at += 1
    elif environ.startswith(_MARK_ENTRY):
        at = 0
    else:
        return []
    end = environ.find(b"\0", at)
    return environ[at + len(_MARK_ENTRY) : None if end < 0 else end].split(b":")


def start_time(pid: int) -> int | None:
    """`pid`'s start time (clock ticks since boot, ``/proc/PID/stat``), None if it is gone."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def alive(pid: int, start: int | None) -> bool:
    """Whether `pid` still runs as the process that started at `start`."""
    return start is not None and start_time(pid) == start


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's: it cannot carry our mark and stay ours
    return True


def _own_threads() -> set[int]:
    """This process's thread ids (from the same number space as pids)."""
    try:
        return {int(name) for name in os.listdir(f"{_PROC}/self/task")}
    except OSError:
        return set()


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_PROC) if name.isdigit()]
    except OSError:
        return []


def _open_last_pid() -> int | None:
    try:
        return os.open(f"{_PROC}/sys/kernel/ns_last_pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


_last_pid_fd: Final = _open_last_pid()


def _last_pid() -> int | None:
    """The last pid the kernel handed out in this pid namespace (None: unknown)."""
    if _last_pid_fd is None:
        return None
    try:
        return int(os.pread(_last_pid_fd, 32, 0))
    except (OSError, ValueError):
        return None


def _wait_exited(fds: list[int], timeout: float) -> None:
    """Block until each pidfd's process has exited, at most `timeout` seconds; close them."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    pending = set(fds)
    deadline = time.monotonic() + timeout
    try:
        while pending and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                pending.discard(fd)
        if pending:
            logger.warning("%d swept processes had not exited after SIGKILL", len(pending))
    finally:
        for fd in fds:
            os.close(fd)


def _kill_marked(candidates: Iterable[int], match: Match, killed: dict[int, int]) -> bool:
    """SIGKILL each candidate whose marks `match`, filing its pidfd by pid; True if any was."""
    found = False
    for pid in candidates:
        marks = _marks(pid)
        if not marks or not match(marks):
            continue
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        marks = _marks(pid)  # the pidfd pins the process: is it still the one we read?
        if not marks or not match(marks):
            os.close(fd)
            continue
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        killed[pid] = fd
        found = True
    return found


def _kill_all(candidates: Callable[[], Iterable[int]], match: Match) -> list[int]:
    """SIGKILL what matches, looking again while a look finds some (their forks race the
    kill); the pidfds of what was killed.

    Reading a process's environment takes its memory map's lock: a process
    stuck holding it (an ``mmap`` on a hung file system) would hold the read.
    """
    killed: dict[int, int] = {}
    for _ in range(_ROUNDS):
        if not _kill_marked((p for p in candidates() if p not in killed), match, killed):
            break
    return list(killed.values())


def sweep_owner(token: str) -> int:
    """SIGKILL every process carrying a mark of `token`, and wait for them; how many there were.
    Then kill and remove `token`'s cgroups, if it made any here (`cgroup_tree`).

    For a token whose process is gone (the next holder's sweep, the keeper).
    Blocking (it waits up to `KILL_WAIT` seconds): call it from a thread.
    """
    prefix = token.encode() + b"."
    killed = _kill_all(_pids, lambda marks: any(m.startswith(prefix) for m in marks))
    _wait_exited(killed, KILL_WAIT)
    remove_cgroup_tree(cgroup_tree(token))
    return len(killed)


# -- cgroups ---------------------------------------------------------------------------------

#: The cgroup hierarchies greenroom uses: v2 (``""``), and the v1 ones it can limit with.
HIERARCHIES: Final = ("", "pids", "memory")


def cgroup_places() -> dict[str, str]:
    """This process's cgroup directories: by hierarchy (`HIERARCHIES`), those mounted."""
    mounts: dict[str, tuple[str, str]] = {}  # hierarchy -> (its root in the mount, mount point)
    try:
        with open(f"{_PROC}/self/mountinfo") as file:
            for line in file:
                fields = line.split()
                kind = fields[fields.index("-") + 1]
                if kind == "cgroup2":
                    mounts.setdefault("", (fields[3], fields[4]))
                elif kind == "cgroup":
                    for option in fields[-1].split(","):
                        if option in HIERARCHIES:
                            mounts.setdefault(option, (fields[3], fields[4]))
        with open(f"{_PROC}/self/cgroup") as file:
            lines = file.read().splitlines()
    except (OSError, ValueError, IndexError):
        return {}
    places = {}
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        for hierarchy in controllers.split(",") if controllers else [""]:
            if hierarchy in mounts:
                root, point = mounts[hierarchy]
                if path == root or path.startswith(root.rstrip("/") + "/"):
                    places[hierarchy] = point + path[len(root.rstrip("/")) :]
    return places


def cgroup_tree(token: str) -> dict[str, str]:
    """Where the cgroups of the process with `token` are (by hierarchy), if it made any:
    ``greenroom-<token>`` under this process's own cgroup in each hierarchy."""
    return {h: f"{place.rstrip('/')}/greenroom-{token}" for h, place in cgroup_places().items()}


def remove_cgroup_tree(tree: dict[str, str]) -> None:
    """SIGKILL everything in the v2 directory of `tree` (``cgroup.kill``), wait up to
    `KILL_WAIT` for it to empty, then remove every directory of `tree`, deepest first.
    Blocking; a tree that is not there is no error."""
    top = tree.get("")
    if top is not None and os.path.isdir(top):
        with contextlib.suppress(OSError), open(f"{top}/cgroup.kill", "w") as kill:
            kill.write("1")
        deadline = time.monotonic() + KILL_WAIT
        while populated(top) and time.monotonic() < deadline:
            time.sleep(0.01)
    for place in tree.values():
        for directory, _subdirectories, _files in os.walk(place, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def populated(cgroup: str) -> bool:
    """Whether a cgroup v2 directory, or one below it, still holds a live process."""
    try:
        with open(f"{cgroup}/cgroup.events") as events:
            return "populated 1" in events.read()
    except OSError:
        return False


def sweep_dead_holder(session_id: str, pid: int, start: int | None, token: str | None) -> None:
    """End what a dead holder of a session left running: every process carrying its
    `token`, if the holder's `pid` no longer runs as the process that started at `start`.

    Nothing is done for an unmarked holder (no token), one whose start is unknown, or one
    that still runs. Blocking, as `sweep_owner` is: call it from a thread.
    """
    if token is None or start is None or alive(pid, start):
        return
    swept = sweep_owner(token)
    if swept:
        logger.warning(
            "session %r: ended %d processes left by its dead holder (pid %d)",
            session_id,
            swept,
            pid,
        )


class MarkedProcess:
    """One process greenroom starts: its mark, then (once `started`) its pid, until `end`.

    ``env`` is the environment to start it with: the one given, with the
    spawn's mark added to ``GREENROOM_OWNER``.
    """

    __slots__ = ("_born", "_owner", "env", "mark", "pid")

    def __init__(self, owner: ProcessOwner, mark: str, env: dict[str, str]) -> None:
        self._owner = owner
        self.mark = mark
        chain = env.get(MARK_VAR)
        self.env = env | {MARK_VAR: f"{chain}:{mark}" if chain else mark}
        self.pid: int | None = None
        self._born = 0.0

    def started(self, pid: int) -> None:
        """The process runs as `pid`."""
        self.pid = pid
        self._born = time.monotonic()
        self._owner.track(pid)

    def end(self) -> Sweep | None:
        """What to sweep for this spawn; call it once its process is reaped. Idempotent.

        None, the common case, when no process but this process's own spawns
        started since (told from the pids handed out since, without reading
        any process); else the `Sweep` that looks through them. Never blocks.
        """
        pid = self.pid
        if pid is None:
            return None
        self.pid = None
        owner = self._owner
        owner.untrack(pid)
        if time.monotonic() - self._born >= FULL_SCAN_AFTER:
            return Sweep(owner, pid, self.mark, full=True)
        last = _last_pid()
        if last is not None and pid <= last <= pid + _PROBE:
            since = [p for p in range(pid + 1, last + 1) if not owner.spawned(p) and _exists(p)]
            if not since or not set(since) - _own_threads():  # Trio's new worker threads
                return None
        return Sweep(owner, pid, self.mark, full=False)


class Sweep:
    """What one spawn's end has to look through: the processes started since it."""

    __slots__ = ("_full", "_mark", "_owner", "_pid")

    def __init__(self, owner: ProcessOwner, pid: int, mark: str, full: bool) -> None:
        self._owner = owner
        self._pid = pid
        self._mark = mark.encode()
        self._full = full

    def kill(self) -> list[int]:
        """SIGKILL whatever carries the spawn's mark; the pidfds of what it killed, for
        `exited` (it closes them). Never waits for a process to exit (but see
        `_kill_all` on the reads)."""
        mine = self._mark
        return _kill_all(self._candidates, lambda marks: mine in marks)

    def _candidates(self) -> Iterable[int]:
        if self._full:
            return _pids()
        pid, last = self._pid, _last_pid()
        if last is None:
            return _pids()
        if pid <= last <= pid + _PROBE:
            return (other for other in range(pid + 1, last + 1) if not self._owner.spawned(other))
        # Above the spawn's pid, and below the last one once the pids wrapped.
        wrapped_to = last if last < pid else 0
        return (other for other in _pids() if other > pid or other <= wrapped_to)


async def exited(pidfds: list[int]) -> None:
    """Wait until each process has exited, then close the pidfds (closed on a cancel too).

    Bound it with a cancel scope (`KILL_WAIT`): a SIGKILLed process exits at
    once unless it is stuck in the kernel.
    """
    # Imported here: the keeper runs this file without site-packages, and never waits so.
    import trio

    try:
        for fd in pidfds:
            await trio.lowlevel.wait_readable(fd)
    finally:
        for fd in pidfds:
            os.close(fd)


class ProcessOwner:
    """This process as the owner of its spawns: its token, its spawns' pids, its keeper.

    One per process (`owner()`); a forked child that goes on running Python
    gets its own on first use.
    """

    __slots__ = ("_count", "_ended", "_lifeline", "_live", "pid", "start", "token")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.start = start_time(self.pid)
        self.token = secrets.token_hex(8)
        self._count = itertools.count(1)
        self._live: set[int] = set()
        # Pids of spawns reaped in the last FULL_SCAN_AFTER seconds, oldest first: no other
        # process can have one yet unless the pids wrapped, which a scan of them checks.
        self._ended: dict[int, float] = {}
        self._lifeline: int | None = None  # the write end of the keeper's pipe, never written to

    def spawn(self, env: dict[str, str]) -> MarkedProcess:
        """A new spawn's mark and environment (`MarkedProcess.started` once it runs)."""
        return MarkedProcess(self, f"{self.token}.{next(self._count)}", env)

    def spawned(self, pid: int) -> bool:
        """Whether `pid` is one of this process's spawns, running or just reaped."""
        return pid in self._live or pid in self._ended

    def track(self, pid: int) -> None:
        self._live.add(pid)
        self._keep()

    def untrack(self, pid: int) -> None:
        self._live.discard(pid)
        now = time.monotonic()
        ended = self._ended
        while ended and (oldest := next(iter(ended.items())))[1] < now - FULL_SCAN_AFTER:
            del ended[oldest[0]]
        ended[pid] = now

    def _keep(self) -> None:
        """Start the keeper, unless it runs (it has not closed its end of the pipe)."""
        if self._lifeline is not None:
            if not _closed_at_the_other_end(self._lifeline):
                return
            logger.warning("the process keeper exited; starting another")
            os.close(self._lifeline)
            self._lifeline = None
        if self.start is None:
            return  # no /proc: nothing for a keeper to find
        read, write = os.pipe()  # both close-on-exec: no spawn inherits the write end
        token = self.token
        try:
            # Through a shell that starts it in the background and exits: the keeper is
            # init's child, never one of ours (no zombie of ours, no child of ours to count).
            shell = os.posix_spawn(
                "/bin/sh",
                # (An explicit redirection: sh gives a background command /dev/null as stdin.)
                ["sh", "-c", _KEEPER_SHELL, sys.executable, __file__, token],
                {},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read, 3),
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,
            )
            os.waitpid(shell, 0)  # it exits as soon as it has forked
        except OSError:
            logger.warning("could not start the process keeper", exc_info=True)
            os.close(write)
        else:
            self._lifeline = write  # open until this process ends, however it ends
        finally:
            os.close(read)


def _closed_at_the_other_end(write_end: int) -> bool:
    poller = select.poll()
    poller.register(write_end, 0)  # POLLERR is always reported: the read end is closed
    return bool(poller.poll(0))


_owner: ProcessOwner | None = None
_owner_lock = threading.Lock()  # the session lock asks from worker threads


def owner() -> ProcessOwner:
    """This process's `ProcessOwner`."""
    global _owner
    with _owner_lock:
        if _owner is None or _owner.pid != os.getpid():
            _owner = ProcessOwner()
        return _owner


def _keep(token: str) -> None:
    """The keeper's life: wait for the owner's end (the pipe's), then end what it left.

    A marked process that leads a process group takes its group with it: a
    member that rewrote its environment is still found.
    """
    while os.read(0, 4096):
        pass
    prefix = token.encode() + b"."
    for pid in _pids():
        marks = _marks(pid)
        if marks and any(m.startswith(prefix) for m in marks):
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
    sweep_owner(token)  # and its cgroups


if __name__ == "__main__":
    _keep(sys.argv[1])
