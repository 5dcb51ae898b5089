"""Cgroups: every spawn in one of its own, every session's under one that may be limited.

Where this process may make cgroup v2 directories (root, or a delegated
subtree: its own cgroup's directory is writable), a runtime's `Containment`
keeps this tree under it::

    greenroom-<token>/       this process's (`greenroom.procs.cgroup_tree`: its keeper
      r<n>/                  kills and removes it should the process die)
        s<n>/                a session's (greenroom's names: a session id may be anything)
          <k>/               a spawn's: the command or server, and all it starts

A spawn's cgroup is entered by the launcher before the spawn starts (its
thread, `greenroom.sandbox.launcher`), so nothing the spawn starts is ever
outside it, and a process cannot leave it without
writing to the cgroup file system, which its sandbox refuses. Its end writes
``cgroup.kill``, which kills whatever is in it whatever it did (``setsid``,
an empty environment, made itself not dumpable), waits for those processes to
exit, and removes the directory.

Limits are per session, in the v1 ``pids`` and ``memory`` hierarchies where
this process may write them (as root): ``pids.max`` and
``memory.limit_in_bytes`` of the same ``greenroom-<token>/r<n>/s<n>`` there,
which each spawn of the session enters too. v2 limits would need the ``pids``
and ``memory`` controllers delegated to this process's cgroup, which is then
not allowed to hold the process itself; they are not used.

Everything here is a few system calls on a pseudo file system that does no
I/O: they run on the Trio thread.

`Places` says where this process may make cgroups (v2, and the v1 ``pids`` and ``memory``
hierarchies); `Containment` is a runtime's tree, `SessionGroup` a session's with its
limits, `SpawnGroup` a spawn's (`kill`, `remove`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import threading
from typing import Final

import trio

from greenroom.procs import (
    KILL_WAIT,
    cgroup_places,
    cgroup_tree,
    owner,
    populated,
    remove_cgroup_tree,
)

#: The limit file of each v1 hierarchy greenroom limits with.
LIMIT_FILES: Final = {"pids": "pids.max", "memory": "memory.limit_in_bytes"}
#: Times a spawn's directory removal is tried while its killed processes leave it.
_RMDIR_TRIES: Final = 40

_runtimes = itertools.count(1)
_process_lock = threading.Lock()  # runtimes in several threads share the process's directory


def _writable(directory: str) -> bool:
    """Whether this process may make cgroups in `directory` and move processes into them."""
    return os.access(directory, os.W_OK) and os.access(f"{directory}/cgroup.procs", os.W_OK)


class Places:
    """Where a runtime's cgroups may go: this process's directory in the v2 hierarchy
    (None: no containment), and in each v1 hierarchy it may limit with; and the v2
    cgroup this process is in (``home``: where the launcher goes back to)."""

    __slots__ = ("home", "limits", "v2")

    def __init__(self, v2: str | None, limits: dict[str, str], home: str | None = None) -> None:
        self.v2 = v2
        self.limits = limits
        self.home = home

    @classmethod
    def probe(cls) -> Places:
        """This process's, under its own cgroups, where it may write them."""
        own = cgroup_places()
        if "" not in own or not _writable(own[""]):
            return cls(None, {})
        tree = cgroup_tree(owner().token)
        limits = {h: tree[h] for h in LIMIT_FILES if h in own and _writable(own[h])}
        return cls(tree[""], limits, own[""])


class SpawnGroup:
    """One spawn's cgroup, and its session's limits (v1 directories): what its process
    enters; `kill` what is in it, then `remove` it."""

    __slots__ = ("directory", "limits")

    def __init__(self, directory: str, limits: list[str]) -> None:
        self.directory = directory
        self.limits = limits

    def kill(self) -> list[int]:
        """SIGKILL whatever is in it (``cgroup.kill``); the pidfds of what was there, for
        `greenroom.procs.exited`, which closes them. Never blocks."""
        if not populated(self.directory):
            return []
        with contextlib.suppress(OSError), open(f"{self.directory}/cgroup.kill", "w") as kill:
            kill.write("1")
        pidfds = []
        with contextlib.suppress(OSError), open(f"{self.directory}/cgroup.procs") as procs:
            for line in procs:
                with contextlib.suppress(OSError):
                    pidfds.append(os.pidfd_open(int(line)))
        return pidfds

    async def remove(self) -> None:
        """Remove it, once what `kill` killed has left it: an exited process leaves at once
        (a zombie is not in it), one stuck in the kernel may not; tried for `KILL_WAIT`."""
        for _ in range(_RMDIR_TRIES):
            try:
                os.rmdir(self.directory)
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
            await trio.sleep(KILL_WAIT / _RMDIR_TRIES)


class SessionGroup:
    """One session's cgroups: its limits, and the parent of its spawns' (`spawn`)."""

    __slots__ = ("_count", "directory", "limits")

    def __init__(self, directory: str, limits: list[str]) -> None:
        self.directory = directory
        self.limits = limits
        self._count = itertools.count(1)

    def spawn(self) -> SpawnGroup:
        """A new spawn's cgroup, made now."""
        directory = f"{self.directory}/{next(self._count)}"
        os.mkdir(directory)
        return SpawnGroup(directory, self.limits)

    def remove(self) -> None:
        """Remove its directories (once its spawns have ended: they hold nothing)."""
        for directory in (self.directory, *self.limits):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


class Containment:
    """A runtime's cgroups (see the module). ``limits``: by hierarchy, the most processes
    and bytes of memory a session's spawns may have at once; those `places` cannot
    hold are not set (`limited` says which are)."""

    __slots__ = ("_count", "_name", "_places", "home", "limited")

    def __init__(self, places: Places, limits: dict[str, int]) -> None:
        if places.v2 is None:
            raise ValueError("no cgroup v2 directory to contain spawns in")
        self._places = places
        self.home = places.home
        self.limited = {h: limit for h, limit in limits.items() if h in places.limits}
        self._name = f"r{next(_runtimes)}"
        self._count = itertools.count(1)

    def session(self) -> SessionGroup:
        """A new session's cgroups, with the limits set."""
        name = f"{self._name}/s{next(self._count)}"
        assert self._places.v2 is not None
        with _process_lock:
            os.makedirs(f"{self._places.v2}/{name}")
            limits = []
            for hierarchy, limit in self.limited.items():
                place = f"{self._places.limits[hierarchy]}/{name}"
                os.makedirs(place)
                with open(f"{place}/{LIMIT_FILES[hierarchy]}", "w") as file:
                    file.write(str(limit))
                limits.append(place)
        return SessionGroup(f"{self._places.v2}/{name}", limits)

    def close(self) -> None:
        """Kill whatever is left in the runtime's cgroups and remove them, and this
        process's directories once no runtime has any there (blocking: up to
        `greenroom.procs.KILL_WAIT`, when something was left)."""
        places = self._places
        assert places.v2 is not None
        tree = {"": f"{places.v2}/{self._name}"}
        tree |= {h: f"{place}/{self._name}" for h, place in places.limits.items()}
        with _process_lock:
            remove_cgroup_tree(tree)
            for place in (places.v2, *places.limits.values()):
                with contextlib.suppress(OSError):
                    os.rmdir(place)
