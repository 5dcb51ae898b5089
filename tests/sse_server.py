"""A loopback HTTP/1.1 server that replays recorded-style responses, byte for byte.

Real sockets on 127.0.0.1; it answers at most the responses it was given, in
order, then refuses; every request it saw (path, headers, JSON body) is kept.
Stream bodies go out with chunked transfer encoding, as the real services
send them, so a cut mid-body is a protocol error on the client's side.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio


@dataclass
class Pause:
    seconds: float


class Cut:
    """Close the connection here, mid-body."""


class Hold:
    """Send nothing more; wait until the client goes away."""


Piece = bytes | Pause | Cut | Hold


@dataclass
class Reply:
    status: int = 200
    pieces: Sequence[Piece] = ()
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # a plain (non-streamed) body, for error statuses


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class SseServer:
    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[Seen] = []
        self.client_left = trio.Event()
        self.url = ""

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            seen = await _read_request(stream)
            self.requests.append(seen)
            if not self.replies:
                await stream.send_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
                )
                return
            await self._answer(stream, self.replies.pop(0))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.client_left.set()
        finally:
            await stream.aclose()

    async def _answer(self, stream: trio.SocketStream, reply: Reply) -> None:
        reason = {200: "OK", 401: "Unauthorized", 429: "Too Many Requests"}.get(reply.status, "X")
        head = [f"HTTP/1.1 {reply.status} {reason}"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        if reply.body is not None:
            head.append(f"Content-Length: {len(reply.body)}")
            await stream.send_all("\r\n".join(head).encode() + b"\r\n\r\n" + reply.body)
            return
        head += ["Content-Type: text/event-stream", "Transfer-Encoding: chunked"]
        await stream.send_all("\r\n".join(head).encode() + b"\r\n\r\n")
        for piece in reply.pieces:
            if isinstance(piece, Pause):
                await trio.sleep(piece.seconds)
            elif isinstance(piece, Cut):
                await stream.send_all(b"5\r\nda")  # half a chunk, then gone
                return
            elif isinstance(piece, Hold):
                while await stream.receive_some():
                    pass
                self.client_left.set()
                return
            else:
                await stream.send_all(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await stream.send_all(b"0\r\n\r\n")


async def _read_request(stream: trio.SocketStream) -> Seen:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            raise trio.BrokenResourceError
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    path = lines[0].split(" ")[1]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        body += await stream.receive_some()
    return Seen(path, headers, json.loads(body) if body else None)


@asynccontextmanager
async def sse_server(replies: Sequence[Reply]) -> AsyncIterator[SseServer]:
    server = SseServer(replies)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        server.url = f"http://127.0.0.1:{port}"
        yield server
        nursery.cancel_scope.cancel()


def sse(*events: str | dict[str, Any] | tuple[str, dict[str, Any]]) -> list[bytes]:
    """SSE pieces: a dict is ``data: <json>``, a (name, dict) pair also has ``event: <name>``."""
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
