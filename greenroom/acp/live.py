"""Live output over ACP: a running call's progress as ``tool_call_update``s, paced by the
client's reading.

A progress notice (`ToolProgress`) replaces the one of its call still
waiting here, and one goes out only when the writer has taken every frame
queued before it (`Outbox.idle`): a client that reads slowly gets fewer,
later snapshots; one that never reads holds one frame in the writer and at
most one per running call here, whatever the command prints. The call's
final update (its result, sent through the outbox as every other update)
drops what still waits of it first, so no snapshot ever follows it.

`TerminalOutput` is the other rendering, for a client that opted into
terminal content (``clientCapabilities._meta.terminal_output``, the
convention of Zed, claude-agent-acp and codex-acp): the call is shown as a
terminal whose id is the call's, and each update carries the output since
the last one sent (``_meta.terminal_output``) and, at the end, the exit
(``_meta.terminal_exit``).
"""

from __future__ import annotations

from typing import Final

import trio

from greenroom.acp.outbox import Outbox
from greenroom.protocol.acp import TextBlock, ToolCallContent, ToolCallProgress
from greenroom.protocol.events import ToolProgress

#: Seconds between two looks at a busy writer.
PACE: Final = 0.05


class LiveOutput:
    """The progress waiting to be sent, one per running call (see the module docstring).
    Its pacing task starts in `nursery` with the first progress shown (a connection that
    runs no command costs none) and ends at `stop`."""

    __slots__ = ("_nursery", "_outbox", "_pacing", "_pending", "_wake", "terminal")

    def __init__(self, outbox: Outbox, nursery: trio.Nursery) -> None:
        self._outbox = outbox
        self._nursery = nursery
        self._pending: dict[tuple[str, str], ToolProgress] = {}
        self._wake = trio.Event()
        self._pacing: trio.CancelScope | None = None  # its task's, once started
        #: Shown as terminals once the client opted in (at ``initialize``), their output
        #: so far by call.
        self.terminal: TerminalOutput | None = None

    def show(self, session_id: str, progress: ToolProgress) -> None:
        """Send `progress` once the writer is idle, unless a later one replaces it first."""
        key = (session_id, progress.call_id)
        self._pending.pop(key, None)  # re-inserted last: the oldest waiting goes first
        self._pending[key] = progress
        if self._pacing is None:
            self._pacing = trio.CancelScope()
            self._nursery.start_soon(self._run, self._pacing)
        self._wake.set()

    def drop(self, session_id: str, call_id: str) -> None:
        """The call's result is about to go: nothing of it waits any more, or is kept."""
        self._pending.pop((session_id, call_id), None)
        if self.terminal is not None:
            self.terminal.end(session_id, call_id)

    def stop(self) -> None:
        """Send nothing more (the connection's teardown): its task, if any, is cancelled,
        and none starts after."""
        if self._pacing is None:
            self._pacing = trio.CancelScope()
        self._pacing.cancel()

    async def _run(self, pacing: trio.CancelScope) -> None:
        """Send what waits, one frame at a time, each when the writer has nothing queued."""
        with pacing:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while self._pending:
                    if not self._outbox.idle:
                        await trio.sleep(PACE)
                        continue
                    key = next(iter(self._pending))
                    progress = self._pending.pop(key)
                    self._outbox.update(key[0], self.update(key[0], progress))
                    await trio.lowlevel.checkpoint()

    def update(self, session_id: str, progress: ToolProgress) -> ToolCallProgress:
        if self.terminal is not None:
            return self.terminal.progress(session_id, progress)
        return ToolCallProgress(
            progress.call_id, "in_progress", [ToolCallContent(TextBlock(progress.output))]
        )


class TerminalOutput:
    """What a terminal-rendering client has been sent of each running call: the bytes so
    far, so each update carries only what is new (``_meta.terminal_output``); by session
    and call (two sessions' model may use the same call ids)."""

    __slots__ = ("_sent",)

    def __init__(self) -> None:
        self._sent: dict[tuple[str, str], int] = {}

    def progress(self, session_id: str, progress: ToolProgress) -> ToolCallProgress:
        key = (session_id, progress.call_id)
        sent = self._sent.get(key, 0)
        self._sent[key] = progress.total
        tail = progress.output.encode()
        new = progress.total - sent
        if new <= len(tail):
            data = tail[len(tail) - new :].decode("utf-8", "replace")
        else:  # more came than one notice holds: the gap is said
            data = f"\r\n[{new - len(tail)} bytes not shown]\r\n" + progress.output
        meta = {"terminal_output": {"terminal_id": progress.call_id, "data": data}}
        return ToolCallProgress(progress.call_id, "in_progress", meta=meta)

    def end(self, session_id: str, call_id: str) -> None:
        self._sent.pop((session_id, call_id), None)
