"""ACP over the network: the ASGI app of ``greenroom serve``, at ``/acp``.

`AcpServer` serves two transports, each a connection of its own with the
session semantics of ``greenroom acp`` (`connection.serve_frames`: the same
dispatch, the same one writer, the same teardown when the connection ends):

* **WebSocket** (``GET /acp`` with an upgrade): each text message is one
  JSON-RPC frame, both ways; a binary message is answered an error, so is one
  past the frame limit (`ServeLimits.frame`; up to twice it: past that the socket
  is closed, 1009). The connection ends when the socket closes.
* **HTTP** (``POST /acp``; `posted.PostedConnection`): one frame per body,
  ``Content-Type: application/json``. The ``initialize`` POST opens a
  connection and its answer carries the connection's id in
  ``Acp-Connection-Id``, which every later request names. A request's answer
  is the POST's response body, with ``Acp-Last-Event-Id``: the number of the
  last event sent before it; a notification or a reply answers ``202``.
  What the server sends of itself comes as server-sent events on
  ``GET /acp``, each with its ``id:``; ``Last-Event-ID`` resumes after it.
  ``DELETE /acp`` ends the connection; so does `idle` seconds with no request
  waiting and no stream open.

Who may reach it is `access`'s: with `AccessTokens`, every request carries a
principal's bearer token (else ``401``, with nothing else said), an HTTP
connection is its principal's alone (another's id is unknown to it), and the
sessions each sees are its own (an admin's, all); without tokens, only a
request whose ``Host`` and ``Origin`` are loopback is served (else ``403``).

What a frame holds is decoded and answered as over stdio (`frames`): a bad
frame never ends a connection. What is wrong with an HTTP request as such (a
path, a method, a missing or unknown connection id, a body too large) is
answered with its HTTP status and a line that names it.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

import msgspec
import trio

from greenroom.acp import frames
from greenroom.acp.access import AccessTokens, Principal, local_request
from greenroom.acp.connection import serve_frames
from greenroom.acp.posted import Bucket, Gone, InFlightAlready, PostedConnection
from greenroom.acp.shared import Attachments
from greenroom.actors.types import Titles
from greenroom.errors import alone
from greenroom.protocol.acp import INVALID_REQUEST, ErrorObject, ErrorResponse
from greenroom.runtime import Runtime
from greenroom.session.persistence import Interruption

__all__ = [
    "CONNECTION_HEADER",
    "DEFAULT_LIMITS",
    "EVENTS_HEADER",
    "ServeLimits",
    "IDLE",
    "AcpServer",
]

logger = logging.getLogger("greenroom.acp")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: The header naming an HTTP connection, set by the answer to its ``initialize``.
CONNECTION_HEADER: Final = "Acp-Connection-Id"
#: The header of a request's answer over HTTP: the number of the last event sent before it.
EVENTS_HEADER: Final = "Acp-Last-Event-Id"
#: Seconds an HTTP connection lives with no request waiting and no stream open.
IDLE: Final = 120.0

_JSON: Final = [(b"content-type", b"application/json")]


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """What one client may take of the server; each refusal names its limit.

    * ``connections``: open connections (WebSocket and HTTP) per principal (without
      tokens, all clients are one), past which a new one is refused 429;
    * ``sessions``: sessions a principal holds open at once (`shared.Attachments`), past
      which a new, load or resume of another is refused (-32603, naming the limit);
    * ``rate``: messages per second per connection, a second's worth at once: past it a
      WebSocket's messages wait to be read (the client is slowed, nothing is lost), an
      HTTP POST is refused 429 with ``Retry-After``;
    * ``backlog``: bytes of frames waiting for a WebSocket client that does not read,
      past which its connection ends (its sessions let go, as at a disconnect); the
      writer never holds a turn, so a client that does not read slows no turn;
    * ``frame``: bytes of one frame (a WebSocket message, a POST body), past which it is
      not decoded: a WebSocket message is answered an error as an overlong line over
      stdio is (read up to twice the limit, past which the socket is closed, 1009), a
      POST is answered 413.
    """

    connections: int = 64
    sessions: int = 256
    rate: float = 200.0
    backlog: int = 64 * 1024 * 1024
    frame: int = frames.MAX_FRAME

    @property
    def message(self) -> int:
        """The longest WebSocket message read at all (see ``frame``)."""
        return 2 * self.frame


#: The limits ``greenroom serve`` applies unless told otherwise.
DEFAULT_LIMITS: Final = ServeLimits()


class AcpServer:
    """The ASGI app (see the module docstring). HTTP connections run in `nursery`, which
    must outlive every request; `close` ends them all (the server's stop). With
    `attachments`, connections share sessions (`shared`): a load of a session live here
    attaches to it."""

    def __init__(
        self,
        runtime: Runtime,
        nursery: trio.Nursery,
        *,
        interrupted: Interruption = "close",
        titles: Titles = "prompt",
        idle: float = IDLE,
        tokens: AccessTokens | None = None,
        attachments: Attachments | None = None,
        limits: ServeLimits = DEFAULT_LIMITS,
    ) -> None:
        self._runtime = runtime
        self._limits = limits
        self._open: dict[Principal | None, int] = {}  # connections per principal
        self._tokens = tokens
        self._attachments = attachments
        self._nursery = nursery
        self._interrupted: Interruption = interrupted
        self._titles: Titles = titles
        self._idle = idle
        self._posted: dict[str, PostedConnection] = {}

    def close(self) -> None:
        """End every HTTP connection (each tears down in its own task)."""
        for connection in list(self._posted.values()):
            connection.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
        elif scope["path"] != "/acp":
            if kind == "http":
                await _plain(send, 404, f"nothing at {scope['path']}: ACP is served at /acp")
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        principal = None
        if self._tokens is not None:
            principal = self._tokens.principal(_header(scope, b"authorization"))
            if principal is None:
                await _refuse(kind, send, 401, "", [(b"www-authenticate", b"Bearer")])
                return
        else:
            why = local_request(_header(scope, b"host"), _header(scope, b"origin"))
            if why is not None:
                await _refuse(kind, send, 403, why + " (serve --tokens to be reached from afar)")
                return
        if kind == "websocket":
            if not self._may_open(principal):
                await _refuse(kind, send, 429, self._too_many(principal))
                return
            self._open[principal] = self._open.get(principal, 0) + 1
            try:
                await self._websocket(receive, send, principal)
            finally:
                self._closed(principal)
        elif scope["method"] == "POST":
            await self._post(scope, receive, send, principal)
        elif scope["method"] == "GET":
            await self._events(scope, receive, send, principal)
        elif scope["method"] == "DELETE":
            await self._delete(scope, send, principal)
        else:
            await _plain(
                send,
                405,
                f"{scope['method']} /acp: use POST, GET or DELETE",
                [(b"allow", b"POST, GET, DELETE")],
            )

    # -- WebSocket -------------------------------------------------------------------------

    async def _websocket(self, receive: Receive, send: Send, principal: Principal | None) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        bucket = Bucket(self._limits.rate)
        most = self._limits.frame
        reading = trio.CancelScope()  # cancelled: the client reads no more, the end

        async def read(on_frame: Callable[[frames.Frame], None]) -> None:
            # One that says nothing within `idle` of its opening is ended: it would hold one
            # of its principal's connections for as long as its socket stays open.
            first_by = trio.current_time() + self._idle
            while True:
                if pause := bucket.wait():
                    await trio.sleep(pause)  # over the rate: read later, lose nothing
                    bucket.wait()
                with trio.move_on_at(first_by) as waiting:
                    message = await receive()
                if waiting.cancelled_caught or message["type"] == "websocket.disconnect":
                    return
                first_by = math.inf
                text = message.get("text")
                if text is None:
                    on_frame(frames.Bad(None, INVALID_REQUEST, "send each frame as a text message"))
                    continue
                data = text.encode()
                if len(data) > most:  # answered as stdio answers an overlong line
                    scan = frames.FrameScan()
                    scan.feed(data)
                    on_frame(frames.dropped(scan.end(), most))
                else:
                    on_frame(frames.decode_frame(data))

        backlog = _Backlog(self._limits.backlog, reading)

        async def write(queued: trio.MemoryReceiveChannel[bytes]) -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(backlog.take, queued)
                while (frame := await backlog.next()) is not None:
                    await send({"type": "websocket.send", "text": frame[:-1].decode()})

        with reading:
            await serve_frames(
                self._runtime,
                read,
                write,
                interrupted=self._interrupted,
                titles=self._titles,
                principal=principal,
                attachments=self._attachments,
            )
        if not backlog.over:
            await send({"type": "websocket.close", "code": 1000})

    # -- HTTP ------------------------------------------------------------------------------

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, principal: Principal | None
    ) -> None:
        if _header(scope, b"content-type").split(";")[0].strip().lower() != "application/json":
            await _plain(send, 415, "POST /acp takes one JSON-RPC message as application/json")
            return
        most = self._limits.frame
        with trio.move_on_after(self._idle) as waiting:  # else it holds its socket forever
            body = await _body(receive, most)
        if waiting.cancelled_caught:
            await _plain(send, 408, f"the body did not come whole within {self._idle:g} s")
            return
        if body is None:
            await _plain(send, 413, f"a body over {most:,} bytes, the most read")
            return
        frame = frames.decode_frame(body)
        named = _header(scope, CONNECTION_HEADER.lower().encode())
        if isinstance(frame, frames.Bad):  # answered here: no connection needed
            await _answer(send, _bad(frame), named)
            return
        if not named:
            if not (isinstance(frame, frames.IncomingRequest) and frame.method == "initialize"):
                await _plain(
                    send, 400, f"{CONNECTION_HEADER} is missing: only initialize opens a connection"
                )
                return
            if not self._may_open(principal):
                await _plain(send, 429, self._too_many(principal))
                return
            connection = self._open_posted(principal)
        else:
            found = self._named(scope, principal)
            if found is None:
                await _plain(send, 404, f"no connection {named[:100]!r} here")
                return
            connection = found
        if pause := connection.bucket.wait():
            retry = [(b"retry-after", b"%d" % max(1, round(pause)))]
            limit = f"over {self._limits.rate:g} messages a second on this connection"
            await _plain(send, 429, limit, retry)
            return
        if not isinstance(frame, frames.IncomingRequest):
            if connection.post(frame):
                await send({"type": "http.response.start", "status": 202, "headers": []})
                await send({"type": "http.response.body", "body": b""})
            else:
                await _plain(send, 404, f"no connection {connection.id!r} here")
            return
        try:
            answer = await _until_gone(receive, partial(connection.request, frame))
        except InFlightAlready:
            await _plain(send, 409, f"request {frame.id!r} is already waiting for its answer")
            return
        except trio.ClosedResourceError:
            await _plain(send, 404, f"no connection {connection.id!r} here")
            return
        if answer is not None:  # else the client went away: the answer is an event
            body, events = answer
            await _answer(send, body, connection.id, events)

    def _may_open(self, principal: Principal | None) -> bool:
        return self._open.get(principal, 0) < self._limits.connections

    def _too_many(self, principal: Principal | None) -> str:
        who = "this client" if principal is None else f"principal {principal.name!r}"
        return f"{who} has {self._limits.connections} connections open, the most it may"

    def _closed(self, principal: Principal | None) -> None:
        left = self._open[principal] - 1
        if left:
            self._open[principal] = left
        else:
            del self._open[principal]

    def _open_posted(self, principal: Principal | None) -> PostedConnection:
        connection = PostedConnection(
            secrets.token_urlsafe(24), self._idle, principal, self._limits.rate
        )
        self._open[principal] = self._open.get(principal, 0) + 1
        self._posted[connection.id] = connection
        self._nursery.start_soon(self._serve_posted, connection)
        return connection

    async def _serve_posted(self, connection: PostedConnection) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(connection.watch_idle)
                await serve_frames(
                    self._runtime,
                    connection.read,
                    connection.write,
                    interrupted=self._interrupted,
                    titles=self._titles,
                    principal=connection.principal,
                    attachments=self._attachments,
                )
                nursery.cancel_scope.cancel()
        finally:
            connection.close()
            del self._posted[connection.id]
            self._closed(connection.principal)

    async def _events(
        self, scope: Scope, receive: Receive, send: Send, principal: Principal | None
    ) -> None:
        connection = self._named(scope, principal)
        if connection is None:
            await _plain(send, 404, f"GET /acp needs the {CONNECTION_HEADER} of a connection here")
            return
        last = _header(scope, b"last-event-id") or "0"
        # ASCII digits only: str.isdigit also takes '²', which int() refuses.
        if not (last.isascii() and last.isdigit()) or len(last) > 18:
            await _plain(send, 400, f"Last-Event-ID must be an event's number, got {last[:40]!r}")
            return
        started = False

        async def send_events(data: bytes) -> None:
            nonlocal started
            if not started:
                started = True
                headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})

        try:
            connection.replayable(int(last))
        except Gone as exc:
            await _plain(send, 409, str(exc))
            return
        await _until_gone(receive, partial(connection.stream, int(last), send_events))
        await send({"type": "http.response.body", "body": b""})

    async def _delete(self, scope: Scope, send: Send, principal: Principal | None) -> None:
        connection = self._named(scope, principal)
        if connection is None:
            await _plain(
                send, 404, f"DELETE /acp needs the {CONNECTION_HEADER} of a connection here"
            )
            return
        connection.close()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def _named(self, scope: Scope, principal: Principal | None) -> PostedConnection | None:
        """The connection a request names, if it is its principal's."""
        found = self._posted.get(_header(scope, CONNECTION_HEADER.lower().encode()))
        return found if found is not None and found.principal == principal else None


class _Backlog:
    """The frames waiting for a WebSocket client, taken off the connection's channel as they
    come (`take`) so that their bytes are counted while a send waits on the client; past
    `limit` bytes the connection ends (`reading` cancelled) and what waits is dropped."""

    __slots__ = ("_arrived", "_frames", "_limit", "_reading", "_size", "_taken", "over")

    def __init__(self, limit: int, reading: trio.CancelScope) -> None:
        self._limit = limit
        self._reading = reading
        self._frames: deque[bytes] = deque()
        self._size = 0
        self._arrived = trio.Event()
        self._taken = False  # the channel ended
        self.over = False

    async def take(self, queued: trio.MemoryReceiveChannel[bytes]) -> None:
        async for frame in queued:
            if self.over:
                continue
            self._frames.append(frame)
            self._size += len(frame)
            if self._size > self._limit:
                logger.warning("a WebSocket client left %d bytes unread: disconnected", self._size)
                self.over = True
                self._frames.clear()
                self._reading.cancel()
            self._arrived.set()
        self._taken = True
        self._arrived.set()

    async def next(self) -> bytes | None:
        """The next frame to send; None once there will be none."""
        while not self._frames:
            if self._taken or self.over:
                return None
            self._arrived = trio.Event()
            await self._arrived.wait()
        frame = self._frames.popleft()
        self._size -= len(frame)
        return frame


# -- ASGI plumbing ----------------------------------------------------------------------------

T = TypeVar("T")


async def _until_gone(receive: Receive, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run `work` until it returns, or the client disconnects (then None, `work` cancelled).
    What `work` raises comes out as itself."""
    result: list[T] = []
    try:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            result.append(await work())
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        error = alone(group)
        if error is None:
            raise
        raise error from None
    return result[0] if result else None


async def _body(receive: Receive, most: int) -> bytes | None:
    """The request's body; None past `most` bytes (not read further)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > most:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


def _bad(frame: frames.Bad) -> bytes:
    return msgspec.json.encode(ErrorResponse(frame.id, ErrorObject(frame.code, frame.message)))


async def _answer(send: Send, body: bytes, connection_id: str, events: int | None = None) -> None:
    headers = list(_JSON)
    if connection_id:
        headers.append((CONNECTION_HEADER.lower().encode(), connection_id.encode()))
    if events is not None:
        headers.append((EVENTS_HEADER.lower().encode(), b"%d" % events))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _plain(
    send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    out = [(b"content-type", b"text/plain; charset=utf-8"), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": (text + "\n").encode()})


async def _refuse(
    kind: str, send: Send, status: int, text: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Refuse a request, or a WebSocket before its handshake, with `status`."""
    body = (text + "\n").encode() if text else b""
    out = [*headers, *([(b"content-type", b"text/plain; charset=utf-8")] if text else [])]
    prefix = "websocket.http.response" if kind == "websocket" else "http.response"
    await send({"type": f"{prefix}.start", "status": status, "headers": out})
    await send({"type": f"{prefix}.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
