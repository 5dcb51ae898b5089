"""A loopback HTTP/1.1 server that replays model responses, byte for byte: what the adapter
conformance suite (`greenroom.models.conformance`) and the test suite serve a model's wire
format with.

Real sockets on 127.0.0.1, plain or over TLS (given a server context). It answers at
most the responses it was given, in order, then 503 (or, given a function of the request
instead, what it returns for each: a server that counts, refuses or misbehaves by what it
is sent); connections are kept alive as the
real services keep them, and counted: `LoopbackServer.connections` is how many the
clients opened, and every request it saw (path, headers, raw and JSON body, the
connection it came on) is kept. Stream bodies go out with chunked transfer encoding, as
the real services send them, so a cut mid-body is a protocol error on the client's side.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import trio


@dataclass
class Pause:
    """Wait this many seconds before the next piece."""

    seconds: float


class CutOff:
    """Close the connection here, mid-body."""


class Hold:
    """Send nothing more; wait until the client goes away."""


#: A piece of a streamed body: bytes sent as one chunk, or what to do instead.
Piece: TypeAlias = bytes | Pause | CutOff | Hold


@dataclass
class Served:
    """One response; status 0 closes the connection without answering (as a server going away
    does to a keep-alive connection); `close` closes it once the response is whole."""

    status: int = 200
    pieces: Sequence[Piece] = ()
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # a plain (non-streamed) body, for error statuses
    close: bool = False


@dataclass
class Seen:
    """A request the server read: its path, headers (names lowercased), JSON body (None for
    none), raw body, and the connection it came on (from 1)."""

    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""
    connection: int = 0


class _Closed(Exception):
    """The client closed the connection."""


class _Connection:
    """One accepted connection's byte stream, read request by request."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buffer = b""

    async def _more(self) -> None:
        try:
            chunk = await self.stream.receive_some()
        except trio.BrokenResourceError:
            chunk = b""
        if not chunk:
            raise _Closed
        self._buffer += chunk

    async def request(self, connection: int) -> Seen:
        while b"\r\n\r\n" not in self._buffer:
            await self._more()
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self._buffer) < length:
            await self._more()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return Seen(path, headers, json.loads(body) if body else None, body, connection)

    async def wait_closed(self) -> None:
        """Read (and drop) until the client goes away."""
        try:
            while True:
                await self._more()
        except _Closed:
            return


#: What a server given a function answers: the reply to each request, as it saw it.
Responder: TypeAlias = Callable[[Seen], Served]


class LoopbackServer:
    """The server's state: the replies still to give (or the function that answers), what
    it saw, and `client_left` (set once a client closed its connection while the server was
    reading or holding it)."""

    def __init__(
        self, replies: Sequence[Served] | Responder, tls: ssl.SSLContext | None = None
    ) -> None:
        self.answer = replies if callable(replies) else None
        self.replies = [] if callable(replies) else list(replies)
        self.requests: list[Seen] = []
        self.connections = 0
        self.client_left = trio.Event()
        self.url = ""
        self._tls = tls

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        number = self.connections
        wire: trio.abc.Stream = stream
        if self._tls is not None:
            wire = trio.SSLStream(stream, self._tls, server_side=True)
        connection = _Connection(wire)
        try:
            while True:
                seen = await connection.request(number)
                self.requests.append(seen)
                if self.answer is not None:
                    reply = self.answer(seen)
                elif not self.replies:
                    await wire.send_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
                    )
                    return
                else:
                    reply = self.replies.pop(0)
                if not reply.status or not await self._answer(connection, reply) or reply.close:
                    return
        except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError):
            self.client_left.set()
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await wire.aclose()

    async def _answer(self, connection: _Connection, reply: Served) -> bool:
        """Send `reply`; False when the connection ends with it (a cut, a hold)."""
        wire = connection.stream
        reasons = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 429: "Too Many Requests"}
        reason = reasons.get(reply.status, "X")
        head = [f"HTTP/1.1 {reply.status} {reason}"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        if reply.body is not None:
            head.append(f"Content-Length: {len(reply.body)}")
            await wire.send_all("\r\n".join(head).encode() + b"\r\n\r\n" + reply.body)
            return True
        head += ["Content-Type: text/event-stream", "Transfer-Encoding: chunked"]
        await wire.send_all("\r\n".join(head).encode() + b"\r\n\r\n")
        for piece in reply.pieces:
            if isinstance(piece, Pause):
                await trio.sleep(piece.seconds)
            elif isinstance(piece, CutOff):
                await wire.send_all(b"5\r\nda")  # half a chunk, then gone
                return False
            elif isinstance(piece, Hold):
                await connection.wait_closed()
                self.client_left.set()
                return False
            else:
                await wire.send_all(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await wire.send_all(b"0\r\n\r\n")
        return True


@asynccontextmanager
async def serve(
    replies: Sequence[Served] | Responder, tls: ssl.SSLContext | None = None
) -> AsyncIterator[LoopbackServer]:
    """A `LoopbackServer` on a free port of 127.0.0.1 for the block (``url`` is its
    ``http://`` or, with a server context `tls`, ``https://`` origin)."""
    server = LoopbackServer(replies, tls)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        server.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        yield server
        nursery.cancel_scope.cancel()


def sse(*events: str | dict[str, Any] | tuple[str, dict[str, Any]]) -> list[bytes]:
    """SSE pieces: a dict is ``data: <json>``, a (name, dict) pair also has ``event: <name>``,
    a string is ``data: <string>``."""
    pieces = []
    for event in events:
        if isinstance(event, tuple):
            name, payload = event
            pieces.append(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode())
        elif isinstance(event, dict):
            pieces.append(f"data: {json.dumps(event)}\n\n".encode())
        else:
            pieces.append(f"data: {event}\n\n".encode())
    return pieces
