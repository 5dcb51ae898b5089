"""The persistence seam, its typed errors, and crash repair (shared by every backend)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from msgspec.structs import force_setattr

from greenroom.protocol.events import (
    Interrupted,
    SessionEvent,
    SessionHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolError,
    ToolResult,
    TurnEnd,
    TurnStart,
)

INTERRUPTED_RESULT = "interrupted: the process stopped before this tool call finished"


class PersistenceError(Exception):
    """A session could not be read or written; the message names the session and where."""


class SessionNotFound(PersistenceError):
    pass


class SessionExists(PersistenceError):
    pass


class NotASessionLog(PersistenceError):
    pass


class UnsupportedVersion(PersistenceError):
    pass


class CorruptLog(PersistenceError):
    """A line that does not decode, or breaks the seq order, before the log's last ``turn/end``."""


class SeqMismatch(PersistenceError):
    """An append whose first seq is not the stored next seq (a gap, or a double write)."""


class Persistence(Protocol):
    """Where session logs live between processes.

    * `check_session_id` raises `ValueError` naming the limit for an id the
      backend cannot store (checked before anything is created).
    * `create` stores a header (atomically; a second create of an id fails).
    * `append` stores events durably (one fsync or one transaction per call);
      the first event's seq must equal the stored next seq.
    * `load` returns the header and the events, repaired (see `repair`);
      the closers it adds are stored before it returns.
    * `list` returns every stored header.
    """

    def check_session_id(self, session_id: str) -> None: ...

    async def create(self, header: SessionHeader) -> None: ...

    async def append(self, session_id: str, events: Sequence[SessionEvent]) -> None: ...

    async def load(self, session_id: str) -> tuple[SessionHeader, list[SessionEvent]]: ...

    async def list(self) -> list[SessionHeader]: ...


def repair(events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The closers of an open final turn: what a crash mid-turn left unsaid.

    For each tool call of that turn without a result, an error ``tool/result``
    (code ``interrupted``); then ``step/end`` if a step is open; then
    ``turn/end {interrupted}``. Empty when the log ends between turns. The
    closers carry the seqs that follow the log.
    """
    start = None
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if isinstance(event, TurnEnd):
            return []
        if isinstance(event, TurnStart):
            start = index
            break
    if start is None:
        return []
    turn_events = events[start:]
    turn = turn_events[0].turn  # type: ignore[union-attr]
    answered = {e.call_id for e in turn_events if isinstance(e, ToolResult)}
    closers: list[SessionEvent] = [
        ToolResult(
            turn=turn,
            step=call.step,
            call_id=call.call_id,
            content=INTERRUPTED_RESULT,
            is_error=True,
            error=ToolError(name="Interrupted", code="interrupted"),
        )
        for call in turn_events
        if isinstance(call, ToolCall) and call.call_id not in answered
    ]
    open_step = 0
    for event in turn_events:
        if isinstance(event, StepStart):
            open_step = event.step
        elif isinstance(event, StepEnd):
            open_step = 0
    if open_step:
        closers.append(StepEnd(turn=turn, step=open_step))
    closers.append(TurnEnd(turn=turn, reason=Interrupted()))
    now = time.time()
    for offset, closer in enumerate(closers):
        force_setattr(closer, "seq", len(events) + offset)
        force_setattr(closer, "time", now)
    return closers
