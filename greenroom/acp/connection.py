"""One ACP connection: a reader, one writer, a session record per session, one teardown.

* **Order.** The reader decodes frames one at a time. What must keep arrival
  order happens inline in the reader: ``session/prompt`` queues its text on
  the agent's inbox, ``session/cancel`` cancels, ``_session/steering`` steers.
  Requests that wait (new, load, resume, list, close) run in their own tasks.
* **One writer.** Every frame goes through one channel to one writer task, so
  a turn's ``session/update``s (written as the log grows) are on the wire
  before that prompt's response (written at the turn's ``turn/end``).
* **Prompts settle from the log.** A prompt's message id is found in the
  ``user/message`` of the turn that took it; that turn's end (``agent/turn-end``,
  reported once the turn's ``turn/end`` is flushed as the sync policy says)
  answers it, with its own stop reason. A cancelled turn's late end cannot
  answer a later prompt: it is a different turn.
* **MCP servers** of ``session/new`` and ``session/load`` are the session's
  (started before it answers, stopped with it); what becomes of them (a
  failed start, a crash, a restart, giving up) is told to the editor as an
  ``agent_message_chunk``, after the answer that named the session.
* **Teardown** (end of input, a signal, the caller's cancel): first, at once,
  every pending prompt is answered ``cancelled`` and every session's
  background bash tasks are sent their kill; then every session's agent is
  disposed, all at once (its closing ``turn/end`` reaches disk, its tasks are
  reaped, its MCP servers stopped), so the whole takes one agent's teardown,
  within `TEARDOWN_GRACE`. A sub-agent still ends before its parent: that
  order is the parent's own teardown.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

import msgspec
import trio

import greenroom
from greenroom.acp import frames
from greenroom.acp.client import ClientRequests, session_client
from greenroom.acp.presenter import Presenter, iso_time
from greenroom.actors.events import AGENT_STATUS, AGENT_TURN_END
from greenroom.actors.life import AgentHandle
from greenroom.actors.types import Agent, SessionClient
from greenroom.models.usage import usage_of_turn
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSION,
    REQUEST_CANCELLED,
    RESOURCE_NOT_FOUND,
    AgentMessageChunk,
    AuthenticateParams,
    CancelRequestParams,
    ContentBlock,
    Empty,
    ErrorObject,
    ErrorResponse,
    ForkSessionParams,
    HttpServerEntry,
    Implementation,
    InitializeParams,
    InitializeResult,
    ListSessionsParams,
    ListSessionsResult,
    LoadSessionParams,
    LoadSessionResult,
    NewSessionParams,
    NewSessionResult,
    Notification,
    OutgoingRequest,
    PromptParams,
    PromptResult,
    PromptUsage,
    RequestId,
    Response,
    SessionInfo,
    SessionNotificationParams,
    SessionParams,
    SetConfigOptionParams,
    SetConfigOptionResult,
    SetModeParams,
    StdioServerEntry,
    SteeringResult,
    StopReason,
    TextBlock,
    ToolCallContent,
    ToolCallProgress,
)
from greenroom.protocol.events import (
    COMPLETED,
    AssistantMessage,
    Completed,
    Errored,
    MaxTokens,
    Refused,
    SessionEvent,
    StatusName,
    ToolCall,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.mcp import (
    McpHttpServer,
    McpServer,
    McpStatus,
    McpStdioServer,
    check_servers,
)
from greenroom.protocol.model import Usage
from greenroom.runtime import Runtime
from greenroom.session import SESSION_EVENT, Session
from greenroom.session.persistence import PersistenceError, SessionLocked, SessionNotFound
from greenroom.supervisor import Scope, Supervisor
from greenroom.tools.bash.tools import kill_owned
from greenroom.tools.mcp import MCP_STATUS
from greenroom.tools.subagents import SUBAGENT_STARTED

logger = logging.getLogger("greenroom.acp")

P = TypeVar("P", bound=msgspec.Struct)

_encoder = msgspec.json.Encoder()
INITIALIZED: Final = InitializeResult(
    PROTOCOL_VERSION, Implementation("greenroom", greenroom.__version__)
)
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
#: Sessions per page of ``session/list``.
LIST_PAGE: Final = 50
#: The most of a sub-agent's progress shown in its ``task`` call (its latest part).
PROGRESS_CHARS: Final = 4000
#: A prompt whose text begins with it compacts the session (``/compact [instructions]``).
COMPACT_COMMAND: Final = "/compact"
_ECHOED_ID: Final = 65536  # characters of a request id an oversized answer's error still echoes


class RpcError(Exception):
    """Answer the request with this JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Pending:
    """A ``session/prompt`` waiting for the end of the turn that took its message."""

    __slots__ = ("cancelled", "request_id", "turn")

    def __init__(self, request_id: RequestId) -> None:
        self.request_id = request_id
        self.turn: int | None = None  # the turn that took it, once the log shows it
        self.cancelled = False


