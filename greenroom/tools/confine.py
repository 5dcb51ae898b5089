"""Paths confined to a session's directories, resolved and opened without races.

A path is never checked in one step and opened in another. It is walked one
component at a time from a descriptor of the root it lies in: each directory
is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the one before it,
and the last component with ``O_NOFOLLOW``, so a directory swapped for a
symlink between two calls can only make a call fail, never reach outside. A
symlink met on the way is read and its target walked the same way (a
relative one from the link's directory, an absolute one from the root it
names), at most `MAX_LINKS` of them per path, like the kernel. ``..`` goes
up one of the directories the walk holds; above its root, the walk may only
go on in another of the session's roots (a link ``../shared/x`` from the cwd
into a sibling root), found by its place on the path, never by opening
anything outside.

What a tool reads or writes must be a regular file with one link: the type
and the link count are read (``fstat``) off the descriptor that is read, so
they are the facts of the file used. A file with more than one hard link is
treated as outside the roots, for reads and writes alike: its other names
may be anywhere, a link inside the cwd to a file outside being the attack.
A write goes to a new temporary file in the target's directory and is renamed
over the target, so a reader never sees half a file and the old file's inode
is never written through.

Everything here is blocking file system work, meant to run in a worker
thread: it holds only its own descriptors, closed before it returns.

The names: `Roots` (a session's directories), `resolve` (a path walked to where it lies),
`open_regular` (opened for reading), `replace` (the rename write); `PathRefused`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import secrets
import stat
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

T = TypeVar("T")

#: The most symbolic links one path may go through, as Linux's own limit.
MAX_LINKS = 40

#: The longest path taken, in characters: Linux's PATH_MAX (in bytes). Longer, the walk and
#: the message of a refusal (where the path resolves) would cost time quadratic in it.
MAX_PATH = 4096

_ROOT = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# O_PATH (Linux): a place, not an open file; with O_NOFOLLOW a link is that place itself.
_PLACE: int | None = getattr(os, "O_PATH", None)
_REOPEN = os.O_RDONLY | os.O_CLOEXEC
_TEMPORARY = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISLNK, "symbolic link"),
)


class PathRefused(Exception):
    """A path outside the session's directories, or one the call cannot use."""


class Roots:
    """The directories a session's file tools may touch: its cwd first, then the others.

    A path names its root by prefix, as the root was given or as it resolves
    (its own symlinks followed; worked out only when a path needs it). The
    root's own path is trusted: it is opened following its links.
    """

    __slots__ = ("_given", "_real")

    def __init__(self, cwd: str, others: Sequence[str] = ()) -> None:
        self._given = tuple(os.path.abspath(d) for d in (cwd, *others))
        self._real: tuple[str, ...] | None = None

    @property
    def real(self) -> tuple[str, ...]:
        """Each root's real path."""
        if self._real is None:
            self._real = tuple(os.path.realpath(d) for d in self._given)
        return self._real

    def open(self, index: int) -> tuple[int, str]:
        """A descriptor of root `index` (0 is the cwd), and the real path of what was opened."""
        fd = os.open(self._given[index], _ROOT)
        try:
            return fd, os.readlink(f"/proc/self/fd/{fd}")  # Linux: one call, not realpath's walk
        except OSError:
            return fd, self.real[index]

    def locate(self, parts: Sequence[str]) -> tuple[int, list[str]] | None:
        """The root an absolute path (as components) lies under, and the rest of it below.

        The longest matching root wins (an additional directory may lie in
        the cwd); None when the path is under none of them.
        """
        for paths in (self._given, self.real):
            best: tuple[int, int] | None = None
            for index, root in enumerate(paths):
                prefix = _parts(root)
                if parts[: len(prefix)] == prefix and (best is None or len(prefix) > best[1]):
                    best = (index, len(prefix))
            if best is not None:
                return best[0], list(parts[best[1] :])
        return None

    def __str__(self) -> str:
        return ", ".join(self.real)


def resolve(roots: Roots, path: str) -> str:
    """`path` resolved inside `roots` (links followed), naming a regular file or none yet.

    Raises `PathRefused` for a path outside the roots, a directory, a FIFO,
    a device, a socket or a file with more than one hard link; `OSError` for
    a walk the file system refused (a missing directory, a permission).
    The answer is a fact of the moment: use `open_regular` or `replace` to act
    on the file itself.
    """

    def existing(dir_fd: int, name: str, shown: str) -> str:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return shown
        if stat.S_ISLNK(info.st_mode):
            raise _Link
        _check_regular(info, shown)
        return shown

    return _walk(roots, path, existing)


