"""Loopback model servers for tests that are not Trio tests (the asyncio SDK client's).

Each server is an `SseServer` run by its own ``trio.run`` in a thread, for
the length of a ``with`` block.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trio

from tests.sse_server import Served, SseServer, sse_server


@contextmanager
def model_server(replies: Sequence[Served]) -> Iterator[SseServer]:
    """An `SseServer` answering `replies` in order, served from a thread of its own."""
    ready = threading.Event()
    started: list[tuple[SseServer, trio.lowlevel.TrioToken, trio.Event]] = []

    async def serve() -> None:
        stop = trio.Event()
        async with sse_server(replies) as server:
            started.append((server, trio.lowlevel.current_trio_token(), stop))
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the model server did not start")
    server, token, stop = started[0]
    try:
        yield server
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(10)
