"""Real clients of ``greenroom serve`` for the tests: a WebSocket one (trio-websocket) and an
HTTP one (httpx2, server-sent events read off the stream), both over loopback, and a server
run in the test's own Trio run (`served`)."""

from __future__ import annotations

import itertools
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from greenroom.acp.access import AccessTokens
from greenroom.acp.network import CONNECTION_HEADER, DEFAULT_LIMITS, ServeLimits
from greenroom.acp.serve import serve_acp
from greenroom.acp.stdio import plug_tools
from greenroom.actors.types import Titles
from greenroom.models.base import ModelAdapter
from greenroom.models.scripted import ScriptedModel
from greenroom.runtime import Runtime, open_runtime
from greenroom.session.persistence import JsonlPersistence, Persistence

INITIALIZE = {"protocolVersion": 1, "clientCapabilities": {}}


class Served:
    def __init__(self, url: str, runtime: Runtime, root: Path) -> None:
        self.url = url  # http://host:port/acp
        self.ws_url = "ws" + url.removeprefix("http")
        self.runtime = runtime
        self.root = root


@asynccontextmanager
async def served(
    root: Path,
    model: ModelAdapter | None = None,
    *,
    idle: float = 120.0,
    tokens: AccessTokens | None = None,
    persistence: Persistence | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    tools: bool = False,
    limits: ServeLimits = DEFAULT_LIMITS,
    titles: Titles = "prompt",
) -> AsyncIterator[Served]:
    """A runtime on a JSONL store under `root` (or `persistence`), served on a free loopback
    port; with `tools`, the tools of ``greenroom serve`` plugged (bash asks permission);
    `titles` as ``greenroom serve --titles``."""
    async with (
        open_runtime(
            model=model or ScriptedModel(),
            persistence=persistence or JsonlPersistence(root),
            workdir=str(root),
        ) as runtime,
        trio.open_nursery() as nursery,
    ):
        if tools:
            await plug_tools(runtime)
        urls = await nursery.start(
            lambda task_status: serve_acp(
                runtime,
                "127.0.0.1:0",
                idle=idle,
                tokens=tokens,
                cert=cert,
                key=key,
                limits=limits,
                titles=titles,
                task_status=task_status,
            )
        )
        yield Served(f"{urls[0]}/acp", runtime, root)
        nursery.cancel_scope.cancel()


_clients = itertools.count(1)


class WsClient:
    """An ACP client over one WebSocket: every frame the server sends, kept in order."""

    def __init__(self, socket: WebSocketConnection) -> None:
        self.socket = socket
        self.frames: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._arrived = trio.Event()
        self.closed = False
        self.number = next(_clients)  # in its ids: two clients' never collide

    async def read_loop(self) -> None:
        try:
            while True:
                message = await self.socket.get_message()
                self.frames.append(json.loads(message))
                self._arrived.set()
                self._arrived = trio.Event()
        except Exception:
            self.closed = True
            self._arrived.set()

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.socket.send_message(frame if isinstance(frame, str) else json.dumps(frame))

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and wait for its answer (the whole response frame)."""
        request_id = f"c{self.number}-{next(self._ids)}"
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.answer(request_id)

    async def answer(self, request_id: object) -> dict[str, Any]:
        while True:
            for frame in self.frames:
                if frame.get("id") == request_id and "method" not in frame:
                    return frame
            if self.closed:
                raise AssertionError(f"closed before answering {request_id!r}")
            await self._arrived.wait()

    async def asked(self, method: str, count: int = 1) -> list[dict[str, Any]]:
        """Wait until the server has sent `count` frames of `method`; returns them."""
        while len(found := [f for f in self.frames if f.get("method") == method]) < count:
            if self.closed:
                raise AssertionError(f"closed before {method!r}")
            await self._arrived.wait()
        return found

    def updates(self, session_id: str) -> list[dict[str, Any]]:
        return [
            f["params"]["update"]
            for f in self.frames
            if f.get("method") == "session/update" and f["params"]["sessionId"] == session_id
        ]


@asynccontextmanager
async def ws_client(
    url: str, *, token: str | None = None, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[WsClient]:
    headers = [] if token is None else [("Authorization", f"Bearer {token}")]
    async with (
        open_websocket_url(url, extra_headers=headers, ssl_context=ssl_context) as socket,
        trio.open_nursery() as nursery,
    ):
        client = WsClient(socket)
        nursery.start_soon(client.read_loop)
        yield client
        nursery.cancel_scope.cancel()


class HttpClient:
    """An ACP client over HTTP: POSTs, and the events of its ``GET /acp`` stream."""

    def __init__(self, http: httpx2.AsyncClient, url: str, token: str | None = None) -> None:
        self.http = http
        self.url = url
        self.token = token
        self.connection: str | None = None
        self.events: list[tuple[int, dict[str, Any]]] = []
        self._ids = itertools.count(1)
        self._arrived = trio.Event()
        self.last_response: httpx2.Response | None = None

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.connection is not None:
            headers[CONNECTION_HEADER] = self.connection
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    async def post(self, frame: dict[str, Any] | bytes) -> httpx2.Response:
        body = frame if isinstance(frame, bytes) else json.dumps(frame).encode()
        response = await self.http.post(self.url, content=body, headers=self.headers())
        if self.connection is None and CONNECTION_HEADER in response.headers:
            self.connection = response.headers[CONNECTION_HEADER]
        return response

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = f"h-{next(self._ids)}"
        response = await self.post(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        )
        assert response.status_code == 200, response.text
        self.last_response = response
        answer: dict[str, Any] = response.json()
        assert answer["id"] == request_id
        return answer

    async def listen(
        self,
        after: int | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read the event stream into `events` until it ends (or the caller cancels)."""
        headers = self.headers()
        if after is not None:
            headers["last-event-id"] = str(after)
        async with self.http.stream("GET", self.url, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            task_status.started()
            number: int | None = None
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    number = int(line[4:])
                elif line.startswith("data: "):
                    assert number is not None
                    self.events.append((number, json.loads(line[6:])))
                    self._arrived.set()
                    self._arrived = trio.Event()

    async def wait_for(self, count: int) -> None:
        while len(self.events) < count:
            await self._arrived.wait()

    def updates(self, session_id: str) -> list[dict[str, Any]]:
        return [
            e["params"]["update"]
            for _, e in self.events
            if e.get("method") == "session/update" and e["params"]["sessionId"] == session_id
        ]


def said(updates: list[dict[str, Any]]) -> str:
    """The agent's text in `updates`."""
    return "".join(
        u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk"
    )
