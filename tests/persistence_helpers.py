"""A persistence that delegates to a real one: tests override the one call they bend."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from greenroom.protocol.events import SessionEvent, SessionHeader
from greenroom.session.persistence import Persistence


class Delegating:
    def __init__(self, inner: Persistence) -> None:
        self.inner = inner

    def check_session_id(self, session_id: str) -> None:
        self.inner.check_session_id(session_id)

    async def create(self, header: SessionHeader) -> None:
        await self.inner.create(header)

    async def append(self, session_id: str, events: Sequence[SessionEvent]) -> None:
        await self.inner.append(session_id, events)

    async def load(self, session_id: str) -> tuple[SessionHeader, list[SessionEvent]]:
        return await self.inner.load(session_id)

    async def list(self) -> list[SessionHeader]:
        return await self.inner.list()


class GatedLoad(Delegating):
    """`load` waits for `gate` before it reads."""

    def __init__(self, inner: Persistence) -> None:
        super().__init__(inner)
        self.gate = trio.Event()

    async def load(self, session_id: str) -> tuple[SessionHeader, list[SessionEvent]]:
        await self.gate.wait()
        return await self.inner.load(session_id)
