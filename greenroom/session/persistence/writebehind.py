"""`WriteBehind`: group commit between the live sessions and a `Persistence`."""

from __future__ import annotations

import contextlib
import logging

import trio

from greenroom.protocol.events import SessionEvent
from greenroom.session.persistence.base import Persistence, SessionExists
from greenroom.session.session import Session

logger = logging.getLogger("greenroom.persistence")


class WriteBehind:
    """Buffers each session's appended events; a flush drains them in one durable append.

    Listen with `on_event` on ``session/event`` and `flush` on ``session/flush``
    (the agent flushes at the end of every turn and when disposed), so a turn
    costs one fsync (one transaction), not one per event. A session's first
    drain also creates it in the store. A drain that fails raises to the
    flusher and keeps every event buffered for the next drain. A drain is
    never cut short by a cancel: the cancel lands once the write is done.
    """

    __slots__ = ("_buffers", "_persistence", "_uncreated")

    def __init__(self, persistence: Persistence) -> None:
        self._persistence = persistence
        self._buffers: dict[str, list[SessionEvent]] = {}
        self._uncreated: set[str] = set()  # created here, header not yet stored

    def on_event(self, session: Session, event: SessionEvent) -> None:
        buffer = self._buffers.get(session.id)
        if buffer and buffer[-1].seq != event.seq - 1:
            # Left by an earlier life of this session id whose drains all failed;
            # writing it now would put two events at one seq.
            logger.error(
                "session %r: dropping %d events that never reached the store",
                session.id,
                len(buffer),
            )
            self._uncreated.discard(session.id)
            buffer = None
        if buffer is None:
            buffer = self._buffers[session.id] = []
            if event.seq == 0:
                self._uncreated.add(session.id)
        buffer.append(event)

    def pending(self, session_id: str) -> int:
        """How many events of `session_id` wait for a drain."""
        return len(self._buffers.get(session_id, ()))

    async def flush(self, session: Session) -> None:
        buffer = self._buffers.get(session.id)
        if not buffer:
            return
        batch = list(buffer)
        # A write in a worker thread cannot be interrupted, only abandoned: shield
        # it so that what this buffer believes is always what the disk holds.
        with trio.CancelScope(shield=True):
            if session.id in self._uncreated:
                # A resumed session with an empty log also starts at seq 0: its header
                # is stored already, and the append's seq check guards the rest.
                with contextlib.suppress(SessionExists):
                    await self._persistence.create(session.header)
                self._uncreated.discard(session.id)
            await self._persistence.append(session.id, batch)
        del buffer[: len(batch)]
        if not buffer:
            del self._buffers[session.id]
