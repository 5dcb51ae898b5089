"""`SessionLock`: one process holds a session live; the OS lets go when that process dies.

The lock is ``flock(LOCK_EX)`` on a file of its own (``<stem>.lock``),
which names the holder (pid and host) for whoever is refused. `flock` locks
belong to the open file, so two runtimes of one process exclude each other
too, and the lock is released by the kernel however its process ends, a
SIGKILL included. The file is removed by its holder, while still locked,
when it lets go; an acquirer that locked a file since removed tries again,
so two holders can never lock two different files of one name.

The file also records what a successor needs to end what a dead holder left
running (`greenroom.procs`): the holder's start time and the token its
spawns are marked with. A file still there when its lock is taken was left
by a holder that never let go; if that holder ran on this host and its pid
no longer runs with its start time, every process carrying its token is
SIGKILLed before `acquire` returns. Whatever the dead holder started is
swept, not only this session's processes: with their owner gone, none has
anyone left to end it. A holder on another host is never swept (its pids
mean nothing here).

A taker writes its name just after it takes the lock, so one refused in
between finds the file empty, or still naming the dead holder whose file it
took over: the refused one reads the file again (and tries the lock again,
the holder may have let go meanwhile) until it names a holder that runs, for
at most `NAMING`.

Blocking file work: call these from a worker thread.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from typing import Final

import msgspec

from greenroom.procs import alive, owner, sweep_dead_holder
from greenroom.session.persistence.base import Holder, SessionLocked

logger = logging.getLogger("greenroom.session")

#: Seconds a refused taker waits for the holder to name itself (it does so microseconds after
#: it takes the lock; a holder stopped in between is named "another process" after these).
NAMING: Final = 1.0


class _Record(msgspec.Struct, frozen=True, gc=False):
    """The lock file's content: a `Holder` (its fields first), then its start time (clock
    ticks since boot) and the token its spawns carry, for a successor's sweep."""

    pid: int
    host: str
    start: int | None = None
    owner: str | None = None


_record_encoder = msgspec.json.Encoder()
_record_decoder = msgspec.json.Decoder(_Record)


class SessionLock:
    """A held lock on one session (see the module docstring)."""

    __slots__ = ("_fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, path: str, session_id: str) -> SessionLock:
        """Hold `session_id` through `path`; raises `SessionLocked` naming the holder."""
        host = socket.gethostname()
        naming = _Naming()
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _running_holder(fd, host)
                os.close(fd)
                if holder is None and naming.wait():
                    continue  # it has not written its name yet
                raise SessionLocked(session_id, holder, str(path)) from None
            except BaseException:
                os.close(fd)
                raise
            if _still_named(fd, path):
                break
            os.close(fd)  # its holder removed it between our open and our lock
        left = _read_record(fd)
        me = owner()
        os.ftruncate(fd, 0)
        os.pwrite(fd, _record_encoder.encode(_Record(me.pid, host, me.start, me.token)), 0)
        if left is not None and left.host == host:
            sweep_dead_holder(session_id, left.pid, left.start, left.owner)
        return cls(fd, path)

    def release(self) -> None:
        """Let the session go (idempotent): remove the file while still holding it, then unlock."""
        if self._fd < 0:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd = -1


def _read_record(fd: int) -> _Record | None:
    try:
        return _record_decoder.decode(os.pread(fd, 4096, 0))
    except (OSError, msgspec.DecodeError):
        return None


def _running_holder(fd: int, host: str) -> Holder | None:
    """The holder the file names, if it runs: None while the file is empty (its holder has
    not written its name yet) or names a holder of this host that is gone (the file is a
    dead holder's, taken over by one that has not written its name yet). A holder of
    another host is taken at its word."""
    record = _read_record(fd)
    if record is None:
        return None
    if record.host == host and record.start is not None and not alive(record.pid, record.start):
        return None
    return Holder(record.pid, record.host)


class _Naming:
    """A refused taker's wait for the holder's name: short pauses, growing, for `NAMING`."""

    __slots__ = ("_deadline", "_pause")

    def __init__(self) -> None:
        self._deadline = time.monotonic() + NAMING
        self._pause = 0.0005

    def wait(self) -> bool:
        """Pause, and say whether to look again (False once `NAMING` has passed)."""
        if time.monotonic() >= self._deadline:
            return False
        time.sleep(self._pause)
        self._pause = min(2 * self._pause, 0.05)
        return True


def _still_named(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
