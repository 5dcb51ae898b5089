"""The ``read_file``, ``write_file`` and ``edit_file`` tools, confined to the session's directories.

A path is the session's ``cwd`` joined with what the model wrote (an
absolute path is taken as it is), resolved through every symlink; it must
land inside the ``cwd`` or one of the session's additional directories,
else the call is an error naming the path. When the session's front end
offers the editor's files (`SessionClient.files`), reads go through it (so
unsaved buffers are what the model sees) and writes land in the editor;
otherwise the local disk. An edit replaces one exact string, and says so
when the string is missing or found more than once.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import trio

from greenroom.actors.types import EditorFiles, ToolInvocation, ToolOutcome, ToolView
from greenroom.protocol.events import FileDiff, Location, ToolError
from greenroom.tools.plugins import PluginContext
from greenroom.tools.registry import Tool

#: The most a read returns when no limit is asked for, in lines.
READ_LINES = 2000


class ReadArgs(msgspec.Struct, kw_only=True):
    path: str
    line: int | None = None  # 1-based: the first line to read
    limit: int | None = None  # how many lines


class WriteArgs(msgspec.Struct, kw_only=True):
    path: str
    content: str


class EditArgs(msgspec.Struct, kw_only=True):
    path: str
    old_string: str
    new_string: str


class PathRefused(Exception):
    """A path outside the session's directories, or one the call cannot use."""


def confined(invocation: ToolInvocation, path: str) -> str:
    """`path` resolved (symlinks followed), if it lies inside the session's directories."""
    if "\x00" in path or not path.strip():
        raise PathRefused(f"path {path!r:.80} is not a usable path")
    header = invocation.agent.session.header if invocation.agent is not None else None
    if header is None or header.cwd is None:
        raise PathRefused("file tools need a session with a working directory (cwd)")
    roots = [os.path.realpath(d) for d in (header.cwd, *header.additional_directories)]
    resolved = os.path.realpath(os.path.join(header.cwd, path))
    if not any(resolved == root or resolved.startswith(root + os.sep) for root in roots):
        raise PathRefused(
            f"path {path!r:.200} resolves to {resolved!r:.200}, outside the session's"
            f" directories ({', '.join(roots)})"
        )
    return resolved


async def _read(invocation: ToolInvocation, path: str) -> str:
    files = _editor(invocation)
    if files is not None:
        return await files.read_text(path, None, None)
    return await trio.to_thread.run_sync(_read_local, path)


async def _write(invocation: ToolInvocation, path: str, content: str) -> None:
    files = _editor(invocation)
    if files is not None:
        await files.write_text(path, content)
        return
    await trio.to_thread.run_sync(_write_local, path, content)


def _editor(invocation: ToolInvocation) -> EditorFiles | None:
    return invocation.client.files if invocation.client is not None else None


def _read_local(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as file:
        return file.read()


def _write_local(path: str, content: str) -> None:
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise PathRefused(f"directory {parent!r} does not exist")
    with open(path, "w", encoding="utf-8") as file:
        file.write(content)


def _refuse(message: str, code: str) -> ToolOutcome:
    return ToolOutcome(message, is_error=True, error=ToolError(name="FileError", code=code))


def _at(path: str, line: int | None = None) -> ToolView:
    return ToolView(title=path, locations=[Location(path, line)])


async def read_file(args: ReadArgs, call: ToolInvocation) -> str | ToolOutcome:
    if (args.line is not None and args.line < 1) or (args.limit is not None and args.limit < 1):
        return _refuse("read_file: line and limit must be 1 or more", "invalid-arguments")
    try:
        path = confined(call, args.path)
        text = await _read(call, path)
    except PathRefused as exc:
        return _refuse(f"read_file: {exc}", "path-refused")
    except OSError as exc:
        return _refuse(f"read_file: cannot read {args.path!r}: {exc.strerror}", "os-error")
    lines = text.splitlines(keepends=True)
    start = (args.line or 1) - 1
    chosen = lines[start : start + (args.limit or READ_LINES)]
    shown = "".join(chosen)
    if start + len(chosen) < len(lines):
        shown += f"\n[{len(lines) - start - len(chosen)} more lines; read on with line=]"
    return shown or "(empty)"


async def write_file(args: WriteArgs, call: ToolInvocation) -> str | ToolOutcome:
    try:
        path = confined(call, args.path)
        try:
            old: str | None = await _read(call, path)
        except Exception:  # a new file: nothing to read (the editor says so its own way)
            old = None
        await _write(call, path, args.content)
    except PathRefused as exc:
        return _refuse(f"write_file: {exc}", "path-refused")
    except OSError as exc:
        return _refuse(f"write_file: cannot write {args.path!r}: {exc.strerror}", "os-error")
    return ToolOutcome(
        f"wrote {len(args.content)} characters to {args.path}",
        diffs=[FileDiff(path, args.content, old)],
    )


async def edit_file(args: EditArgs, call: ToolInvocation) -> str | ToolOutcome:
    if not args.old_string:
        return _refuse("edit_file: old_string must not be empty", "invalid-arguments")
    try:
        path = confined(call, args.path)
        old = await _read(call, path)
        found = old.count(args.old_string)
        if found != 1:
            where = "not found" if found == 0 else f"found {found} times; give more context"
            return _refuse(f"edit_file: old_string {where} in {args.path}", "no-unique-match")
        new = old.replace(args.old_string, args.new_string, 1)
        await _write(call, path, new)
    except PathRefused as exc:
        return _refuse(f"edit_file: {exc}", "path-refused")
    except OSError as exc:
        return _refuse(f"edit_file: cannot edit {args.path!r}: {exc.strerror}", "os-error")
    return ToolOutcome(f"edited {args.path}", diffs=[FileDiff(path, new, old)])


def file_tools() -> list[Tool[Any]]:
    return [
        Tool(
            "read_file",
            "Read a text file of the session's directories (line: 1-based start; limit: lines).",
            ReadArgs,
            read_file,
            kind="read",
            view=lambda a: _at(a.path, a.line),
        ),
        Tool(
            "write_file",
            "Write a whole text file in the session's directories (it is created or replaced).",
            WriteArgs,
            write_file,
            kind="edit",
            view=lambda a: _at(a.path),
        ),
        Tool(
            "edit_file",
            "Replace the one occurrence of old_string in a file with new_string.",
            EditArgs,
            edit_file,
            kind="edit",
            view=lambda a: _at(a.path),
        ),
    ]


def files_plugin(ctx: PluginContext) -> None:
    """The ``tool-files`` plugin: read_file, write_file and edit_file."""
    for tool in file_tools():
        ctx.register_tool(tool)
