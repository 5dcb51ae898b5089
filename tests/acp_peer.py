"""An in-process ACP peer for the bridge tests: memory streams, virtual time."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from greenroom.acp import serve_connection
from greenroom.actors.types import Titles
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices
from greenroom.runtime import Runtime, open_runtime
from greenroom.session.persistence import JsonlPersistence, Persistence
from greenroom.tools.bash.tools import bash_plugin

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def allow_once(request: dict[str, Any]) -> dict[str, Any]:
    """The default answer to greenroom's requests: every permission granted once."""
    if request["method"] == "session/request_permission":
        return {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
    raise AssertionError(f"the peer was not told how to answer {request['method']}")


class Peer:
    """The client side: writes frames, collects every frame the bridge writes, in order.

    A request from greenroom (``session/request_permission``, ``fs/*``) is answered by
    ``answer`` (replace it to answer otherwise), each in a task of its own.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.frames: list[dict[str, Any]] = []
        self.answer: Answer = allow_once
        self._next_id = 0
        self._arrived = trio.Event()

    async def read_loop(self) -> None:
        async with trio.open_nursery() as answers:
            buffer = b""
            while chunk := await self.stream.receive_some():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    frame = json.loads(line)
                    self.frames.append(frame)
                    if "method" in frame and "id" in frame:
                        answers.start_soon(self._answer, frame)
                self._arrived.set()
                self._arrived = trio.Event()
            answers.cancel_scope.cancel()

    async def _answer(self, request: dict[str, Any]) -> None:
        try:
            reply: dict[str, Any] = {"result": await self.answer(request)}
        except Exception as exc:
            reply = {"error": {"code": -32603, "message": str(exc)}}
        frame = {"jsonrpc": "2.0", "id": request["id"], **reply}
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.send_raw(json.dumps(frame).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        frame = {"jsonrpc": "2.0", "method": method, "params": params}
        await self.send_raw(json.dumps(frame).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any] | None = None) -> str:
        """Send a request; returns its id (await `response` for the answer). The ids
        (``peer-1``, ...) are not ones a test's raw or fuzzed frames use, so an answer
        to one of those is never taken for the answer to one of ours."""
        self._next_id += 1
        request_id = f"peer-{self._next_id}"
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            frame["params"] = params
        await self.send_raw(json.dumps(frame).encode() + b"\n")
        return request_id

    async def wait_for(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while True:
            for frame in self.frames:
                if match(frame):
                    return frame
            await self._arrived.wait()

    async def response(self, request_id: str | int | None) -> dict[str, Any]:
        return await self.wait_for(
            lambda f: f.get("id") == request_id and ("result" in f or "error" in f)
        )

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.response(await self.request(method, params))

    def updates(self, session_id: str) -> list[dict[str, Any]]:
        """The session's updates, but for its slash commands (``available_commands_update``,
        sent after every new and load: tests/acp/test_commands.py follows them)."""
        return [
            f["params"]["update"]
            for f in self.frames
            if f.get("method") == "session/update"
            and f["params"]["sessionId"] == session_id
            and f["params"]["update"]["sessionUpdate"] != "available_commands_update"
        ]

    def index_of(self, frame: dict[str, Any]) -> int:
        return next(i for i, f in enumerate(self.frames) if f is frame)

    async def new_session(self, cwd: str = "/tmp") -> str:
        answer = await self.call("session/new", {"cwd": cwd, "mcpServers": []})
        return str(answer["result"]["sessionId"])

    async def close(self) -> None:
        await self.stream.send_eof()


class Bridge:
    """One runtime, one served connection, one peer."""

    def __init__(self, runtime: Runtime, peer: Peer, persistence: Persistence | None) -> None:
        self.runtime = runtime
        self.peer = peer
        self.persistence = persistence
        self.served = trio.Event()


@asynccontextmanager
async def bridge(
    root: Path | None,
    model: ModelAdapter,
    persistence: Persistence | None = None,
    *,
    bash: bool = False,
    prices: Prices | None = None,
    capabilities: dict[str, Any] | None = None,
    titles: Titles = "prompt",
) -> AsyncIterator[Bridge]:
    """A runtime serving ACP to a `Peer` over memory streams; no persistence if `root` is None;
    its steps priced by `prices` (None: the shipped table); the peer initializes with
    `capabilities` (None: none); `titles` as `serve_connection` takes it."""
    store = persistence or (JsonlPersistence(root) if root is not None else None)
    workdir = str(root) if root is not None else None
    async with open_runtime(
        model=model, persistence=store, workdir=workdir, prices=prices
    ) as runtime:
        if bash:
            await runtime.plug("tool-bash", bash_plugin)
        client, server = trio.testing.memory_stream_pair()
        peer = Peer(client)
        b = Bridge(runtime, peer, store)

        async def serve() -> None:
            try:
                await serve_connection(runtime, server, titles=titles)
            finally:
                b.served.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(peer.read_loop)
            declared = capabilities or {}
            await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": declared})
            yield b
            if not b.served.is_set():
                await peer.close()
            await b.served.wait()
            nursery.cancel_scope.cancel()
