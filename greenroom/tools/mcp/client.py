"""One connection to one MCP server, over the official `mcp` SDK, on Trio.

The SDK is built on anyio and runs on Trio as it is. Its context managers
(the transport, the `ClientSession`) are entered and left in one task, the
server's supervised child, so no cancel scope is ever left from another
task. Calls come from the agent's task (the turn) and only send a request
and wait for its answer; a cancelled caller makes the SDK send
``notifications/cancelled`` for the call (shielded, before the cancel goes
on).

Where the SDK's defaults do not fit, and what is done instead:

* its default HTTP client reads with a 300 s timeout, which would cut a long
  tool call on a streamable-HTTP server; greenroom's has no read timeout
  (a server's ``timeout`` bounds its calls instead);
* nothing in the SDK tells a client that the connection ended (the server
  exited or crashed): the read stream is watched (`_Watched`) and its end
  ends the connection, so the supervisor restarts it;
* its stdio transport reads a long line in quadratic time (a 40 MB result
  took 10 s of CPU), stops reading for good at a byte that is not UTF-8
  (every call then waits forever on a server still shown ready), and leaves
  running whatever the server started in its process group when the server
  itself exits at the end of its stdin. `_stdio` is greenroom's: lines are
  cut in linear time and bounded (`MAX_MESSAGE`), a line that is not a
  message is skipped, and the group is killed once the server is gone;
* a server that stops reading its stdin blocks a write to it, and the SDK
  sends a cancelled call's ``notifications/cancelled`` shielded, waiting up
  to 5 s on that write: a cancel, and a stop, took that long. `_stdio`
  queues what the session sends (`_Stdin`), so no send waits on the server;
  what it leaves unread is bounded (`MAX_UNREAD`).

A server's answers are bounded too: its tool list (`MAX_TOOL_PAGES` pages,
and a list after ``tools/list_changed`` within ``start_timeout``, like the
first), and its prompts' (listed when it offers prompts, again after
``prompts/list_changed``, as many pages at most); a result's text is
bounded where every tool's is, by the registry (``max_tool_result``: cut,
the whole kept in a spill file the result names).

This module imports the SDK; `greenroom.tools.mcp.servers` imports it only
when a session has servers, so a runtime without them never pays for it.

A stdio server is started by the runtime's `Sandboxes`, in its spec's ``sandbox``, else
the sandbox of its session's mode when it starts (`greenroom.tools.mcp.servers`).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from types import TracebackType
from typing import Any, Final, NoReturn, TypeVar

import anyio
import httpx2
import mcp_types as types
import trio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client.session import ClientSession, IncomingMessage
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from greenroom.actors.types import ToolOutcome
from greenroom.lines import LineBuffer, LineTooLong
from greenroom.protocol.mcp import McpHttpServer, McpServer, McpServerError, McpStdioServer
from greenroom.sandbox import Child, Sandbox, Sandboxes

logger = logging.getLogger("greenroom.mcp")
T = TypeVar("T")
P = TypeVar("P", bound=types.PaginatedResult)

# From the installed metadata: importing the package itself would sit this floor above the runtime.
CLIENT_INFO = types.Implementation(
    name="greenroom", version=importlib.metadata.version("greenroom")
)

#: The longest line a stdio server may write, in bytes; a longer one ends its connection.
MAX_MESSAGE: Final = 32 * 1024 * 1024
#: The most bytes a stdio server may leave unread on its stdin; past it, it has stopped reading:
#: its connection ends (and it is restarted).
MAX_UNREAD: Final = 32 * 1024 * 1024
#: The most pages a server's tool list may have.
MAX_TOOL_PAGES: Final = 100
#: A stopping stdio server's time to exit once its stdin is closed, then once SIGTERMed
#: (the SDK's; with the flush, the reap and the sweep, a stop takes at most 5 s, MCP_GRACE).
STDIN_GRACE: Final = 2.0
TERM_GRACE: Final = 2.0
_FLUSH: Final = 0.25  # for the last messages the session sent (a cancel) to reach the server
_REAP: Final = 0.5  # for a SIGKILLed server to be reaped
_SWEEP: Final = 0.25  # for what it detached to exit once SIGKILLed
_CHUNK: Final = 65536

Streams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]


class McpConnection:
    """One incarnation of one server's connection.

    `run` connects, initializes, lists the tools (and the prompts, if it has
    any), hands itself to ``offer`` (again after every
    ``notifications/tools/list_changed`` or ``prompts/list_changed``), and then
    serves until cancelled; it raises `McpServerError` when the connection ends or
    the server fails to start. `call` may be awaited from any task while the
    connection is offered; a call that finds the connection lost ends it too.
    """

    __slots__ = (
        "_changed",
        "_cwd",
        "_ended",
        "_prompts_changed",
        "_sandbox",
        "_sandboxes",
        "_session",
        "_wake",
        "prompts",
        "spec",
        "tools",
    )

    def __init__(
        self, spec: McpServer, cwd: str | None, sandboxes: Sandboxes, sandbox: Sandbox
    ) -> None:
        self.spec = spec
        self._cwd = cwd
        self._sandboxes = sandboxes
        self._sandbox = sandbox
        self.tools: list[types.Tool] = []
        self.prompts: list[types.Prompt] = []
        self._prompts_changed = False
        self._session: ClientSession | None = None
        self._wake = trio.Event()
        self._ended: str | None = None  # why the connection ended, once it has
        self._changed = False

    async def run(self, offer: Callable[[McpConnection], None]) -> NoReturn:
        try:
            await self._serve(offer)
        except Exception as exc:
            if self._ended is None or _says_why(exc):
                raise
            # Why it ended is known; what its teardown raised after that is noise (the
            # SDK's HTTP transport loses the body's error when a late reply finds the
            # session gone).
            raise McpServerError(self.spec.name, self._ended) from exc

    async def _serve(self, offer: Callable[[McpConnection], None]) -> NoReturn:
        spec = self.spec
        transport = _transport(spec, self._cwd, self._end, self._sandboxes, self._sandbox)
        async with transport as (read, write):
            watched = _Watched(read, self._on_end)
            async with ClientSession(
                watched, write, message_handler=self._on_message, client_info=CLIENT_INFO
            ) as session:
                with trio.move_on_after(spec.start_timeout) as starting:
                    await session.initialize()
                    self.tools = await _list_tools(spec.name, session)
                    self.prompts = await _list_prompts(spec.name, session)
                if starting.cancelled_caught:
                    raise McpServerError(
                        spec.name, f"did not start within {spec.start_timeout:g} s"
                    )
                self._session = session
                offer(self)
                while True:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    if self._ended is not None:
                        raise McpServerError(spec.name, self._ended)
                    if self._prompts_changed:
                        self._prompts_changed = False
                        self.prompts = await _relisted(spec, "prompts", _list_prompts, session)
                        if not self._changed:
                            offer(self)
                    if self._changed:
                        self._changed = False
                        self.tools = await _relisted(spec, "tools", _list_tools, session)
                        offer(self)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call `tool`; every failure is an error result naming the server. Cancel: the
        server is told (``notifications/cancelled``) and the cancel goes on."""
        session, name = self._session, self.spec.name
        if session is None or self._ended is not None:
            return ToolOutcome.failed(
                f"MCP server {name!r} is not connected", "mcp-unavailable", "McpError"
            )
        timeout = self.spec.timeout
        try:
            with trio.move_on_after(math.inf if timeout is None else timeout) as limit:
                result = await session.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                # Over HTTP nothing else says that the server went away (a call's stream
                # ended): every later call would fail the same way, with the server
                # shown ready. End the connection, so that it is started again.
                self._end(f"lost its connection during {tool}: {exc.message}")
                return ToolOutcome.failed(
                    f"MCP server {name!r} closed its connection during {tool}",
                    "mcp-unavailable",
                    "McpError",
                )
            return ToolOutcome.failed(
                f"MCP server {name!r}: {tool} failed: {exc.message}", "mcp-error", "McpError"
            )
        except (ValueError, RuntimeError) as exc:  # the SDK's checks of the result's shape
            return ToolOutcome.failed(
                f"MCP server {name!r}: {tool} answered a bad result: {exc}", "mcp-error", "McpError"
            )
        if limit.cancelled_caught:
            return ToolOutcome.failed(
                f"MCP server {name!r}: {tool} timed out after {timeout:g} s"
                " (the server was told to cancel it)",
                "timeout",
                "McpError",
            )
        return outcome(result)

    async def prompt(self, name: str, arguments: dict[str, str]) -> list[str]:
        """The texts of prompt `name`'s messages, with `arguments`; raises `McpServerError`
        naming the server when it cannot give them."""
        session, server = self._session, self.spec.name
        if session is None or self._ended is not None:
            raise McpServerError(server, "is not connected")
        try:
            with trio.move_on_after(self.spec.start_timeout) as limit:
                result = await session.get_prompt(name, arguments)
        except MCPError as exc:
            raise McpServerError(server, f"prompt {name!r}: {exc.message}") from None
        except (ValueError, RuntimeError) as exc:
            raise McpServerError(server, f"prompt {name!r} answered a bad result: {exc}") from None
        if limit.cancelled_caught:
            raise McpServerError(
                server, f"prompt {name!r}: no answer within {self.spec.start_timeout:g} s"
            )
        if not isinstance(result, types.GetPromptResult):
            raise McpServerError(server, f"prompt {name!r} asked for input greenroom cannot give")
        return [_text(message.content) for message in result.messages]

    async def _on_message(self, message: IncomingMessage) -> None:
        await trio.lowlevel.checkpoint()
        if isinstance(message, types.ToolListChangedNotification):
            self._changed = True
            self._wake.set()
        elif isinstance(message, types.PromptListChangedNotification):
            self._prompts_changed = True
            self._wake.set()

    def _on_end(self) -> None:
        self._end("closed its connection (it exited)")

    def _end(self, why: str) -> None:
        if self._ended is None:
            self._ended = why
        self._wake.set()


