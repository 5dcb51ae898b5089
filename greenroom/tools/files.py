"""The ``read_file``, ``write_file`` and ``edit_file`` tools, confined to the session's directories.

A path is the session's ``cwd`` joined with what the model wrote (an
absolute path is placed under the root it names), walked without races by
`greenroom.tools.confine`: it must stay inside the ``cwd`` or one of the
session's additional directories, and name a regular file with one link,
else the call is an error naming the path (and where it resolved, or what
kind of file it is). When the session's front end offers the editor's files
(`SessionClient.files`), the path is confined first, then reads go through
the editor (so unsaved buffers are what the model sees) and writes land
there; otherwise the local disk, where a write replaces the file by a rename.
An edit replaces one exact string, and says so when the string is missing or
found more than once.

A read shows at most `ReadCaps` of the file (2,000 lines or 256 KiB by
default, whichever comes first, from line ``offset``), and says what it left
out and how to read on. File work on the local disk runs in a worker thread
that a cancel abandons: the call answers at once, whatever the file system
does; the thread holds only its own descriptors (and a token of Trio's
thread limiter) until the system call it is stuck in returns.

The names: `FileTools` (the three tools, under `ReadCaps`), `read_window` (the bounded
read), `confined` (a call's path resolved in its roots), `files_plugin`.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
import trio

from greenroom.actors.types import EditorFiles, ToolInvocation, ToolOutcome, ToolView
from greenroom.protocol.events import FileDiff, Location
from greenroom.tools.confine import Old, PathRefused, Roots, open_regular, replace, resolve
from greenroom.tools.plugins import PluginContext
from greenroom.tools.registry import Tool

__all__ = [
    "FileTools",
    "PathRefused",
    "ReadCaps",
    "Window",
    "confined",
    "file_tools",
    "files_plugin",
    "read_window",
]

T = TypeVar("T")

#: The largest line number and line count an editor is asked for (ACP's are uint32).
_UINT32 = 2**32 - 1

#: How much a local read asks of the file system at a time.
_CHUNK = 64 * 1024
_NEWLINE = "\n"


class ReadCaps(msgspec.Struct, frozen=True, kw_only=True):
    """The most one ``read_file`` call shows: ``lines`` lines or ``bytes`` bytes of text;
    the most ``edit_file`` reads of a file whole: ``edit_bytes``.

    A call's own ``limit`` replaces ``lines``; ``bytes`` always holds. A
    larger file is not edited; ``write_file`` replaces it all the same, its
    diff showing that much of the old text. Each must be 1 or more
    (`ValueError` naming the field).
    """

    lines: int = 2000
    bytes: int = 256 * 1024
    edit_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for field in ("lines", "bytes", "edit_bytes"):
            if getattr(self, field) < 1:
                raise ValueError(f"ReadCaps.{field} must be 1 or more, not {getattr(self, field)}")


class ReadArgs(msgspec.Struct, kw_only=True):
    path: str
    offset: Annotated[int, msgspec.Meta(ge=1, description="1-based: the first line to show")] = 1
    limit: Annotated[int, msgspec.Meta(ge=1, description="how many lines to show")] | None = None


class WriteArgs(msgspec.Struct, kw_only=True):
    path: str
    content: str


class EditArgs(msgspec.Struct, kw_only=True):
    path: str
    old_string: str
    new_string: str


def confined(invocation: ToolInvocation, path: str) -> str:
    """`path` resolved (links followed) inside the session's directories.

    It names a regular file with one link, or nothing yet. Raises
    `PathRefused` naming the path and where it resolved (or what it is), and
    `OSError` when the walk itself fails. Blocking file system work.
    """
    return resolve(Roots(*_directories(invocation)), path)


def _directories(invocation: ToolInvocation) -> tuple[str, list[str]]:
    header = invocation.agent.session.header if invocation.agent is not None else None
    if header is None or header.cwd is None:
        raise PathRefused("file tools need a session with a working directory (cwd)")
    return header.cwd, header.additional_directories


async def _in_thread(call: ToolInvocation, work: Callable[[Roots, threading.Event], T]) -> T:
    """``work(the session's roots, abandoned)`` in a worker thread, abandoned by a cancel.

    The roots are made there too: resolving them is file system work, and a
    hung mount must not hang the Trio thread either. ``abandoned`` is set once
    a cancel has let the thread go, so work that goes on (a read of a file that
    never ends) stops at its next step rather than run for the thread's life.
    """
    cwd, others = _directories(call)
    abandoned = threading.Event()
    try:
        return await trio.to_thread.run_sync(
            lambda: work(Roots(cwd, others), abandoned), abandon_on_cancel=True
        )
    except trio.Cancelled:
        abandoned.set()
        raise


def _editor(invocation: ToolInvocation) -> EditorFiles | None:
    return invocation.client.files if invocation.client is not None else None


class Window(msgspec.Struct, frozen=True, gc=False):
    """What a read shows of a file, and whether the file goes on after it."""

    text: bytes
    first: int  # the line it starts at
    lines: int  # how many lines it holds (a cut line counts)
    cut: bool  # its last line is cut by the byte cap
    more: bool

    def render(self, path: str, cap: int) -> str:
        """The text, then a note of what it left out and how to read on, if anything."""
        if not self.text:
            if self.first == 1:
                return "(empty)"
            return f"(nothing from line {self.first}: {path} has fewer lines)"
        text = self.text.decode("utf-8", "replace")
        last = self.first + self.lines - 1
        notes = [f"lines {self.first}-{last} of {path}"]
        if self.cut:
            notes.append(
                f"line {last} is longer than {cap:,} bytes and only its first"
                f" {len(self.text):,} are shown (read_file shows no more of it; bash can)"
            )
        if self.more:
            notes.append(f"more follows: read on with offset={last + 1}")
        if len(notes) == 1 and self.first == 1:
            return text
        return f"{text}{'' if text.endswith(_NEWLINE) else _NEWLINE}[{'; '.join(notes)}]"


def read_window(read: Callable[[int], bytes], offset: int, limit: int, cap: int) -> Window:
    """Lines ``offset .. offset + limit - 1`` of what `read` yields, in at most `cap` bytes.

    Whole lines only, unless the first line alone is longer than `cap`: then
    its head, cut at a character boundary. Memory stays within `cap` plus a
    chunk, however long the file or its lines.
    """
    line, buffer = 1, b""
    while line < offset:
        buffer = read(_CHUNK)
        if not buffer:
            return Window(b"", offset, 0, False, False)
        newlines = buffer.count(b"\n")
        if line + newlines < offset:
            line += newlines
            continue
        buffer = buffer.split(b"\n", offset - line)[-1]
        line = offset
    # Whole chunks are only counted (cheap); only the one holding the last line is split.
    chunks, size, newlines, rest = [], 0, 0, b""
    chunk = buffer or read(_CHUNK)
    while chunk:
        found = chunk.count(b"\n")
        if newlines + found >= limit:
            rest = chunk.split(b"\n", limit - newlines)[-1]
            chunks.append(chunk[: len(chunk) - len(rest)])
            newlines = limit
            break
        chunks.append(chunk)
        newlines += found
        size += len(chunk)
        if size > cap:
            break
        chunk = read(_CHUNK)
    data = b"".join(chunks)
    del chunks
    if len(data) > cap:
        end = data.rfind(b"\n", 0, cap) + 1
        if end:
            return Window(data[:end], offset, newlines - data.count(b"\n", end), False, True)
        end = cap  # one line longer than the cap: its head, whole characters only
        while end > 1 and data[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            end -= 1
        return Window(data[:end], offset, 1, True, True)
    if newlines == limit:
        return Window(data, offset, limit, False, bool(rest) or bool(read(1)))
    return Window(data, offset, newlines + (not data.endswith(b"\n") and bool(data)), False, False)


def _read_local(
    roots: Roots, path: str, offset: int, limit: int, cap: int, abandoned: threading.Event
) -> Window:
    """The window of the file as far as its size when opened: one that grows while it is
    read (a command appending to it) is not chased. A size of 0 is no bound (the files
    of /proc say 0 and hold text), so a read abandoned by a cancel stops at its next
    chunk."""
    fd, info, _ = open_regular(roots, path)
    left = info.st_size or -1

    def read(n: int) -> bytes:
        nonlocal left
        if abandoned.is_set():
            raise OSError(errno.ECANCELED, "the read was abandoned by a cancel")
        if left == 0:
            return b""
        chunk = os.read(fd, n if left < 0 else min(n, left))
        if left > 0:
            left -= len(chunk)
        return chunk

    try:
        return read_window(read, offset, limit, cap)
    finally:
        os.close(fd)


def _read_text(text: str, offset: int, limit: int, cap: int) -> Window:
    data = text.encode("utf-8", "surrogatepass")
    position = 0

    def read(n: int) -> bytes:
        nonlocal position
        chunk = data[position : position + n]
        position += len(chunk)
        return chunk

    return read_window(read, offset, limit, cap)


def _at(path: str, line: int | None = None) -> ToolView:
    return ToolView(title=path, locations=[Location(path, line)])


class _NoUniqueMatch(Exception):
    pass


class _TooLarge(Exception):
    pass


def _edited(old: str | None, old_string: str, new_string: str) -> str:
    if old is None:
        raise FileNotFoundError(2, "No such file or directory")
    found = old.count(old_string)
    if found != 1:
        raise _NoUniqueMatch("not found" if found == 0 else f"found {found} times")
    return old.replace(old_string, new_string, 1)


def _whole(old: Old | None) -> str | None:
    """The old text for an edit: all of the file, or `_TooLarge`."""
    if old is None:
        return None
    if not old.whole:
        raise _TooLarge
    return old.text


def _shown(old: Old | None, most: int) -> str | None:
    """The old text for a write's diff: what was read, and a note if that was not all."""
    if old is None:
        return None
    if old.whole:
        return old.text
    return f"{old.text}\n[the old file held more than {most:,} bytes; only these are shown]"


class FileTools:
    """The three tools over one set of read caps."""

    __slots__ = ("caps",)

    def __init__(self, caps: ReadCaps) -> None:
        self.caps = caps

    async def read_file(self, args: ReadArgs, call: ToolInvocation) -> str | ToolOutcome:
        limit, cap = args.limit or self.caps.lines, self.caps.bytes
        try:
            files = _editor(call)
            if files is None:
                window = await _in_thread(
                    call,
                    lambda roots, abandoned: _read_local(
                        roots, args.path, args.offset, limit, cap, abandoned
                    ),
                )
            else:
                path = await _in_thread(call, lambda roots, _: resolve(roots, args.path))
                # Only the lines that can be shown (each takes a byte at least), and one to
                # tell whether more follow: the whole of a large file would come back in one
                # frame, past what the reader takes. ACP's line and limit are uint32.
                asked = min(args.offset, _UINT32), min(limit, cap, _UINT32 - 1) + 1
                text = await files.read_text(path, *asked)
                window = msgspec.structs.replace(_read_text(text, 1, limit, cap), first=args.offset)
        except PathRefused as exc:
            return ToolOutcome.failed(f"read_file: {exc}", "path-refused", "FileError")
        except OSError as exc:
            return ToolOutcome.failed(
                f"read_file: cannot read {args.path!r}: {exc.strerror}", "os-error", "FileError"
            )
        return window.render(args.path, cap)

    async def write_file(self, args: WriteArgs, call: ToolInvocation) -> str | ToolOutcome:
        try:
            files = _editor(call)
            if files is None:
                most = self.caps.edit_bytes
                read, _, path = await _in_thread(
                    call, lambda roots, _: replace(roots, args.path, _content(args), most)
                )
                old = _shown(read, most)
            else:
                path = await _in_thread(call, lambda roots, _: resolve(roots, args.path))
                try:
                    old = await files.read_text(path, None, None)
                except Exception:  # a new file: nothing to read (the editor says so its own way)
                    old = None
                await files.write_text(path, args.content)
        except PathRefused as exc:
            return ToolOutcome.failed(f"write_file: {exc}", "path-refused", "FileError")
        except OSError as exc:
            return ToolOutcome.failed(
                f"write_file: cannot write {args.path!r}: {exc.strerror}", "os-error", "FileError"
            )
        return ToolOutcome(
            f"wrote {len(args.content)} characters to {args.path}",
            diffs=[FileDiff(path, args.content, old)],
        )

    async def edit_file(self, args: EditArgs, call: ToolInvocation) -> str | ToolOutcome:
        if not args.old_string:
            return ToolOutcome.failed(
                "edit_file: old_string must not be empty", "invalid-arguments", "FileError"
            )

        def edit(old: Old | None) -> str:
            return _edited(_whole(old), args.old_string, args.new_string)

        try:
            files = _editor(call)
            if files is None:
                read, new, path = await _in_thread(
                    call, lambda roots, _: replace(roots, args.path, edit, self.caps.edit_bytes)
                )
                old = read.text if read is not None else None
            else:
                path = await _in_thread(call, lambda roots, _: resolve(roots, args.path))
                old = await files.read_text(path, None, None)
                new = _edited(old, args.old_string, args.new_string)
                await files.write_text(path, new)
        except _TooLarge:
            return ToolOutcome.failed(
                f"edit_file: {args.path} holds more than {self.caps.edit_bytes:,} bytes, the"
                " most edit_file reads of a file; use bash, or write_file to replace it whole",
                "too-large",
                "FileError",
            )
        except _NoUniqueMatch as exc:
            where = f"{exc}; give more context" if "times" in str(exc) else str(exc)
            return ToolOutcome.failed(
                f"edit_file: old_string {where} in {args.path}", "no-unique-match", "FileError"
            )
        except PathRefused as exc:
            return ToolOutcome.failed(f"edit_file: {exc}", "path-refused", "FileError")
        except OSError as exc:
            return ToolOutcome.failed(
                f"edit_file: cannot edit {args.path!r}: {exc.strerror}", "os-error", "FileError"
            )
        return ToolOutcome(f"edited {args.path}", diffs=[FileDiff(path, new, old)])


def _content(args: WriteArgs) -> Callable[[Old | None], str]:
    return lambda old: args.content


def file_tools(caps: ReadCaps | None = None) -> list[Tool[Any]]:
    """read_file, write_file and edit_file, reads capped by `caps` (default `ReadCaps()`)."""
    tools = FileTools(caps or ReadCaps())
    return [
        Tool(
            "read_file",
            "Read a text file of the session's directories: from line `offset` (1-based),"
            f" `limit` lines; at most {tools.caps.lines:,} lines or {tools.caps.bytes:,} bytes"
            " a call, and the result says how to read on.",
            ReadArgs,
            tools.read_file,
            kind="read",
            view=lambda a: _at(a.path, a.offset if a.offset > 1 else None),
        ),
        Tool(
            "write_file",
            "Write a whole text file in the session's directories (it is created or replaced).",
            WriteArgs,
            tools.write_file,
            kind="edit",
            view=lambda a: _at(a.path),
        ),
        Tool(
            "edit_file",
            "Replace the one occurrence of old_string in a file with new_string.",
            EditArgs,
            tools.edit_file,
            kind="edit",
            view=lambda a: _at(a.path),
        ),
    ]


def files_plugin(ctx: PluginContext) -> None:
    """The ``tool-files`` plugin: read_file, write_file and edit_file, with the default caps."""
    for tool in file_tools():
        ctx.register_tool(tool)