def open_regular(roots: Roots, path: str) -> tuple[int, os.stat_result, str]:
    """A descriptor open for reading on the regular file `path` names, its fstat, its path.

    Blocking reads (``O_NONBLOCK`` is cleared once the type is known). The
    caller closes the descriptor. Raises as `resolve` does.
    """
    return _walk(roots, path, _open_read)


def replace(
    roots: Roots, path: str, new: Callable[[Old | None], str], most: int
) -> tuple[Old | None, str, str]:
    """Replace the file `path` names with ``new(old)`` (old is None for a new file).

    At most `most` bytes of the old file are read, whatever its size says (a
    file may grow while it is read): `Old` holds its text, and whether that
    is all of it. The text keeps the file's bytes that are not UTF-8 as lone
    surrogates (``surrogateescape``), and they are written back as they
    were, so an edit changes only what it replaces. The new text goes to a
    temporary file in the same directory, which is then renamed over the
    file, keeping its owner (where allowed) and its permission bits; the
    directory must exist. Returns the old, the new text and the file's
    resolved path. Whatever `new` raises propagates, and nothing is written.
    Raises as `resolve` does.
    """

    def write(dir_fd: int, name: str, shown: str) -> tuple[Old | None, str, str]:
        try:
            fd, info, _ = _open_read(dir_fd, name, shown)
        except FileNotFoundError:
            old, was = None, None
        else:
            with open(fd, "rb") as file:
                data = file.read(most + 1)  # one byte more: is there more?
            old = Old(data[:most].decode("utf-8", "surrogateescape"), len(data) <= most)
            was = info
        text = new(old)
        _write_over(dir_fd, name, text.encode("utf-8", "surrogateescape"), was)
        return old, text, shown

    return _walk(roots, path, write)


class Old(msgspec.Struct, frozen=True, gc=False):
    """What `replace` read of the file it replaces: its text, and whether that is all of
    the file or only its first ``most`` bytes."""

    text: str
    whole: bool


def _kind(mode: int) -> str:
    """What a file of `mode` is, in words ("FIFO (named pipe)", "socket", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "special file")


class _Link(Exception):
    """The walk's last component is a symbolic link: read it and walk its target."""


def _open_read(dir_fd: int, name: str, shown: str) -> tuple[int, os.stat_result, str]:
    """The regular file `name` opened for reading, and its fstat.

    The name is first opened ``O_PATH``, which opens nothing (no device's
    driver runs, no FIFO's writer is woken, a socket is reachable too), and
    only a regular file with one link is then opened for reading, through
    that descriptor (``/proc/self/fd``), so the file read is the one
    checked. Where that cannot be done, the name itself is opened
    ``O_NONBLOCK`` and checked after.
    """
    if _PLACE is None:
        return _open_checked_after(dir_fd, name, shown)
    place = os.open(name, _PLACE | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        info = os.fstat(place)
        if stat.S_ISLNK(info.st_mode):
            raise _Link
        _check_regular(info, shown)
        try:
            fd = os.open(f"/proc/self/fd/{place}", _REOPEN)
        except FileNotFoundError:  # no /proc
            return _open_checked_after(dir_fd, name, shown)
    finally:
        os.close(place)
    return fd, info, shown


def _open_checked_after(dir_fd: int, name: str, shown: str) -> tuple[int, os.stat_result, str]:
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Link from None
        if exc.errno == errno.ENXIO:  # a socket (or a device with no driver) cannot be opened
            _check_regular(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), shown)
        raise
    try:
        info = os.fstat(fd)
        _check_regular(info, shown)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info, shown


