"""One ACP connection: a reader, one writer, one session table, one teardown.

* **State.** The connection's sessions, their records and what is in flight
  are one `table.SessionTable`, held by each part that acts on them: the
  dispatch here, the requests on a live session (`prompting.Prompting`), the
  starts (`starts.SessionStarts`) and the teardown.
* **Order.** The reader decodes frames one at a time and looks each method
  up in the connection's routes (its params Struct, its handler). What must
  keep arrival order runs inline in the reader: ``session/prompt`` queues its
  text on the agent's inbox, ``session/cancel`` cancels, ``_session/steering``
  steers (`prompting`). Requests that wait (new, load, resume, fork, list,
  close, delete: `starts`) run in tasks of their own.
* **One writer** (`outbox.Outbox`). Every frame goes through one channel to
  one writer task, so a turn's ``session/update``s (sent as the log grows)
  are on the wire before that prompt's answer.
* **A prompt is answered from its `Prompt`** (`prompting`): by its settle
  callback, in the agent's task, with no task per prompt.
* **MCP servers** of ``session/new`` and ``session/load`` are the session's
  (started before it answers, stopped with it); what becomes of them (a
  failed start, a crash, a restart, giving up) is told to the editor as an
  ``agent_message_chunk``, after the answer that named the session.
* **Teardown** (end of input, a signal, the caller's cancel): first, at once,
  every prompt in flight is answered ``cancelled`` and every session's
  background bash tasks are sent their kill; then every session's agent is
  disposed, all at once (its closing ``turn/end`` reaches disk, its tasks are
  reaped, its MCP servers stopped), so the whole takes one agent's teardown,
  within `TEARDOWN_GRACE`. A sub-agent still ends before its parent: that
  order is the parent's own teardown.

The routes: each method maps to its params Struct and handler as an `InlineRoute` (acted
on in the reader), a `WaitingRoute` (a task of its own) or a `NotificationRoute`.
`AcpConnection` also answers ``initialize`` and shows the editor the runtime's hooks;
`serve_connection` runs the reader and the one writer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, NamedTuple

import msgspec
import trio

import greenroom
from greenroom.acp import frames
from greenroom.acp.access import Principal
from greenroom.acp.client import session_client
from greenroom.acp.live import LiveOutput, TerminalOutput
from greenroom.acp.login import Login
from greenroom.acp.outbox import Outbox, write_frames
from greenroom.acp.params import RpcError, decode
from greenroom.acp.presenter import SHOWN, Presenter
from greenroom.acp.progress import FOLLOWED, SubagentProgress
from greenroom.acp.prompting import Prompting
from greenroom.acp.routes import Unrouted, Watch, subscribe
from greenroom.acp.shared import Attachments
from greenroom.acp.starts import SessionStarted, SessionStarts
from greenroom.acp.table import SessionRecord, SessionTable
from greenroom.actors.life import Owner
from greenroom.actors.types import Agent, SessionClient, Titles
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PROTOCOL_VERSION,
    REQUEST_CANCELLED,
    AgentAuthCapabilities,
    AgentCapabilities,
    AuthenticateParams,
    CancelRequestParams,
    Empty,
    ForkSessionParams,
    Implementation,
    InitializeParams,
    InitializeResult,
    ListSessionsParams,
    LoadSessionParams,
    LoadSessionResult,
    NewSessionParams,
    NewSessionResult,
    PromptParams,
    RequestId,
    SessionParams,
    SetConfigOptionParams,
    SetModeParams,
)
from greenroom.protocol.events import SessionEvent, StatusName, ToolProgress, ToolResult
from greenroom.protocol.mcp import McpStatus
from greenroom.runtime import Runtime
from greenroom.session import Session
from greenroom.session.persistence import Interruption
from greenroom.supervisor import Scope, Supervisor
from greenroom.tools.mcp import McpPrompts

__all__ = [
    "TEARDOWN_GRACE",
    "AcpConnection",
    "FrameReader",
    "FrameWriter",
    "serve_connection",
    "serve_frames",
]

logger = logging.getLogger("greenroom.acp")

INITIALIZED: Final = InitializeResult(
    PROTOCOL_VERSION, Implementation("greenroom", greenroom.__version__)
)
#: The kinds of event a connection acts on: shown to the editor, or read for a sub-agent's
#: progress; any other is passed over at one look-up.
_TOLD: Final = SHOWN | FOLLOWED


class AcpConnection:
    """The state of one connection; `serve_connection` drives it."""

    def __init__(
        self,
        runtime: Runtime,
        owner: Owner,
        nursery: trio.Nursery,
        outgoing: trio.MemorySendChannel[bytes],
        interrupted: Interruption = "close",
        login: Login | None = None,
        principal: Principal | None = None,
        attachments: Attachments | None = None,
        titles: Titles = "prompt",
    ) -> None:
        self.runtime = runtime
        self._login = login
        #: What `initialize` answers: with a `Login`, its method and ``logout`` advertised.
        self._initialized = (
            INITIALIZED
            if login is None
            else msgspec.structs.replace(
                INITIALIZED,
                agent_capabilities=AgentCapabilities(auth=AgentAuthCapabilities()),
                auth_methods=[login.method],
            )
        )
        self.nursery = nursery
        self.outbox = outbox = Outbox(outgoing)
        #: The sessions, their records and what is in flight: the state every part holds.
        self.scope = Scope("acp connection")
        # What the runtime tells of a session reaches this connection while it holds it:
        # routed by the server's connections' routes, or, alone on stdio, heard directly.
        if attachments is None:
            watch: Watch = Unrouted()
            subscribe(runtime.hooks, self, self.scope)
        else:
            watch = attachments.routes.watch(self)
        self.table = table = SessionTable(outbox, runtime.bash, list(runtime.models), watch)
        self.subagents = SubagentProgress(outbox.update, watch)
        self._files = (False, False)  # the client's fs.readTextFile, fs.writeTextFile
        self._ask = False  # the client's elicitation in form mode: ask_user is offered
        # Who answered, in the log: its clientInfo.name, and the principal its token names
        # (what the client calls itself is its own say; the principal is the server's).
        self._client_name = "client"
        self._principal_name = None if principal is None else principal.name
        self.live = LiveOutput(outbox, nursery)
        self.presenter = presenter = Presenter(
            list(runtime.models),
            {name: getattr(model, "context_window", 0) for name, model in runtime.models.items()},
            runtime.bash.sandboxes.protections,
            titles,
        )
        #: The connection's reading: cancelled, the connection ends (`serve_frames`).
        self.reading = trio.CancelScope()
        self._shared = attachments is not None
        if attachments is not None:  # reconnects: every update tells its place in the log
            outbox.seq_of = self._latest_seq
        prompting = Prompting(table, outbox, nursery, presenter)
        starts = SessionStarts(
            table,
            runtime,
            owner,
            presenter,
            outbox,
            self.client_for,
            interrupted,
            principal,
            attachments,
            titles,
        )
        #: Each method served once `initialize` is answered: its params Struct, its handler.
        self._served: Final[dict[str, InlineRoute | WaitingRoute]] = {
            "initialize": InlineRoute(InitializeParams, self._initialize),
            "authenticate": InlineRoute(AuthenticateParams, self._authenticate),
            "session/prompt": InlineRoute(PromptParams, prompting.prompt),
            "_session/steering": InlineRoute(PromptParams, prompting.steer),
            "session/set_mode": InlineRoute(SetModeParams, prompting.set_mode),
            "session/set_config_option": InlineRoute(
                SetConfigOptionParams, prompting.set_config_option
            ),
            "session/new": WaitingRoute(NewSessionParams, self._keyed(starts.new)),
            "session/load": WaitingRoute(LoadSessionParams, starts.load),
            "session/resume": WaitingRoute(LoadSessionParams, starts.resume),
            "session/fork": WaitingRoute(ForkSessionParams, starts.fork),
            "session/list": WaitingRoute(ListSessionsParams, starts.list_sessions),
            "session/close": WaitingRoute(SessionParams, starts.close),
            "session/delete": WaitingRoute(SessionParams, starts.delete),
        }
        if login is not None:  # served only where it is advertised (`agentCapabilities.auth`)
            self._served["logout"] = InlineRoute(Empty, self._logout)
        #: Each notification acted on (any other is ignored).
        self._notifications: Final[dict[str, NotificationRoute]] = {
            "session/cancel": NotificationRoute(SessionParams, prompting.cancel),
            "$/cancel_request": NotificationRoute(CancelRequestParams, prompting.cancel_request),
        }
        #: What a request may ask: `initialize` only, until it is answered; then `_served`.
        self._routes: dict[str, InlineRoute | WaitingRoute] = {
            "initialize": self._served["initialize"]
        }

    # -- frames in ---------------------------------------------------------------------

    def handle_frame(self, frame: frames.Frame) -> None:
        """Act on one frame: a request is answered exactly once, a notification never, a
        reply (read or not) settles the request of ours it answers; nothing a frame holds
        can raise out of here."""
        outbox = self.outbox
        if isinstance(frame, frames.Bad):
            outbox.fail(frame.id, frame.code, frame.message)
        elif isinstance(frame, frames.IncomingRequest):
            try:
                self._request(frame.id, frame.method, frame.params)
            except RpcError as exc:
                outbox.fail(frame.id, exc.code, exc.message)
            except Exception as exc:  # one request's failure never ends the connection
                logger.warning("request %s failed", frame.method, exc_info=True)
                outbox.fail(frame.id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        elif isinstance(frame, frames.IncomingNotification):
            try:
                notification = self._notifications.get(frame.method)
                if notification is not None:
                    notification.run(decode(notification.params, frame.params))
                elif not frame.method.startswith("_"):
                    logger.info("ignored unknown notification %s", frame.method)
            except RpcError as exc:
                logger.info("dropped notification %s: %s", frame.method, exc.message)
            except Exception:
                logger.warning("notification %s failed", frame.method, exc_info=True)
        elif isinstance(frame, frames.IncomingReply):  # to a request greenroom sent
            error = None if frame.error is msgspec.UNSET else bytes(frame.error).decode()
            result = None if frame.result is msgspec.UNSET else frame.result
            outbox.requests.reply(frame.id, result, error)
        else:  # a reply that could not be read: its request fails, saying why
            outbox.requests.reply(frame.id, None, frame.why)

    def _request(self, request_id: RequestId, method: str, raw: msgspec.Raw) -> None:
        route = self._routes.get(method)
        if route is not None:
            params = decode(route.params, raw)
            if isinstance(route, InlineRoute):
                route.run(request_id, params)
            else:
                self._spawn(request_id, route.run(params))
            return
        notification = self._notifications.get(method)
        if self._routes is not self._served and (
            method in self._served or notification is not None
        ):
            raise RpcError(
                INVALID_REQUEST, f"{method} before initialize: the client must initialize first"
            )
        if notification is None:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")
        # Notifications by the spec; sent as a request, they act alike and get an answer.
        notification.run(decode(notification.params, raw))
        self.outbox.respond(request_id, Empty())

    def _spawn(self, request_id: RequestId, handler: Coroutine[object, object, object]) -> None:
        scope = self.table.requests[request_id] = trio.CancelScope()

        async def run() -> None:
            outbox = self.outbox
            try:
                with scope:
                    result = await handler
                    if isinstance(result, SessionStarted):
                        # Installed in the step its answer is sent, so its notices,
                        # told here, always follow that answer.
                        answer = result.answer
                        outbox.respond(request_id, answer)
                        if isinstance(answer, NewSessionResult | LoadSessionResult):
                            mode = answer.modes.current_mode_id
                            result.record.settings_told(answer.config_options, mode)
                        result.record.announce(outbox)
                        result.record.answered(outbox)  # a carried-on turn's updates so far
                        self._offer_commands(result.record.session_id)
                    else:
                        outbox.respond(request_id, result)
                    return
                outbox.fail(request_id, REQUEST_CANCELLED, "request cancelled")
            except RpcError as exc:
                outbox.fail(request_id, exc.code, exc.message)
            except Exception as exc:  # one request's failure never ends the connection
                logger.warning("request %r failed", request_id, exc_info=True)
                outbox.fail(request_id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            finally:
                self.table.requests.pop(request_id, None)

        self.nursery.start_soon(run)

    def _initialize(self, request_id: RequestId, params: InitializeParams) -> None:
        capabilities = params.client_capabilities
        fs = capabilities.fs
        self._files = (fs.read_text_file, fs.write_text_file)
        elicitation = capabilities.elicitation
        self._ask = elicitation is not None and elicitation.form is not None
        if (capabilities.meta or {}).get("terminal_output") is True:
            self.presenter.terminal = True
            self.live.terminal = TerminalOutput()
        session = capabilities.session
        self.presenter.compaction = session is not None and session.compaction is not None
        options = None if session is None else session.config_options
        self.presenter.booleans = options is not None and options.boolean is not None
        self.presenter.notices = (capabilities.meta or {}).get("notice") is True
        self.presenter.plans = capabilities.plan is not None
        name = (params.client_info or {}).get("name")
        named = name.strip()[:100] if isinstance(name, str) and name.strip() else "client"
        by = self._principal_name
        self._client_name = named if by is None else f"{named} ({by})"
        self.outbox.respond(request_id, self._initialized)
        self._routes = self._served

    def _authenticate(self, request_id: RequestId, params: AuthenticateParams) -> None:
        if self._login is None:  # `authMethods` is empty: no method id is one of ours
            raise RpcError(
                INVALID_PARAMS,
                f"invalid params: methodId {params.method_id!r} is not an advertised auth"
                " method (this agent advertises none: it needs no authentication)",
            )
        self._login.authenticate(params.method_id)
        self.outbox.respond(request_id, Empty())

    def _logout(self, request_id: RequestId, params: Empty) -> None:
        assert self._login is not None  # routed only then
        self._login.logout()
        self.outbox.respond(request_id, Empty())

    def _keyed(
        self, start: Callable[[NewSessionParams], Coroutine[object, object, SessionStarted]]
    ) -> Callable[[NewSessionParams], Coroutine[object, object, SessionStarted]]:
        """`start`, refused -32000 while the model a new session starts on has no key."""
        login = self._login
        if login is None:
            return start

        async def keyed(params: NewSessionParams) -> SessionStarted:
            login.refuse_unless_keyed()
            return await start(params)

        return keyed

    def _latest_seq(self, session_id: str) -> int | None:
        record = self.table.records.get(session_id)
        if record is None or record.handle is None:
            return None
        return len(record.handle.agent.session.events) - 1

    def client_for(self, session_id: str) -> SessionClient:
        """What the tools of `session_id` get from this client (`client.session_client`)."""
        read, write = self._files
        return session_client(
            self.outbox.requests,
            session_id,
            read=read,
            write=write,
            ask=self._ask,
            name=self._client_name,
            ready=self.table.records[session_id].ready,
        )

    # -- what the runtime tells: shown to the editor -------------------------------------------

    def on_event(self, session: Session, event: SessionEvent) -> None:
        if type(event) not in _TOLD:
            return  # most of a turn's events: its and its steps' starts and ends
        record = self.table.records.get(session.id)
        if record is None or record.handle is None:
            if self.subagents:
                self.subagents.on_event(session.id, event)
            return
        if type(event) is ToolResult:
            self.live.drop(session.id, event.call_id)  # no snapshot after the result
        for update in self.presenter.present(session, event, replay=False):
            record.show(self.outbox, update)

    def on_progress(self, agent: Agent, progress: ToolProgress) -> None:
        record = self.table.records.get(agent.session.id)
        if record is not None and record.handle is not None and record.held is None:
            self.live.show(record.session_id, progress)

    def _offer_commands(self, session_id: str) -> None:
        self.outbox.update(session_id, self.table.commands_of(session_id).update())

    def on_prompts(self, agent: Agent, prompts: McpPrompts) -> None:
        """A server of a session here offers other prompts: the commands change; told now
        if the session was announced, else with its announcement."""
        record = self.table.records.get(agent.session.id)
        if record is None:
            return
        if self.table.commands_of(record.session_id).offer(prompts) and record.notices is None:
            self._offer_commands(record.session_id)

    def on_subagent(self, parent: Agent, call_id: str, child: Agent) -> None:
        record = self.table.records.get(parent.session.id)
        if record is not None and record.handle is not None:
            self.subagents.follow(parent.session.id, call_id, child.session.id)

    def on_status(self, agent: Agent, status: StatusName) -> None:
        # A child can end without the turn/end its progress forgets it at: a cancel
        # that dropped its turn before it began, a disposal before its prompt.
        if status == "disposed":
            self.subagents.forget(agent.session.id)
            record = self.table.records.get(agent.session.id)
            if record is not None and record.handle is not None and record.handle.agent is agent:
                self._gone(record)

    def _gone(self, record: SessionRecord) -> None:
        """A session of the client's ended under it, not by a request of its own nor the
        teardown (both drop the record first): another node asked for it (a hand-off).
        Its prompts are answered ``cancelled``, the client told; loading it again asks
        for it back. Under ``greenroom serve`` the connection lets go of its attachment
        (the last to let go frees the session's place in the server, and its principal's
        count of sessions held) and then ends (`reading`), so that a client reconnects, to
        whichever node it chooses."""
        if self.table.closed:
            return
        self.table.drop(record.session_id)
        record.abandon(self.outbox)
        self.outbox.tell(
            record.session_id,
            "This session was handed to another node that asked for it; load it again to"
            " take it back.",
        )
        if self._shared:
            assert record.handle is not None
            self.nursery.start_soon(record.handle.dispose)
            self.reading.cancel(reason="a session of the connection was handed off")

    def on_server(self, agent: Agent, status: McpStatus) -> None:
        """Tell the editor when a server of one of its sessions fails, gives up, or is back."""
        record = self.table.records.get(agent.session.id)
        if record is None:
            return  # another connection's session
        before = status.previous
        quiet = status.state == before or (status.state == "ready" and before == "starting")
        slow = bool(status.message) and "starting" in (status.state, before)
        if quiet and not slow:  # a slow start and its end are told
            return
        record.notice(self.outbox, self.presenter.server_notice(status))

    # -- the end ---------------------------------------------------------------------------

    async def teardown(self) -> None:
        """Close: every session released, all at once. Memoised by the table's ``closed``.

        Every prompt is answered and every task killed first, at once, so a
        dispose that overruns the teardown's grace cannot leave them behind;
        then the agents are disposed together, each in its own order (a
        session whose MCP server or bash task ignores SIGTERM costs its kill
        grace once, not once per session). A session still starting is left
        to its request, which disposes it (`SessionTable.go_live`).
        """
        table = self.table
        if table.closed:
            return
        records = table.close()
        self.subagents.close()
        self.live.stop()
        self.outbox.requests.close()  # a question open to the client is answered no more
        try:
            for record in records:
                table.abandon(record)
            async with trio.open_nursery() as disposing:
                for record in reversed(records):
                    assert record.handle is not None
                    disposing.start_soon(record.handle.dispose)
        finally:
            await self.scope.close()


class InlineRoute(NamedTuple):
    """A request acted on in the reader, in arrival order; it answers itself."""

    params: type[msgspec.Struct]
    run: Callable[[RequestId, Any], None]


class WaitingRoute(NamedTuple):
    """A request run in a task of its own, answered with what it returns."""

    params: type[msgspec.Struct]
    run: Callable[[Any], Coroutine[object, object, object]]


class NotificationRoute(NamedTuple):
    """A notification, acted on in the reader; as a request it is answered ``{}``."""

    params: type[msgspec.Struct]
    run: Callable[[Any], None]


# -- the loop --------------------------------------------------------------------------------------

#: Seconds the teardown may take (disposing agents flushes their sessions) before it is cut.
TEARDOWN_GRACE: Final = 5.0


async def serve_connection(
    runtime: Runtime,
    stream: trio.abc.Stream,
    *,
    interrupted: Interruption = "close",
    login: Login | None = None,
    titles: Titles = "prompt",
) -> None:
    """Serve ACP on `stream` until the peer closes it (or the caller cancels), then tear down.

    ``interrupted="continue"``: a session loaded or resumed whose last turn a crash
    cut has that turn carried on (docs/semantics.md, "Durable turns"). `login`: the
    keys of ``greenroom acp`` (`login.Login`), advertised as a terminal login, with
    ``logout``; None (an embedder's models, keyed in code) advertises no auth.
    `titles`: how a session's title is written when its log sets none (``model``: by its
    model, after its first turn; `greenroom.actors.titles`), offered to a client that
    takes boolean config options as the option ``titles``.

    Agents of the connection are owned by a supervisor of its own: when this
    returns, none is left registered and no session of it is in the store.
    """
    # Partials, not closures: a coroutine frame fewer to resume at each wake of the reader
    # and of the writer.
    read = functools.partial(frames.read_lines, stream)
    write = functools.partial(write_frames, stream=stream)
    await serve_frames(runtime, read, write, interrupted=interrupted, login=login, titles=titles)


#: A transport's reader: hands each frame it reads to its callback, returns at end of input.
FrameReader = Callable[[Callable[[frames.Frame], None]], Awaitable[None]]
#: A transport's writer: sends each encoded frame (newline-terminated) of its channel, in order,
#: until the channel ends or the peer is gone.
FrameWriter = Callable[[trio.MemoryReceiveChannel[bytes]], Awaitable[None]]


async def serve_frames(
    runtime: Runtime,
    read: FrameReader,
    write: FrameWriter,
    *,
    interrupted: Interruption = "close",
    login: Login | None = None,
    principal: Principal | None = None,
    attachments: Attachments | None = None,
    titles: Titles = "prompt",
) -> None:
    """`serve_connection` on any transport: one connection whose frames come from `read` and
    go out through `write` (started once, the connection's only writer), torn down when
    `read` returns (the end of input) or the caller cancels. What `serve_connection`
    guarantees holds whatever the transport. `principal`: who the client is, and so
    which sessions it sees (`starts.SessionStarts`); None sees every session.
    `attachments`: the sessions it shares with the server's other connections
    (`shared.Attachments`); None: its sessions are its own."""
    frames_in, frames_out = trio.open_memory_channel[bytes](math.inf)
    # The writer outlives a cancel of the connection (a signal): the teardown's
    # answers must still reach the peer. It stops at the end of its channel, or
    # when its grace after the teardown runs out.
    writing = trio.CancelScope(shield=True)

    async def writer() -> None:
        with writing, frames_out:
            await write(frames_out)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        try:
            # Requests still in flight at the end (a load racing the teardown) finish
            # inside `handlers`, so their answers are written before the writer stops.
            async with trio.open_nursery() as handlers:
                try:
                    # Its own sessions are independent: stopped together, in one grace.
                    # Shared ones are the server's, owned by its supervisor.
                    async with (
                        Supervisor(name="acp-connection", stop_together=True)
                        if attachments is None
                        else contextlib.nullcontext(attachments.owner)
                    ) as owner:
                        connection = AcpConnection(
                            runtime,
                            owner,
                            handlers,
                            frames_in,
                            interrupted,
                            login,
                            principal,
                            attachments,
                            titles,
                        )
                        try:
                            with connection.reading:
                                await read(connection.handle_frame)
                        finally:
                            with trio.CancelScope(shield=True), trio.move_on_after(TEARDOWN_GRACE):
                                await connection.teardown()
                finally:
                    handlers.cancel_scope.deadline = trio.current_time() + TEARDOWN_GRACE
        finally:
            frames_in.close()
            writing.deadline = trio.current_time() + TEARDOWN_GRACE
