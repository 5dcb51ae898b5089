"""`WriteBehind`: one session life's sink over a `Persistence`, one durable append per flush."""

from __future__ import annotations

import trio

from greenroom.protocol.events import SessionEvent
from greenroom.session.persistence.base import Persistence


class WriteBehind:
    """Buffers one session life's events in memory; `flush` drains them in one durable append.

    The session's header is in the store already (the factory stores it at
    create). The agent flushes at the end of every turn and when disposed,
    so a turn costs one fsync (one transaction), not one per event. A drain
    that fails raises to the flusher and keeps every event buffered for the
    next one. A drain is never cut short by a cancel: the cancel lands once
    the write is done.
    """

    __slots__ = ("_buffer", "_persistence", "_session_id")

    def __init__(self, persistence: Persistence, session_id: str) -> None:
        self._persistence = persistence
        self._session_id = session_id
        self._buffer: list[SessionEvent] = []

    def append(self, event: SessionEvent) -> None:
        self._buffer.append(event)

    async def flush(self) -> None:
        if not self._buffer:
            return
        batch = list(self._buffer)
        # A write in a worker thread cannot be interrupted, only abandoned: shield
        # it so that what this buffer believes is always what the disk holds.
        with trio.CancelScope(shield=True):
            await self._persistence.append(self._session_id, batch)
        del self._buffer[: len(batch)]
