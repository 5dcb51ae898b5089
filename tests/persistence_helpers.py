"""A persistence that delegates to a real one: tests override the one call they bend.

Its logs delegate too (`DelegatingLog`): a test that bends a write sets
``log_type`` to a subclass. `Fsyncs` notes how long one file was at each sync of it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
import trio

from greenroom.protocol.events import SessionEvent, SessionHeader
from greenroom.session.persistence import Persistence, SessionLog


class DelegatingLog:
    def __init__(self, inner: SessionLog) -> None:
        self.inner = inner

    def append(self, event: SessionEvent) -> None:
        self.inner.append(event)

    async def write_ahead(self) -> None:
        await self.inner.write_ahead()

    async def flush(self) -> None:
        await self.inner.flush()

    async def close(self) -> None:
        await self.inner.close()


class Delegating:
    log_type: type[DelegatingLog] = DelegatingLog

    def __init__(self, inner: Persistence) -> None:
        self.inner = inner

    def check_session_id(self, session_id: str) -> None:
        self.inner.check_session_id(session_id)

    async def create(self, header: SessionHeader) -> SessionLog:
        return self.log_type(await self.inner.create(header))

    async def open(self, session_id: str) -> tuple[SessionHeader, list[SessionEvent], SessionLog]:
        header, events, log = await self.inner.open(session_id)
        return header, events, self.log_type(log)

    async def load(self, session_id: str) -> tuple[SessionHeader, list[SessionEvent]]:
        return await self.inner.load(session_id)

    async def list(self) -> list[SessionHeader]:
        return await self.inner.list()

    async def delete(self, session_id: str) -> None:
        await self.inner.delete(session_id)


class GatedOpen(Delegating):
    """`open` (a resume, an ACP load) waits for `gate` before it reads."""

    def __init__(self, inner: Persistence) -> None:
        super().__init__(inner)
        self.gate = trio.Event()

    async def open(self, session_id: str) -> tuple[SessionHeader, list[SessionEvent], SessionLog]:
        await self.gate.wait()
        return await super().open(session_id)


class Fsyncs:
    """Every fsync or fdatasync of one file: how long the file was when it ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
        self.path = path
        self.sizes: list[int] = []
        self._lock = threading.Lock()
        for name in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, name, self._noting(getattr(os, name)))

    def _noting(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            size = os.fstat(fd).st_size
            real(fd)
            if os.readlink(f"/proc/self/fd/{fd}") == self.path:
                with self._lock:
                    self.sizes.append(size)

        return sync

    def covered(self) -> int:
        with self._lock:
            return max(self.sizes, default=0)