class _Subagent:
    """A ``task`` call's child, whose progress streams into the call on its parent's session."""

    __slots__ = ("call_id", "lines", "session_id")

    def __init__(self, session_id: str, call_id: str) -> None:
        self.session_id = session_id
        self.call_id = call_id
        self.lines: list[str] = []


class SessionRecord:
    __slots__ = ("handle", "notices", "pending", "session_id")

    def __init__(self, session_id: str, handle: AgentHandle, notices: list[str]) -> None:
        self.session_id = session_id
        self.handle = handle
        self.pending: dict[str, _Pending] = {}  # by message id
        #: What its servers did before the session was announced; None once told.
        self.notices: list[str] | None = notices


class AcpConnection:
    """The state of one connection; `serve_connection` drives it."""

    def __init__(
        self,
        runtime: Runtime,
        owner: Supervisor,
        nursery: trio.Nursery,
        outgoing: trio.MemorySendChannel[bytes],
    ) -> None:
        self.runtime = runtime
        self.owner = owner
        self.nursery = nursery
        self.outgoing = outgoing
        self.persistence = runtime.persistence
        self.records: dict[str, SessionRecord] = {}
        self.loading: set[str] = set()
        #: Sessions starting here, with what their MCP servers did meanwhile.
        self.starting: dict[str, list[str]] = {}
        self._unannounced: list[SessionRecord] = []  # installed, their answer not yet sent
        self._subagents: dict[str, _Subagent] = {}  # by the child's session id
        self.closed = False
        self.scope = Scope("acp connection")
        self._in_flight: dict[RequestId, trio.CancelScope] = {}
        self.client_requests = ClientRequests(self.send)
        self._files = (False, False)  # the client's fs.readTextFile, fs.writeTextFile
        self.presenter = Presenter(
            list(runtime.models),
            {name: getattr(model, "context_window", 0) for name, model in runtime.models.items()},
        )
        runtime.hooks.on(SESSION_EVENT, self._on_event, scope=self.scope)
        runtime.hooks.on(AGENT_TURN_END, self._on_turn_end, scope=self.scope)
        runtime.hooks.on(MCP_STATUS, self._on_server, scope=self.scope)
        runtime.hooks.on(SUBAGENT_STARTED, self._on_subagent, scope=self.scope)
        runtime.hooks.on(AGENT_STATUS, self._on_status, scope=self.scope)

    # -- frames out --------------------------------------------------------------------

    def send(self, frame: msgspec.Struct) -> None:
        """Queue `frame` for the writer; one past `frames.MAX_FRAME` goes as `_too_large`
        says (the presenter bounds updates, so that is a last guard only)."""
        data = _encoder.encode(frame)
        if len(data) > frames.MAX_FRAME:
            logger.warning("a %s frame of %d bytes was not sent", type(frame).__name__, len(data))
            replacement = self._too_large(frame, len(data))
            if replacement is None:
                return
            data = _encoder.encode(replacement)
        # A closed channel means the peer is gone and teardown is under way.
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            self.outgoing.send_nowait(data + b"\n")

    def _too_large(self, frame: msgspec.Struct, size: int) -> msgspec.Struct | None:
        """What goes instead of a frame too large for a reader: an answer becomes an error
        answer; a request of ours fails at once, as if the client had refused it; an update
        becomes a notice in its session; another notification is dropped."""
        why = f"{size} bytes, over the {frames.MAX_FRAME}-byte frame limit"
        if isinstance(frame, Response | ErrorResponse):
            # An id that itself fills the frame cannot be echoed: answered with id null.
            request_id = frame.id if len(str(frame.id)) <= _ECHOED_ID else None
            return ErrorResponse(request_id, ErrorObject(INTERNAL_ERROR, f"the answer was {why}"))
        if isinstance(frame, OutgoingRequest):
            self.client_requests.reply(frame.id, None, f"not sent: the request was {why}")
            return None
        if isinstance(frame, Notification) and isinstance(frame.params, SessionNotificationParams):
            notice = AgentMessageChunk(TextBlock(f"[an update of {why} was not sent]\n"))
            return Notification(
                "session/update", SessionNotificationParams(frame.params.session_id, notice)
            )
        return None

    def respond(self, request_id: RequestId, result: object) -> None:
        self.send(Response(request_id, result))

    def fail(self, request_id: RequestId, code: int, message: str) -> None:
        self.send(ErrorResponse(request_id, ErrorObject(code, message)))

    def oversized(self) -> None:
        self.fail(None, INVALID_REQUEST, f"frame longer than {frames.MAX_FRAME} bytes")

    # -- frames in ---------------------------------------------------------------------

    def handle_line(self, line: bytes) -> None:
        """Decode and act on one frame: a request is answered exactly once, a notification
        never; nothing a frame holds can raise out of here."""
        frame = frames.decode_frame(line)
        if isinstance(frame, frames.Bad):
            self.fail(frame.id, frame.code, frame.message)
        elif isinstance(frame, frames.Request):
            try:
                self._request(frame.id, frame.method, frame.params)
            except RpcError as exc:
                self.fail(frame.id, exc.code, exc.message)
            except Exception as exc:  # one request's failure never ends the connection
                logger.warning("request %s failed", frame.method, exc_info=True)
                self.fail(frame.id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        elif isinstance(frame, frames.Notification):
            try:
                self._notification(frame.method, frame.params)
            except RpcError as exc:
                logger.info("dropped notification %s: %s", frame.method, exc.message)
            except Exception:
                logger.warning("notification %s failed", frame.method, exc_info=True)
        else:  # a reply to a request greenroom sent
            error = None if frame.error is msgspec.UNSET else bytes(frame.error).decode()
            result = None if frame.result is msgspec.UNSET else frame.result
            self.client_requests.reply(frame.id, result, error)

    def _notification(self, method: str, params: msgspec.Raw) -> None:
        if method == "session/cancel":
            self._cancel(_decode(SessionParams, params).session_id)
        elif method == "$/cancel_request":
            self._cancel_request(_decode(CancelRequestParams, params).request_id)
        elif not method.startswith("_"):
            logger.info("ignored unknown notification %s", method)

    def _request(self, request_id: RequestId, method: str, params: msgspec.Raw) -> None:
        if method in ("session/cancel", "$/cancel_request"):
            # Notifications by the spec; sent as a request, they act alike and get an answer.
            self._notification(method, params)
            self.respond(request_id, Empty())
        elif method == "session/prompt":
            self._prompt(request_id, _decode(PromptParams, params))
        elif method == "_session/steering":
            self._steer(request_id, _decode(PromptParams, params))
        elif method == "initialize":
            fs = _decode(InitializeParams, params).client_capabilities.fs
            self._files = (fs.read_text_file, fs.write_text_file)
            self.respond(request_id, INITIALIZED)
        elif method == "session/set_mode":
            mode = _decode(SetModeParams, params)
            self._configure(mode.session_id, "mode", mode.mode_id)
            self.respond(request_id, Empty())
        elif method == "session/set_config_option":
            option = _decode(SetConfigOptionParams, params)
            session = self._configure(option.session_id, option.config_id, option.value)
            self.respond(request_id, SetConfigOptionResult(self.presenter.config_options(session)))
        elif method == "authenticate":
            chosen = _decode(AuthenticateParams, params).method_id
            # `authMethods` is empty: no method id is one of ours, and none is needed.
            raise RpcError(
                INVALID_PARAMS,
                f"invalid params: methodId {chosen!r} is not an advertised auth method"
                " (this agent advertises none: it needs no authentication)",
            )
        elif method == "session/new":
            self._spawn(request_id, self._new, _decode(NewSessionParams, params))
        elif method == "session/load":
            self._spawn(request_id, self._load, _decode(LoadSessionParams, params), True)
        elif method == "session/resume":
            self._spawn(request_id, self._load, _decode(LoadSessionParams, params), False)
        elif method == "session/fork":
            self._spawn(request_id, self._fork, _decode(ForkSessionParams, params))
        elif method == "session/list":
            self._spawn(request_id, self._list, _decode(ListSessionsParams, params))
        elif method == "session/close":
            self._spawn(request_id, self._close, _decode(SessionParams, params))
        elif method == "session/delete":
            self._spawn(request_id, self._delete, _decode(SessionParams, params))
        else:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")

    def _spawn(
        self, request_id: RequestId, handler: Callable[..., Awaitable[object]], *args: Any
    ) -> None:
        scope = trio.CancelScope()
        self._in_flight[request_id] = scope

        async def run() -> None:
            try:
                with scope:
                    result = await handler(*args)
                    self.respond(request_id, result)
                    # A session is installed in the same step its answer is sent, so
                    # its notices, told here, always follow that answer.
                    self._announce()
                    return
                self.fail(request_id, REQUEST_CANCELLED, "request cancelled")
            except RpcError as exc:
                self.fail(request_id, exc.code, exc.message)
            except Exception as exc:  # one request's failure never ends the connection
                logger.warning("request %r failed", request_id, exc_info=True)
                self.fail(request_id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            finally:
                self._in_flight.pop(request_id, None)

        self.nursery.start_soon(run)

    # -- inline: order matters -------------------------------------------------------------

    def _prompt(self, request_id: RequestId, params: PromptParams) -> None:
        record = self._record(params.session_id)
        text = _text(params.prompt)
        command, _, instructions = text.strip().partition(" ")
        if command == COMPACT_COMMAND:
            agent = record.handle.agent
            last_turn = agent.session.last_turn
            agent.compact(instructions.strip() or None)
            self.nursery.start_soon(self._compacted, request_id, agent, last_turn)
            return
        message_id = record.handle.agent.send(text).id
        record.pending[message_id] = _Pending(request_id)

    async def _compacted(self, request_id: RequestId, agent: Agent, last_turn: int) -> None:
        """Answer a ``/compact`` once the agent is idle again: by its compaction turn's end
        (``end_turn`` when nothing needed one)."""
        await agent.when_idle()
        reason: TurnEndReason = COMPLETED
        for event in reversed(agent.session.events):
            if isinstance(event, TurnEnd) and event.turn > last_turn:
                reason = event.reason
                break
            if isinstance(event, TurnStart) and event.turn <= last_turn:
                break
        self.respond(request_id, PromptResult(_stop_reason(reason, False)))

    def _steer(self, request_id: RequestId, params: PromptParams) -> None:
        agent = self._record(params.session_id).handle.agent
        running = agent.status == "running"
        agent.steer(_text(params.prompt))
        self.respond(request_id, SteeringResult("injected" if running else "startedNewTurn"))

    def _configure(self, session_id: str, key: str, value: str) -> Session:
        agent = self._record(session_id).handle.agent
        try:
            agent.configure(key, value)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
        return agent.session

    def _cancel(self, session_id: str) -> None:
        record = self.records.get(session_id)
        if record is None:
            return  # a notification: nothing to answer
        record.handle.agent.cancel("session/cancel")
        for message_id, pending in list(record.pending.items()):
            if pending.turn is None:  # still queued: the cancel dropped it
                del record.pending[message_id]
                self.respond(pending.request_id, PromptResult("cancelled"))
            else:  # its turn ends now, aborted; that turn/end answers it
                pending.cancelled = True

    def _cancel_request(self, request_id: RequestId) -> None:
        for record in self.records.values():
            for message_id, pending in record.pending.items():
                if pending.request_id != request_id:
                    continue
                # A prompt still queued is withdrawn alone; the running one is the
                # session's cancel (queue-aware: what waits behind it is dropped too).
                if pending.turn is None and record.handle.agent.withdraw(message_id):
                    del record.pending[message_id]
                    self.respond(request_id, PromptResult("cancelled"))
                else:
                    self._cancel(record.session_id)
                return
        scope = self._in_flight.get(request_id)
        if scope is not None:
            scope.cancel(reason="$/cancel_request")

    # -- spawned: requests that wait -----------------------------------------------------------

    async def _new(self, params: NewSessionParams) -> NewSessionResult:
        _check_cwd(params.cwd, must_exist=True)
        _check_roots(params.additional_directories)
        servers = servers_from_acp(params.mcp_servers)
        self._require_open()
        session_id = str(uuid.uuid4())
        return await self._go_live(
            session_id,
            self.runtime.agents.create(
                agent_id=session_id,
                session_id=session_id,
                cwd=params.cwd,
                additional_directories=params.additional_directories,
                owner=self.owner,
                client=self._client(session_id),
                mcp_servers=servers,
            ),
        )

    async def _load(self, params: LoadSessionParams, replay: bool) -> LoadSessionResult:
        session_id = params.session_id
        self._check_stored_id(session_id)
        _check_cwd(params.cwd, must_exist=False)
        _check_roots(params.additional_directories)
        servers = servers_from_acp(params.mcp_servers)
        self._require_open()
        if session_id in self.records or session_id in self.loading:
            raise RpcError(INVALID_PARAMS, f"session {session_id!r} is already loaded")
        self.loading.add(session_id)
        self.starting[session_id] = []
        try:
            # The roots are the ones sent now (none if omitted), never the stored ones.
            handle = await self._resume(session_id, servers, params.additional_directories)
            session = handle.agent.session
            stored_cwd = session.header.cwd
            if stored_cwd != params.cwd:
                await handle.dispose()
                raise RpcError(
                    INVALID_PARAMS,
                    f"session {session_id!r} belongs to cwd {stored_cwd!r}, not {params.cwd!r}",
                )
            await self._install(session_id, handle)
            if replay:
                for event in session.events:
                    self._present(session, event, replay=True)
            return LoadSessionResult(
                self.presenter.modes(session), self.presenter.config_options(session)
            )
        finally:
            self.loading.discard(session_id)
            self.starting.pop(session_id, None)

    async def _fork(self, params: ForkSessionParams) -> NewSessionResult:
        """A new session holding the stored one's whole log, taken live here (not replayed:
        the client has the original's history)."""
        self._check_stored_id(params.session_id)
        _check_cwd(params.cwd, must_exist=True)
        _check_roots(params.additional_directories)
        servers = servers_from_acp(params.mcp_servers)
        self._require_open()
        session_id = str(uuid.uuid4())
        try:
            await self.runtime.agents.fork(
                params.session_id,
                session_id,
                cwd=params.cwd,
                additional_directories=params.additional_directories,
            )
        except SessionNotFound as exc:
            raise RpcError(RESOURCE_NOT_FOUND, str(exc)) from None
        except PersistenceError as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None
        return await self._go_live(session_id, self._resume(session_id, servers))

    async def _go_live(
        self, session_id: str, start: Coroutine[object, object, AgentHandle]
    ) -> NewSessionResult:
        """Run `start` (a create or a resume of `session_id`) and keep the session here;
        what its servers do meanwhile is told after the answer."""
        self.starting[session_id] = []
        try:
            handle = await start
            await self._install(session_id, handle)
        finally:
            self.starting.pop(session_id, None)
        session = handle.agent.session
        return NewSessionResult(
            session_id, self.presenter.modes(session), self.presenter.config_options(session)
        )

    def _check_stored_id(self, session_id: str) -> None:
        """Refuse, as the protocol answers it, a stored session this bridge could not read."""
        if self.persistence is None:
            raise RpcError(INTERNAL_ERROR, "session persistence is not configured")
        try:
            self.persistence.check_session_id(session_id)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"invalid params: sessionId: {exc}") from None

    async def _resume(
        self,
        session_id: str,
        servers: list[McpServer],
        additional_directories: list[str] | None = None,
    ) -> AgentHandle:
        """Take a stored session live here, owned by this connection (with the stored
        additional roots unless others are given)."""
        try:
            return await self.runtime.agents.resume(
                agent_id=session_id,
                session_id=session_id,
                owner=self.owner,
                client=self._client(session_id),
                mcp_servers=servers,
                additional_directories=additional_directories,
            )
        except SessionNotFound as exc:
            raise RpcError(RESOURCE_NOT_FOUND, str(exc)) from None
        except PersistenceError as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None

    async def _list(self, params: ListSessionsParams) -> ListSessionsResult:
        """Most recently changed first, `LIST_PAGE` at a time; the cursor is an offset."""
        if self.persistence is None:
            return ListSessionsResult([])
        stored = [
            s
            for s in await self.persistence.list()
            if s.header.cwd is not None and params.cwd in (None, s.header.cwd)
        ]
        start = _offset(params.cursor)
        page = stored[start : start + LIST_PAGE]
        more = start + LIST_PAGE < len(stored)
        return ListSessionsResult(
            [
                SessionInfo(s.header.id, s.header.cwd, s.title, iso_time(s.updated_at))
                for s in page
                if s.header.cwd is not None
            ],
            str(start + LIST_PAGE) if more else None,
        )

    async def _delete(self, params: SessionParams) -> Empty:
        """Idempotent: a session open here is closed first; one live elsewhere is refused."""
        self._check_stored_id(params.session_id)
        assert self.persistence is not None
        record = self.records.pop(params.session_id, None)
        if record is not None:
            await self._release(record)
        try:
            await self.persistence.delete(params.session_id)
        except SessionLocked as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None
        return Empty()

    async def _close(self, params: SessionParams) -> Empty:
        record = self.records.pop(params.session_id, None)
        if record is None:
            raise RpcError(RESOURCE_NOT_FOUND, f"unknown session {params.session_id!r}")
        await self._release(record)
        return Empty()

    # -- sessions --------------------------------------------------------------------------------

    async def _install(self, session_id: str, handle: AgentHandle) -> None:
        """Keep the session's handle; if teardown began while it started, dispose it and fail."""
        if self.closed:
            await handle.dispose()
            raise RpcError(INTERNAL_ERROR, "the connection closed while the session was starting")
        record = SessionRecord(session_id, handle, self.starting.pop(session_id, []))
        self.records[session_id] = record
        self._unannounced.append(record)

    def _record(self, session_id: str) -> SessionRecord:
        record = self.records.get(session_id)
        if record is None:
            raise RpcError(RESOURCE_NOT_FOUND, f"unknown session {session_id!r}")
        return record

    def _client(self, session_id: str) -> SessionClient:
        read, write = self._files
        return session_client(self.client_requests, session_id, read=read, write=write)

    def _require_open(self) -> None:
        if self.closed:
            raise RpcError(INTERNAL_ERROR, "the connection is closing")

    def _on_event(self, session: Session, event: SessionEvent) -> None:
        record = self.records.get(session.id)
        if record is None:
            subagent = self._subagents.get(session.id)
            if subagent is not None:
                self._progress(session.id, subagent, event)
            return
        self._present(session, event, replay=False)
        if isinstance(event, UserMessage):
            pending = record.pending.get(event.message_id)
            if pending is not None:
                pending.turn = session.open_turn

    def _on_subagent(self, parent: Agent, call_id: str, child: Agent) -> None:
        if parent.session.id in self.records:
            self._subagents[child.session.id] = _Subagent(parent.session.id, call_id)

    def _on_status(self, agent: Agent, status: StatusName) -> None:
        # A child can end without the turn/end `_progress` forgets it at: a cancel
        # that dropped its turn before it began, a disposal before its prompt.
        if status == "disposed" and self._subagents:
            self._subagents.pop(agent.session.id, None)

    def _progress(self, child_id: str, subagent: _Subagent, event: SessionEvent) -> None:
        """The child's messages and tool calls so far, as the content of its ``task`` call."""
        if isinstance(event, TurnEnd):  # its one turn: the call's result follows
            del self._subagents[child_id]
            return
        if isinstance(event, AssistantMessage) and event.content:
            subagent.lines.append(event.content)
        elif isinstance(event, ToolCall):
            subagent.lines.append(f"- {event.title or event.name}")
        else:
            return
        text = "\n\n".join(subagent.lines)[-PROGRESS_CHARS:]
        update = ToolCallProgress(
            subagent.call_id, "in_progress", [ToolCallContent(TextBlock(text))]
        )
        self.send(
            Notification("session/update", SessionNotificationParams(subagent.session_id, update))
        )

    def _on_server(self, agent: Agent, status: McpStatus) -> None:
        """Tell the editor when a server of one of its sessions fails, gives up, or is back."""
        session_id = agent.session.id
        if session_id not in self.records and session_id not in self.starting:
            return  # another connection's session
        before = status.previous
        if status.state == before or (status.state == "ready" and before == "starting"):
            return
        notice = status.describe() + "\n"
        record = self.records.get(session_id)
        if record is None:
            self.starting[session_id].append(notice)
        elif record.notices is not None:
            record.notices.append(notice)
        else:
            self._tell(session_id, notice)

    def _announce(self) -> None:
        records, self._unannounced = self._unannounced, []
        for record in records:
            notices, record.notices = record.notices, None
            for notice in notices or ():
                self._tell(record.session_id, notice)

    def _tell(self, session_id: str, text: str) -> None:
        update = AgentMessageChunk(TextBlock(text))
        self.send(Notification("session/update", SessionNotificationParams(session_id, update)))

    def _on_turn_end(self, agent: Agent, turn: int, reason: TurnEndReason) -> None:
        """A turn's end, as reported (after its flush): it answers the prompts it took."""
        record = self.records.get(agent.session.id)
        if record is None:
            return
        for message_id, pending in list(record.pending.items()):
            if pending.turn == turn:
                del record.pending[message_id]
                self._settle(pending, reason, usage_of_turn(agent.session.events, turn))

    def _present(self, session: Session, event: SessionEvent, *, replay: bool) -> None:
        for update in self.presenter.present(session, event, replay=replay):
            self.send(Notification("session/update", SessionNotificationParams(session.id, update)))

    def _settle(self, pending: _Pending, reason: TurnEndReason, usage: Usage | None) -> None:
        if isinstance(reason, Errored) and not pending.cancelled:
            self.fail(pending.request_id, INTERNAL_ERROR, f"the turn failed: {reason.message}")
            return
        result = PromptResult(_stop_reason(reason, pending.cancelled), _prompt_usage(usage))
        self.respond(pending.request_id, result)

    async def _release(self, record: SessionRecord) -> None:
        """Answer its prompts ``cancelled``, kill its background bash tasks, dispose its agent."""
        self._abandon(record)
        await record.handle.dispose()

    def _abandon(self, record: SessionRecord) -> None:
        """Answer its prompts ``cancelled`` and start killing its bash tasks, at once."""
        for pending in record.pending.values():
            self.respond(pending.request_id, PromptResult("cancelled"))
        record.pending.clear()
        kill_owned(self.runtime.bash, record.session_id)

    async def teardown(self) -> None:
        """Close: every session released, all at once. Memoised by ``closed``.

        Every prompt is answered and every task killed first, at once, so a
        dispose that overruns the teardown's grace cannot leave them behind;
        then the agents are disposed together, each in its own order (a
        session whose MCP server or bash task ignores SIGTERM costs its kill
        grace once, not once per session).
        """
        if self.closed:
            return
        self.closed = True
        self.client_requests.close()  # a question open to the client is answered no more
        records = list(self.records.values())
        self.records.clear()
        try:
            for record in records:
                self._abandon(record)
            async with trio.open_nursery() as disposing:
                for record in reversed(records):
                    disposing.start_soon(record.handle.dispose)
        finally:
            await self.scope.close()


def servers_from_acp(entries: list[dict[str, Any]]) -> list[McpServer]:
    """``mcpServers`` as server specs; a bad entry is -32602 naming it and its field."""
    servers: list[McpServer] = []
    for index, entry in enumerate(entries):
        where = f"mcpServers[{index}]"
        kind = entry.get("type", "stdio")
        try:
            if kind == "stdio":
                stdio = msgspec.convert(entry, StdioServerEntry)
                servers.append(
                    McpStdioServer(
                        name=stdio.name,
                        command=stdio.command,
                        args=stdio.args,
                        env={v.name: v.value for v in stdio.env},
                    )
                )
            elif kind == "http":
                http = msgspec.convert(entry, HttpServerEntry)
                headers = {h.name: h.value for h in http.headers}
                servers.append(McpHttpServer(name=http.name, url=http.url, headers=headers))
            else:
                raise RpcError(
                    INVALID_PARAMS,
                    f"invalid params: {where}.type: {kind!r} is not supported"
                    " (greenroom connects stdio and http servers)",
                )
        except msgspec.ValidationError as exc:
            message = str(exc).replace("`$", f"`{where}")
            raise RpcError(INVALID_PARAMS, f"invalid params: {where}: {message}") from None
    try:
        check_servers(servers)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
    return servers


def _decode(kind: type[P], raw: msgspec.Raw) -> P:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(raw)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
    except msgspec.DecodeError as exc:  # invalid UTF-8 inside a string
        raise RpcError(PARSE_ERROR, f"not JSON: {exc}") from None
    except RecursionError:
        raise RpcError(INVALID_PARAMS, "invalid params: nested too deep to decode") from None


def _check_cwd(cwd: str, *, must_exist: bool, field: str = "cwd") -> None:
    """A directory param: absolute, no NUL, and (for a new session) an existing directory."""
    if "\x00" in cwd:
        raise RpcError(INVALID_PARAMS, f"invalid params: {field} holds a NUL byte: {cwd!r:.80}")
    if not os.path.isabs(cwd):
        raise RpcError(
            INVALID_PARAMS, f"invalid params: {field} must be an absolute path, got {cwd!r:.80}"
        )
    if must_exist and not os.path.isdir(cwd):
        raise RpcError(
            INVALID_PARAMS, f"invalid params: {field} {cwd!r:.80} is not an existing directory"
        )


def _check_roots(directories: list[str]) -> None:
    """``additionalDirectories``: each absolute, without NUL, an existing directory."""
    for directory in directories:
        _check_cwd(directory, must_exist=True, field="additionalDirectories")


def _offset(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit():
        raise RpcError(INVALID_PARAMS, f"invalid params: cursor {cursor!r:.40} is not ours")
    return int(cursor)


def _text(prompt: list[ContentBlock]) -> str:
    parts = [
        block.text if isinstance(block, TextBlock) else f"[{block.name}]({block.uri})"
        for block in prompt
    ]
    text = "\n".join(part for part in parts if part)
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "invalid params: prompt has no text")
    return text


def _prompt_usage(usage: Usage | None) -> PromptUsage | None:
    if usage is None:
        return None
    return PromptUsage(
        usage.input_tokens + usage.output_tokens,
        usage.input_tokens,
        usage.output_tokens,
        usage.reasoning_tokens or None,
        usage.cache_read_tokens or None,
        usage.cache_write_tokens or None,
    )


def _stop_reason(reason: TurnEndReason, cancelled: bool) -> StopReason:
    if cancelled:
        return "cancelled"
    if isinstance(reason, Completed):
        return "end_turn"
    if isinstance(reason, MaxTokens):
        return "max_tokens"
    if isinstance(reason, Refused):
        return "refusal"
    return "cancelled"  # aborted, disposed, interrupted


# -- the loop --------------------------------------------------------------------------------------

#: Seconds the teardown may take (disposing agents flushes their sessions) before it is cut.
TEARDOWN_GRACE: Final = 5.0


async def serve_connection(runtime: Runtime, stream: trio.abc.Stream) -> None:
    """Serve ACP on `stream` until the peer closes it (or the caller cancels), then tear down.

    Agents of the connection are owned by a supervisor of its own: when this
    returns, none is left registered and no session of it is in the store.
    """
    frames_in, frames_out = trio.open_memory_channel[bytes](math.inf)
    # The writer outlives a cancel of the connection (a signal): the teardown's
    # answers must still reach the peer. It stops at the end of its channel, or
    # when its grace after the teardown runs out.
    writing = trio.CancelScope(shield=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_write_frames, frames_out, stream, writing)
        try:
            # Requests still in flight at the end (a load racing the teardown) finish
            # inside `handlers`, so their answers are written before the writer stops.
            async with trio.open_nursery() as handlers:
                try:
                    # Sessions are independent: stopped together, in one grace.
                    async with Supervisor(name="acp-connection", stop_together=True) as owner:
                        connection = AcpConnection(runtime, owner, handlers, frames_in)
                        try:
                            await frames.read_lines(
                                stream, connection.handle_line, connection.oversized
                            )
                        finally:
                            with trio.CancelScope(shield=True), trio.move_on_after(TEARDOWN_GRACE):
                                await connection.teardown()
                finally:
                    handlers.cancel_scope.deadline = trio.current_time() + TEARDOWN_GRACE
        finally:
            frames_in.close()
            writing.deadline = trio.current_time() + TEARDOWN_GRACE


async def _write_frames(
    frames: trio.MemoryReceiveChannel[bytes], stream: trio.abc.SendStream, scope: trio.CancelScope
) -> None:
    """The connection's only writer: frames leave in the order they were queued."""
    with scope, frames:
        async for frame in frames:
            batch = [frame]
            while True:
                try:
                    batch.append(frames.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            try:
                await stream.send_all(b"".join(batch))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the peer is gone