def _check_regular(info: os.stat_result, shown: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise PathRefused(f"{shown!r:.200} is a {_kind(info.st_mode)}, not a regular file")
    if info.st_nlink > 1:
        raise PathRefused(
            f"{shown!r:.200} has {info.st_nlink} hard links; a file with more than one is"
            " treated as outside the session's directories (another of its names may be"
            " anywhere)"
        )


def _write_over(dir_fd: int, name: str, data: bytes, was: os.stat_result | None) -> None:
    """`data` as the file `name` of `dir_fd`, by a rename; owner and mode kept from `was`."""
    temporary = f".greenroom-{secrets.token_hex(8)}.tmp"
    # Made private and given the target's owner and mode before a byte is written: the new
    # text is never open to anyone the old file was closed to, whatever the umask.
    fd = os.open(temporary, _TEMPORARY, 0o666 if was is None else 0o600, dir_fd=dir_fd)
    try:
        try:
            if was is not None:
                if (was.st_uid, was.st_gid) != (os.geteuid(), os.getegid()):
                    # Only root (or a group member) may; else the file becomes the writer's.
                    with contextlib.suppress(PermissionError):
                        os.fchown(fd, was.st_uid, was.st_gid)
                os.fchmod(fd, was.st_mode & 0o777)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        # Already renamed, or the directory is gone: either way nothing of ours is left.
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def _walk(roots: Roots, path: str, last: Callable[[int, str, str], T]) -> T:
    """Walk `path` down to its last component and return ``last(dir_fd, name, shown)``.

    ``shown`` is the resolved path, for messages and results. `last` raises
    `_Link` when the name is a symbolic link; the walk then goes on with the
    link's target.
    """
    if "\x00" in path or not path.strip():
        raise PathRefused(f"path {path!r:.80} is not a usable path")
    if len(path) > MAX_PATH:
        raise PathRefused(
            f"path {path!r:.80}... is {len(path):,} characters long, longer than the"
            f" {MAX_PATH:,} a path may have"
        )
    if path.endswith("/"):
        raise PathRefused(f"path {path!r:.200} names a directory, not a file")
    walk = _Walker(roots, path)
    try:
        parts = _parts(path)
        pending = deque(parts)
        if path.startswith("/"):
            walk.relocate(pending)
        else:
            walk.enter(0)
        while True:
            name = walk.down_to_last(pending)
            try:
                return last(walk.fd, name, walk.shown(name))
            except _Link:
                walk.follow(name, pending)
    finally:
        walk.close()


class _Walker:
    """The state of one walk: the directories it holds, from its root down."""

    __slots__ = ("_fds", "_links", "_names", "_path", "_root", "_roots")

    def __init__(self, roots: Roots, path: str) -> None:
        self._roots = roots
        self._path = path
        self._fds: list[int] = []
        self._names: list[str] = []
        self._root = ""
        self._links = 0

    @property
    def fd(self) -> int:
        return self._fds[-1]

    def shown(self, name: str) -> str:
        return posixpath.join(self._root, *self._names, name)

    def enter(self, index: int) -> None:
        self.close()
        fd, self._root = self._roots.open(index)
        self._fds.append(fd)

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())
        self._names.clear()

    def down_to_last(self, pending: deque[str]) -> str:
        """Go down (and up) `pending` until its last component, which is returned unopened."""
        while pending:
            name = pending.popleft()
            if name == "..":
                self._up(pending)
            elif not pending:
                return name
            else:
                self._down(name, pending)
        raise PathRefused(f"path {self._path!r:.200} names a directory, not a file")

    def _down(self, name: str, pending: deque[str]) -> None:
        try:
            fd = os.open(name, _DIRECTORY, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            self.follow(name, pending)
            return
        self._fds.append(fd)
        self._names.append(name)

    def _up(self, pending: deque[str]) -> None:
        if len(self._fds) > 1:
            os.close(self._fds.pop())
            self._names.pop()
            return
        # Above the root: only its place on the path says where this goes.
        above = _parts(self._root)[:-1]
        while pending and pending[0] == "..":
            pending.popleft()
            above = above[:-1]
        pending.extendleft(reversed(above))
        self.relocate(pending)

    def follow(self, name: str, pending: deque[str]) -> None:
        """Go on with the target of the link `name` in the current directory."""
        self._links += 1
        if self._links > MAX_LINKS:
            raise OSError(errno.ELOOP, f"more than {MAX_LINKS} symbolic links", self._path)
        try:
            target = os.readlink(name, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a link: a file where a directory should be
                raise NotADirectoryError(
                    errno.ENOTDIR, "Not a directory", self.shown(name)
                ) from None
            raise
        pending.extendleft(reversed(_parts(target)))
        if target.startswith("/"):
            self.relocate(pending)

    def relocate(self, pending: deque[str]) -> None:
        """Start again from the root the absolute path `pending` lies under."""
        found = self._roots.locate(list(pending))
        if found is None:
            raise PathRefused(_outside(self._path, self._roots))
        index, rest = found
        self.enter(index)
        pending.clear()
        pending.extend(rest)


def _outside(path: str, roots: Roots) -> str:
    where = os.path.realpath(os.path.join(roots.real[0], path))
    return (
        f"path {path!r:.200} resolves to {where!r:.200}, outside the session's"
        f" directories ({roots})"
    )


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part and part != "."]
