"""ACP over HTTP: one connection's frames posted in, its answers and events sent back.

`PostedConnection` is the transport half of one ACP connection served over
HTTP (`greenroom.acp.network` routes the requests to it; the dispatch is
`connection.serve_frames`, the same as over stdio):

* **In.** Each ``POST /acp`` body is one frame, decoded by the app and handed
  here: a request (`request`) waits for its answer, which is the POST's
  response body; a notification or a reply to a request of ours (`post`) is
  only queued. Frames reach the connection in the order their POSTs were
  handed here.
* **Out.** The writer (`write`) takes every frame the connection sends, in
  order: the answer to a request still waited on goes to its POST; everything
  else (updates, greenroom's requests to the client, an answer whose POST went
  away) is an *event*, numbered from 1, kept for the ``GET /acp`` stream
  (`stream`), which sends each as a server-sent event with its number as
  ``id:``. The writer never waits on a client: a slow reader only makes the
  kept events grow, up to `MAX_KEPT` bytes, past which the oldest are let go.
* **Replay.** A stream opened with ``Last-Event-ID: N`` starts after event N;
  events up to N are let go (the client has them). One that asks for events
  already let go is refused (`Gone`), never given a gap. One stream at a time:
  a new one ends the one before.
* **End.** `close` (a ``DELETE``, the idle bound, the server's stop) ends the
  connection's input, which is its end of input: the connection's teardown.
  A connection with no request waiting and no stream open for `idle` seconds
  is closed (`watch_idle`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
import trio

from greenroom.acp import frames
from greenroom.acp.access import Principal
from greenroom.protocol.acp import INTERNAL_ERROR, ErrorObject, ErrorResponse, RequestId

__all__ = ["MAX_KEPT", "Bucket", "Gone", "InFlightAlready", "PostedConnection"]

#: Bytes of sent events kept for a stream to replay after a reconnect.
MAX_KEPT: Final = 16 * 1024 * 1024

_encoder = msgspec.json.Encoder()


class _Peek(msgspec.Struct, gc=False):
    """What the writer needs of an outgoing frame: is it an answer, and to which id."""

    id: int | str | msgspec.UnsetType | None = msgspec.UNSET
    method: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_peek = msgspec.json.Decoder(_Peek)


class Gone(Exception):
    """A stream asked to replay events that are no longer kept."""


class InFlightAlready(Exception):
    """A request was posted with the id of one still waiting for its answer."""


class _Answer:
    """The answer to one posted request, once the connection sends it."""

    __slots__ = ("body", "done", "events")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.body: bytes | None = None
        self.events = 0  # the number of the last event sent before it


class Bucket:
    """A token bucket: `rate` a second, at most a second's worth kept."""

    __slots__ = ("_at", "_rate", "_tokens")

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._tokens = rate
        self._at = trio.current_time()

    def wait(self) -> float:
        """Take a token: 0 if there was one, else the seconds until there is (none taken)."""
        now = trio.current_time()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self._rate


