"""``greenroom acp``: serve one ACP connection on stdin/stdout.

stdout carries protocol frames only. Before anything else runs, the real
stdout is kept for frames and file descriptor 1 (and ``sys.stdout``) is
pointed at stderr, so a stray print, a warning or a log line can never
corrupt the stream. End of input, SIGTERM and SIGHUP all take the same
teardown (prompts answered ``cancelled`` and background tasks killed at once,
then every agent disposed at once, each with its final ``turn/end`` on disk),
then the process exits 0, within the teardown's grace even when the store has
stopped answering (its operations have deadlines).

Frames go out through `FramesOut`: a batch of the writer's is written in the
scheduling pass that took it, not one pass later. They come in through
`FramesIn`: a read that had to wait for input does not yield again before it
returns.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import sys
from collections.abc import Mapping

import trio

from greenroom.acp.connection import serve_frames
from greenroom.acp.frames import read_lines
from greenroom.acp.login import Login
from greenroom.acp.outbox import write_frames
from greenroom.actors.types import Titles
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices
from greenroom.runtime import Runtime, open_runtime
from greenroom.session.persistence import Interruption, Persistence
from greenroom.tools.ask import ask_plugin
from greenroom.tools.bash.tools import bash_plugin
from greenroom.tools.files import files_plugin
from greenroom.tools.subagents import task_plugin
from greenroom.tools.todo import todo_plugin


class FramesOut(trio.abc.SendStream):
    """The frames' pipe, written at once: `send_all` writes before it yields (trio's
    `FdStream` yields to the scheduler first, a pass of its own for every write) and waits
    only while the pipe is full; all of `data` is written when it returns.

    Made for the connection's one writer (`outbox.write_frames`), which parks on its
    channel between batches, so it yields once per batch whatever this does. A closed or
    broken pipe raises `trio.ClosedResourceError` / `trio.BrokenResourceError` as
    `FdStream` does. Not for concurrent senders (one writer has the fd).
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._fd < 0:
            raise trio.ClosedResourceError("the frames' pipe was closed")
        with memoryview(data) as view:
            sent, length = 0, len(view)
            while sent < length:
                try:
                    sent += os.write(self._fd, view[sent:])
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self._fd)
                except OSError as exc:
                    if exc.errno == errno.EBADF:
                        raise trio.ClosedResourceError("the frames' pipe was closed") from None
                    raise trio.BrokenResourceError(str(exc)) from exc

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self._fd)

    async def aclose(self) -> None:
        fd, self._fd = self._fd, -1
        await _close(fd)


class FramesIn(trio.abc.ReceiveStream):
    """The frames' input pipe, read first and waited on only when empty: trio's `FdStream`
    yields to the scheduler before every read, so a reader that then finds the pipe empty
    pays two switches for one wait.

    Every `receive_some` still yields once: its wait for input, or, when input was there
    at once, a yield after the read that no cancel interrupts (what was read is returned,
    never lost; the cancel lands at the next call's wait), so a flood of input cannot
    starve the agents. ``b""`` is the end of input. Not for concurrent readers.
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = 65536 if max_bytes is None else max_bytes
        waited = False
        while True:
            if self._fd < 0:
                raise trio.ClosedResourceError("the frames' input was closed")
            try:
                data = os.read(self._fd, size)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._fd)
                waited = True
                continue
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the frames' input was closed") from None
                raise trio.BrokenResourceError(str(exc)) from exc
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    async def aclose(self) -> None:
        fd, self._fd = self._fd, -1
        await _close(fd)


def run_stdio(
    models: Mapping[str, ModelAdapter],
    persistence: Persistence | None,
    interrupted: Interruption = "close",
    prices: Prices | None = None,
    login: Login | None = None,
    titles: Titles = "prompt",
) -> int:
    """Serve ACP on this process's stdin/stdout with `models` (by id, the first the default)
    and sessions kept by `persistence` (None: in memory only, gone with the process: none is
    listed, a load is refused); `interrupted` says what a load does with a turn a crash cut
    (`serve_frames`); `prices` prices each step (None: the shipped table); `login`: the
    models' keys, as the editor is told of them (`serve_frames`); `titles`: how a session's
    title is written when its log sets none (`serve_frames`)."""
    frames_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    trio.run(_serve, models, persistence, frames_fd, interrupted, prices, login, titles)
    return 0


async def _serve(
    models: Mapping[str, ModelAdapter],
    persistence: Persistence | None,
    frames_fd: int,
    interrupted: Interruption,
    prices: Prices | None,
    login: Login | None,
    titles: Titles,
) -> None:
    # The connection reads and writes these two directly (`serve_frames`), not through a
    # `trio.StapledStream`: one call less per read, per write and per wake of the reader.
    read = functools.partial(read_lines, FramesIn(os.dup(0)))
    write = functools.partial(write_frames, stream=FramesOut(frames_fd))
    async with open_runtime(
        models=models, persistence=persistence, name="acp", prices=prices
    ) as runtime:
        await plug_tools(runtime)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel(reason="signal")
                        return

                nursery.start_soon(stop_on_signal)
                await serve_frames(
                    runtime, read, write, interrupted=interrupted, login=login, titles=titles
                )
                nursery.cancel_scope.cancel(reason="end of input")


async def plug_tools(runtime: Runtime) -> None:
    """Plug the tools an ACP client's agents get: bash, files, task, todo, ask_user."""
    await runtime.plug("tool-bash", bash_plugin)
    await runtime.plug("tool-files", files_plugin)
    await runtime.plug("tool-task", task_plugin)
    await runtime.plug("tool-todo", todo_plugin)
    await runtime.plug("tool-ask", ask_plugin)


async def _close(fd: int) -> None:
    """Close `fd` once (-1: closed already), told to Trio first so that a task waiting on
    it wakes with `ClosedResourceError`; then checkpoint, as every ``aclose`` does."""
    if fd >= 0:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
    await trio.lowlevel.checkpoint()