def _says_why(error: Exception) -> bool:
    """An `McpServerError`, alone or in the groups of nurseries it went through."""
    if isinstance(error, ExceptionGroup):
        return any(_says_why(inner) for inner in error.exceptions)
    return isinstance(error, McpServerError)


def outcome(result: types.CallToolResult) -> ToolOutcome:
    """A tool's result as the model and the editor see it: its text, else its structured
    content as JSON; media and resources named by type and address. Whole: the
    registry cuts it (`ToolRegistry.execute`), keeping all of it in a spill file."""
    parts = [_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        return ToolOutcome.failed(
            text or "the tool reported an error", "mcp-tool-error", "McpToolError"
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


async def _relisted(
    spec: McpServer,
    what: str,
    list_: Callable[[str, ClientSession], Awaitable[T]],
    session: ClientSession,
) -> T:
    """The server's `what` listed again after it said they changed, within its
    ``start_timeout`` like the first list; past it, `McpServerError`. A server that says
    its tools changed and then does not list them would keep tools offered that it may no
    longer have."""
    with trio.move_on_after(spec.start_timeout) as listing:
        listed = await list_(spec.name, session)
    if listing.cancelled_caught:
        raise McpServerError(
            spec.name, f"did not list its changed {what} within {spec.start_timeout:g} s"
        )
    return listed


async def _list_tools(server: str, session: ClientSession) -> list[types.Tool]:
    """Every page of the server's tools; raises `McpServerError` past `MAX_TOOL_PAGES`."""
    return await _every_page(
        server, "tools", lambda params: session.list_tools(params=params), lambda p: p.tools
    )


async def _list_prompts(server: str, session: ClientSession) -> list[types.Prompt]:
    """Every page of the server's prompts (none if it offers none); raises `McpServerError`
    past `MAX_TOOL_PAGES`."""
    capabilities = session.server_capabilities
    if capabilities is None or capabilities.prompts is None:
        return []
    return await _every_page(
        server, "prompts", lambda params: session.list_prompts(params=params), lambda p: p.prompts
    )


async def _every_page(
    server: str,
    what: str,
    page: Callable[[types.PaginatedRequestParams | None], Awaitable[P]],
    items: Callable[[P], list[T]],
) -> list[T]:
    """The `items` of every page of a list, each asked for with the cursor the one before
    gave; `McpServerError` naming `what` past `MAX_TOOL_PAGES` pages."""
    listed: list[T] = []
    cursor: str | None = None
    for _page in range(MAX_TOOL_PAGES):
        params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
        answer = await page(params)
        listed.extend(items(answer))
        cursor = answer.next_cursor
        if cursor is None:
            return listed
    raise McpServerError(server, f"listed more than {MAX_TOOL_PAGES} pages of {what}")


@asynccontextmanager
async def _transport(
    spec: McpServer,
    cwd: str | None,
    lost: Callable[[str], None],
    sandboxes: Sandboxes,
    sandbox: Sandbox,
) -> AsyncIterator[Streams]:
    """The server's streams; ``lost(why)`` is told when an HTTP server forgot the session, or
    a stdio server stopped reading. A stdio server runs in `sandbox`."""
    if isinstance(spec, McpStdioServer):
        async with _stdio(spec, cwd, lost, sandboxes, sandbox) as streams:
            yield streams
    else:
        assert isinstance(spec, McpHttpServer)

        async def forgotten(response: httpx2.Response) -> None:
            # MCP: a 404 to a request naming the session means the server ended it (it
            # restarted, say); the client must initialize a new one. The SDK only passes
            # on the error in the body, so every later call failed on the dead session.
            if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
                lost("forgot its session (HTTP 404): it was restarted, or ended it")

        # No read timeout: a tool call may stream for as long as it runs.
        timeout = httpx2.Timeout(30.0, read=None)
        hooks = {"response": [forgotten]}
        async with (
            httpx2.AsyncClient(headers=spec.headers, timeout=timeout, event_hooks=hooks) as http,
            streamable_http_client(spec.url, http_client=http) as streams,
        ):
            yield streams


@asynccontextmanager
async def _stdio(
    spec: McpStdioServer,
    cwd: str | None,
    lost: Callable[[str], None],
    sandboxes: Sandboxes,
    sandbox: Sandbox,
) -> AsyncIterator[Streams]:
    """The server as a child in a process group of its own, in `sandbox`, speaking lines of
    JSON-RPC.

    What the session sends is queued (`_Stdin`, which tells ``lost`` when the
    server has stopped reading), so neither a send nor a stop waits on a
    server that does not read. Its stderr is the runtime's. Leaving stops it, shielded and bounded
    (`_stop`): stdin closed, `STDIN_GRACE`; SIGTERM to its group,
    `TERM_GRACE`; then SIGKILL to the group whether or not the server is
    still there, so nothing it started in its group outlives it, and to its
    cgroup and whatever carries its mark (`greenroom.sandbox.Child.end`), so
    nothing it detached does either.
    """
    process = await sandboxes.spawn(
        [spec.command, *spec.args],
        cwd=spec.cwd or cwd or os.getcwd(),
        env=get_default_environment() | spec.env,
        sandbox=sandbox,
        stdin="pipe",
        stderr="inherit",
    )
    # No checkpoint before the try: a cancel here would leave the process running.
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None
    received, messages = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    requests = _Stdin(lost)
    written = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_lines, spec.name, stdout, received)
            nursery.start_soon(_write_lines, requests, stdin, received, written)
            try:
                yield messages, requests
            finally:
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(_FLUSH):
                        await written.wait()
                    await _stop(process)
                # A process that left the group may hold stdout open: stop reading.
                nursery.cancel_scope.cancel()
    finally:
        for stream in (received, messages, requests):
            stream.close()
        with trio.CancelScope(shield=True):
            for pipe in (stdin, stdout):
                with suppress(trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                    await pipe.aclose()


async def _read_lines(
    server: str,
    stdout: trio.abc.ReceiveStream,
    messages: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    """The server's lines as messages until its stdout ends, which ends the connection.

    A line that is not a JSON-RPC message is passed on as its error (the
    session skips it); a line over `MAX_MESSAGE` bytes raises `McpServerError`.
    Once the session stops taking messages, the rest is read and dropped, so a
    server blocked on a full pipe can still see its stdin end and exit.
    """
    buffer = LineBuffer(MAX_MESSAGE)
    lines = _Lines(server, messages)
    async with messages:
        while chunk := await stdout.receive_some(_CHUNK):
            buffer.feed(chunk)
            try:
                while (line := buffer.next_line()) is not None:
                    await lines.deliver(line)
            except LineTooLong:
                raise McpServerError(
                    server, f"wrote a line longer than {MAX_MESSAGE} bytes"
                ) from None
        await lines.deliver(buffer.rest())


class _Lines:
    """Where `_read_lines` delivers: the session while it takes messages, then nowhere.

    Only the first line that is not JSON-RPC is logged as a warning (a server
    that logs to its stdout would flood the log).
    """

    __slots__ = ("_messages", "_open", "_server", "_warned")

    def __init__(
        self, server: str, messages: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        self._server = server
        self._messages = messages
        self._open = True
        self._warned = False

    async def deliver(self, line: bytes) -> None:
        if not self._open or not line.strip():
            await trio.lowlevel.checkpoint()
            return
        item: SessionMessage | Exception
        try:
            item = SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:  # pydantic's ValidationError, also for bytes not UTF-8
            log = logger.debug if self._warned else logger.warning
            self._warned = True
            log("MCP server %r wrote a line that is not JSON-RPC: %.200r", self._server, line)
            item = exc
        try:
            await self._messages.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._open = False


class _Stdin:
    """The session's write stream to a stdio server: each message queued, as a line, for
    `_write_lines`; a send never waits on the server.

    Past `MAX_UNREAD` bytes queued and not yet written, the server has stopped
    reading: ``lost`` is told (its connection ends; it is restarted) and the
    message is refused (`anyio.BrokenResourceError`, the SDK's "connection
    closed"). Closed (by the session, or `close`), a send raises
    `anyio.ClosedResourceError`.
    """

    __slots__ = ("_lost", "_queue", "_unread", "lines")

    def __init__(self, lost: Callable[[str], None]) -> None:
        self._lost = lost
        self._queue, self.lines = trio.open_memory_channel[bytes](math.inf)
        self._unread = 0

    async def send(self, message: SessionMessage, /) -> None:
        await trio.lowlevel.checkpoint()
        line = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        if self._unread + len(line) + 1 > MAX_UNREAD:
            self._lost(f"stopped reading its stdin ({self._unread:,} bytes unread)")
            raise anyio.BrokenResourceError
        try:
            self._queue.send_nowait(line + b"\n")
        except trio.ClosedResourceError:
            raise anyio.ClosedResourceError from None
        except trio.BrokenResourceError:
            raise anyio.BrokenResourceError from None
        self._unread += len(line) + 1

    def written(self, line: bytes) -> None:
        """`_write_lines` wrote `line`."""
        self._unread -= len(line)

    def close(self) -> None:
        """No more messages: `_write_lines` ends once it wrote those queued."""
        self._queue.close()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> _Stdin:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _write_lines(
    requests: _Stdin,
    stdin: trio.abc.SendStream,
    messages: MemoryObjectSendStream[SessionMessage | Exception],
    written: trio.Event,
) -> None:
    """The session's messages, as `requests` queued them, on the server's stdin, until the
    session is done and they are all written (`written` is set then).

    A server that stops reading because it exited ends the connection: a
    request must not wait for an answer that cannot come.
    """
    try:
        async with requests.lines:
            async for line in requests.lines:
                await stdin.send_all(line)
                requests.written(line)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        messages.close()
    finally:
        written.set()


async def _stop(process: Child) -> None:
    """End the server, its whole group and what it detached within 4.75 s (its caller
    shields it)."""
    assert process.stdin is not None
    with suppress(trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        await process.stdin.aclose()
    with trio.move_on_after(STDIN_GRACE):
        await process.wait()
    if process.returncode is None:
        process.signal_group(signal.SIGTERM)
        with trio.move_on_after(TERM_GRACE):
            await process.wait()
    # What the server left in its group dies now, while the group's id cannot yet
    # belong to anyone else (the server is not reaped, or a member still holds it).
    process.signal_group(signal.SIGKILL)
    with trio.move_on_after(_REAP):
        await process.wait()
    if process.returncode is None:
        logger.warning("MCP server process %d survived SIGKILL; abandoning it", process.pid)
    await process.end(_SWEEP)


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