class PostedConnection:
    """One ACP connection's HTTP transport (see the module docstring). Nothing here
    checkpoints but `request`, `stream`, `watch_idle` and the writer."""

    def __init__(
        self, connection_id: str, idle: float, principal: Principal | None, rate: float
    ) -> None:
        self.id = connection_id
        self.principal = principal  # whose it is: no other principal reaches it
        self.bucket = Bucket(rate)  # its POSTs' rate limit
        self._idle = idle
        self._posted_in, self._posted = trio.open_memory_channel[frames.Frame](math.inf)
        self._waiting: dict[RequestId, _Answer] = {}
        self._events: deque[tuple[int, bytes]] = deque()
        self._kept = 0  # bytes of `_events`
        self._last = 0  # the number of the latest event
        self._let_go = 0  # events up to this one are no longer kept
        self._appended = trio.Event()  # set, and replaced, at each event and at the end
        self._streams = 0  # streams opened: each knows its number, a later one ends it
        self._busy = 0  # requests waiting and streams open
        self._quiet = trio.Event()  # set while nothing is busy
        self._quiet.set()
        self._quiet_since = trio.current_time()
        self.ended = False  # the writer is done: nothing more will be sent

    # -- the connection's side -------------------------------------------------------------

    async def read(self, on_frame: Callable[[frames.Frame], None]) -> None:
        """The connection's reader: every frame posted, until `close`."""
        async for frame in self._posted:
            on_frame(frame)

    async def write(self, queued: trio.MemoryReceiveChannel[bytes]) -> None:
        """The connection's writer: each frame to its POST or to the events (module
        docstring). Once the channel ends, a request still waiting is answered an error."""
        async for frame in queued:
            data = frame.rstrip(b"\n")
            peek = _peek.decode(data)
            if peek.method is msgspec.UNSET and peek.id is not msgspec.UNSET:
                answer = self._waiting.pop(peek.id, None)
                if answer is not None:
                    answer.body, answer.events = data, self._last
                    answer.done.set()
                    continue
            self._event(data)
        self.ended = True
        for request_id, answer in self._waiting.items():
            closed = ErrorObject(INTERNAL_ERROR, "the connection closed before answering")
            answer.body = _encoder.encode(ErrorResponse(request_id, closed))
            answer.done.set()
        self._waiting.clear()
        self._wake()

    # -- the client's side -----------------------------------------------------------------

    def post(self, frame: frames.Frame) -> bool:
        """Queue a frame that is not a request; False if the connection is closed."""
        try:
            self._posted_in.send_nowait(frame)
        except trio.ClosedResourceError:
            return False
        self._quiet_since = trio.current_time()
        return True

    async def request(self, frame: frames.IncomingRequest) -> tuple[bytes, int]:
        """Queue a request and wait for its answer: the body of a JSON-RPC response, and the
        number of the last event sent before it; `trio.ClosedResourceError` if the
        connection is closed. `InFlightAlready` if its id is one still waited on. A
        cancelled caller (its client went away) leaves the answer to the events."""
        if frame.id in self._waiting:
            raise InFlightAlready(frame.id)
        answer = self._waiting[frame.id] = _Answer()
        if not self.post(frame):
            del self._waiting[frame.id]
            raise trio.ClosedResourceError(f"connection {self.id!r} is closed")
        self._enter()
        try:
            await answer.done.wait()
        finally:
            self._leave()
            if not answer.done.is_set():
                del self._waiting[frame.id]  # its answer, when it comes, is an event
        assert answer.body is not None
        return answer.body, answer.events

    def replayable(self, after: int) -> None:
        """Check that a stream can start after event `after`: `Gone`, naming what is kept,
        if events after it were let go (or it is no event yet)."""
        if after < self._let_go or after > self._last:
            raise Gone(
                f"Last-Event-ID {after} is not an event this connection can replay from"
                f" (events {self._let_go + 1} to {self._last} are kept)"
            )

    async def stream(self, after: int, send: Callable[[bytes], Awaitable[None]]) -> None:
        """Send every event after `after` with `send` (server-sent events), then each as it
        comes, until the connection ends or a later stream opens; the first call of `send`
        (empty) comes at once. `after` must be `replayable`; events up to it are let go
        now (the client has them)."""
        self.replayable(after)
        while self._events and self._events[0][0] <= after:
            self._drop_oldest()
        self._streams += 1
        mine = self._streams
        self._wake()  # the stream before ends
        self._enter()
        try:
            await send(b"")  # the stream is open: its headers go now
            position = after
            while mine == self._streams:
                first = self._events[0][0] if self._events else self._last + 1
                if position < first - 1:
                    return  # let go under a slow reader: the client reconnects and hears Gone
                batch = [
                    b"id: %d\ndata: %s\n\n" % (number, data)
                    for number, data in list(self._events)[position - first + 1 :]
                ]
                if batch:
                    position += len(batch)
                    await send(b"".join(batch))
                    continue
                if self.ended:
                    return
                await self._appended.wait()
        finally:
            self._leave()

    def close(self) -> None:
        """End the connection's input: its teardown begins. Idempotent."""
        self._posted_in.close()

    async def watch_idle(self) -> None:
        """Close the connection once nothing was waiting nor streaming for `idle` seconds."""
        while True:
            await self._quiet.wait()
            deadline = self._quiet_since + self._idle
            if trio.current_time() >= deadline:
                self.close()
                return
            await trio.sleep_until(deadline)

    # -- inside ----------------------------------------------------------------------------

    def _event(self, data: bytes) -> None:
        self._last += 1
        self._events.append((self._last, data))
        self._kept += len(data)
        while self._kept > MAX_KEPT and len(self._events) > 1:
            self._drop_oldest()
        self._wake()

    def _drop_oldest(self) -> None:
        number, data = self._events.popleft()
        self._kept -= len(data)
        self._let_go = number

    def _wake(self) -> None:
        self._appended.set()
        self._appended = trio.Event()

    def _enter(self) -> None:
        self._busy += 1
        if self._quiet.is_set():
            self._quiet = trio.Event()

    def _leave(self) -> None:
        self._busy -= 1
        self._quiet_since = trio.current_time()
        if self._busy == 0:
            self._quiet.set()
