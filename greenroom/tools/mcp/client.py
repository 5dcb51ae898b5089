"""One connection to one MCP server, over the official `mcp` SDK, on Trio.

The SDK is built on anyio and runs on Trio as it is. Its context managers
(the transport, the `ClientSession`) are entered and left in one task, the
server's supervised child, so no cancel scope is ever left from another
task. Calls come from the agent's task (the turn) and only send a request
and wait for its answer; a cancelled caller makes the SDK send
``notifications/cancelled`` for the call (shielded, before the cancel goes
on).

Two places where the SDK's defaults do not fit, and what is done instead:

* its default HTTP client reads with a 300 s timeout, which would cut a long
  tool call on a streamable-HTTP server; greenroom's has no read timeout
  (a server's ``timeout`` bounds its calls instead);
* nothing in the SDK tells a client that the connection ended (the server
  exited or crashed): the read stream is watched (`_Watched`) and its end
  ends the connection, so the supervisor restarts it.

This module imports the SDK; `greenroom.tools.mcp.servers` imports it only
when a session has servers, so a runtime without them never pays for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, NoReturn

import anyio
import httpx2
import mcp_types as types
import trio
from mcp.client.session import ClientSession, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

import greenroom
from greenroom.actors.types import ToolOutcome
from greenroom.protocol.events import ToolError
from greenroom.protocol.mcp import McpHttpServer, McpServer, McpServerError, McpStdioServer

CLIENT_INFO = types.Implementation(name="greenroom", version=greenroom.__version__)

Streams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]


class McpConnection:
    """One incarnation of one server's connection.

    `run` connects, initializes, lists the tools, hands itself to ``offer``
    (again after every ``notifications/tools/list_changed``), and then serves
    until cancelled; it raises `McpServerError` when the connection ends or
    the server fails to start. `call` may be awaited from any task while the
    connection is offered.
    """

    __slots__ = ("_changed", "_cwd", "_ended", "_session", "_wake", "spec", "tools")

    def __init__(self, spec: McpServer, cwd: str | None) -> None:
        self.spec = spec
        self._cwd = cwd
        self.tools: list[types.Tool] = []
        self._session: ClientSession | None = None
        self._wake = trio.Event()
        self._ended = False
        self._changed = False

    async def run(self, offer: Callable[[McpConnection], None]) -> NoReturn:
        spec = self.spec
        async with _transport(spec, self._cwd) as (read, write):
            watched = _Watched(read, self._on_end)
            async with ClientSession(
                watched, write, message_handler=self._on_message, client_info=CLIENT_INFO
            ) as session:
                with trio.move_on_after(spec.start_timeout) as starting:
                    await session.initialize()
                    self.tools = await _list_tools(session)
                if starting.cancelled_caught:
                    raise McpServerError(
                        spec.name, f"did not start within {spec.start_timeout:g} s"
                    )
                self._session = session
                offer(self)
                while True:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    if self._ended:
                        raise McpServerError(spec.name, "closed its connection (it exited)")
                    if self._changed:
                        self._changed = False
                        self.tools = await _list_tools(session)
                        offer(self)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call `tool`; every failure is an error result naming the server. Cancel: the
        server is told (``notifications/cancelled``) and the cancel goes on."""
        session, name = self._session, self.spec.name
        if session is None or self._ended:
            return _error(f"MCP server {name!r} is not connected", "mcp-unavailable")
        timeout = self.spec.timeout
        try:
            with trio.move_on_after(math.inf if timeout is None else timeout) as limit:
                result = await session.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                return _error(
                    f"MCP server {name!r} closed its connection during {tool}", "mcp-unavailable"
                )
            return _error(f"MCP server {name!r}: {tool} failed: {exc.message}", "mcp-error")
        if limit.cancelled_caught:
            return _error(
                f"MCP server {name!r}: {tool} timed out after {timeout:g} s"
                " (the server was told to cancel it)",
                "timeout",
            )
        return outcome(result)

    async def _on_message(self, message: IncomingMessage) -> None:
        await trio.lowlevel.checkpoint()
        if isinstance(message, types.ToolListChangedNotification):
            self._changed = True
            self._wake.set()

    def _on_end(self) -> None:
        self._ended = True
        self._wake.set()


def outcome(result: types.CallToolResult) -> ToolOutcome:
    """A tool's result as the model and the editor see it: its text, else its structured
    content as JSON; media and resources named by type and address."""
    parts = [_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        return ToolOutcome(
            text or "the tool reported an error",
            is_error=True,
            error=ToolError(name="McpToolError", code="mcp-tool-error"),
        )
    return ToolOutcome(text)


def _text(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {len(block.data)} base64 characters]"
    if isinstance(block, types.ResourceLink):
        return f"[resource: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return f"[resource: {resource.uri}]"
    return f"[{type(block).__name__}]"


def _error(message: str, code: str) -> ToolOutcome:
    return ToolOutcome(message, is_error=True, error=ToolError(name="McpError", code=code))


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools


@asynccontextmanager
async def _transport(spec: McpServer, cwd: str | None) -> AsyncIterator[Streams]:
    if isinstance(spec, McpStdioServer):
        params = StdioServerParameters(
            command=spec.command, args=spec.args, env=spec.env or None, cwd=spec.cwd or cwd
        )
        async with stdio_client(params) as streams:
            yield streams
    else:
        assert isinstance(spec, McpHttpServer)
        # No read timeout: a tool call may stream for as long as it runs.
        timeout = httpx2.Timeout(30.0, read=None)
        async with (
            httpx2.AsyncClient(headers=spec.headers, timeout=timeout) as http,
            streamable_http_client(spec.url, http_client=http) as streams,
        ):
            yield streams


class _Watched:
    """A transport's read stream that tells `on_end` when it ends (EOF or closed)."""

    __slots__ = ("_inner", "_on_end")

    def __init__(
        self, inner: ReadStream[SessionMessage | Exception], on_end: Callable[[], None]
    ) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> object:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self._on_end()
            raise

    async def __aenter__(self) -> _Watched:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc, tb)
