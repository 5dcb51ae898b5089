"""One ACP connection: a reader, one writer, a record per session, one teardown.

* **Order.** The reader decodes frames one at a time and looks each method
  up in `ROUTES` (its params Struct, its handler). What must keep arrival
  order runs inline in the reader: ``session/prompt`` queues its text on
  the agent's inbox, ``session/cancel`` cancels, ``_session/steering``
  steers. Requests that wait (new, load, resume, fork, list, close, delete:
  `starts`) run in tasks of their own.
* **One writer** (`outbox.Outbox`). Every frame goes through one channel to
  one writer task, so a turn's ``session/update``s (sent as the log grows)
  are on the wire before that prompt's answer.
* **A prompt is answered from its `Prompt`.** ``session/prompt`` keeps the
  `Prompt` that ``send`` returned; its `Answer` is the answer
  (`params.prompt_result`), queued by its settle callback (`Prompt.on_settled`)
  in the agent's task, with no task per prompt: before the agent can start the
  next turn, so ahead of any of that turn's updates.
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
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final, NamedTuple

import msgspec
import trio

import greenroom
from greenroom.acp import frames, starts
from greenroom.acp.client import session_client
from greenroom.acp.commands import COMPACT, MODE, MODEL, Command, SessionCommands, arguments
from greenroom.acp.live import LiveOutput, TerminalOutput
from greenroom.acp.outbox import Outbox, write_frames
from greenroom.acp.params import (
    RpcError,
    decode,
    prompt_result,
    prompt_text,
    servers_from_acp,
)
from greenroom.acp.presenter import Presenter
from greenroom.acp.progress import SubagentProgress
from greenroom.acp.prompts import prompt_content
from greenroom.acp.sessions import InFlight, SessionRecord
from greenroom.acp.starts import LIST_PAGE, SERVER_WAIT, Started
from greenroom.actors.events import AGENT_STATUS, AGENT_TOOL_PROGRESS, SUBAGENT_STARTED
from greenroom.actors.prompt import Answer, Prompt
from greenroom.actors.types import Agent, AgentDisposed, SessionClient
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PROTOCOL_VERSION,
    REQUEST_CANCELLED,
    RESOURCE_NOT_FOUND,
    AuthenticateParams,
    CancelRequestParams,
    Empty,
    ForkSessionParams,
    Implementation,
    InitializeParams,
    InitializeResult,
    ListSessionsParams,
    LoadSessionParams,
    NewSessionParams,
    PromptParams,
    PromptResult,
    RequestId,
    SessionParams,
    SetConfigOptionParams,
    SetConfigOptionResult,
    SetModeParams,
    SteeringResult,
)
from greenroom.protocol.events import (
    Completed,
    SessionEvent,
    StatusName,
    ToolProgress,
    ToolResult,
    TurnEnd,
    TurnStart,
)
from greenroom.protocol.mcp import McpStatus
from greenroom.runtime import Runtime
from greenroom.session import SESSION_EVENT, Session
from greenroom.session.persistence import (
    Interruption,
)
from greenroom.supervisor import Scope, Supervisor
from greenroom.tools.bash.tools import kill_owned
from greenroom.tools.mcp import MCP_PROMPTS, MCP_STATUS, McpPrompts, McpServerError

__all__ = [
    "LIST_PAGE",
    "SERVER_WAIT",
    "TEARDOWN_GRACE",
    "AcpConnection",
    "RpcError",
    "serve_connection",
    "servers_from_acp",
]

logger = logging.getLogger("greenroom.acp")

INITIALIZED: Final = InitializeResult(
    PROTOCOL_VERSION, Implementation("greenroom", greenroom.__version__)
)


class AcpConnection:
    """The state of one connection; `serve_connection` drives it."""

    def __init__(
        self,
        runtime: Runtime,
        owner: Supervisor,
        nursery: trio.Nursery,
        outgoing: trio.MemorySendChannel[bytes],
        interrupted: Interruption = "close",
    ) -> None:
        self.runtime = runtime
        #: What a load or resume does with a turn a crash cut (`AgentFactory.resume`).
        self.interrupted: Interruption = interrupted
        self.owner = owner
        self.nursery = nursery
        self.outbox = Outbox(outgoing)
        self.persistence = runtime.persistence
        #: Every session of the connection, from the request that starts it to its close.
        self.sessions: dict[str, SessionRecord] = {}
        self.subagents = SubagentProgress(self.outbox.update)
        self.closed = False
        self.scope = Scope("acp connection")
        self._in_flight: dict[RequestId, trio.CancelScope] = {}
        #: What a request may ask: `initialize` only, until it is answered; then `ROUTES`.
        self._routes: Mapping[str, Inline | Waiting] = UNINITIALIZED
        self._files = (False, False)  # the client's fs.readTextFile, fs.writeTextFile
        self._ask = False  # the client's elicitation in form mode: ask_user is offered
        #: Each session's slash commands (`commands.SessionCommands`), from its start on.
        self.commands: dict[str, SessionCommands] = {}
        #: Server prompts being got for a ``/<server>:<prompt>``: their session, their scope.
        self._fetching: dict[RequestId, tuple[str, trio.CancelScope]] = {}
        self.live = LiveOutput(self.outbox)
        self._pacing = trio.CancelScope()  # the live output's task, cancelled at teardown
        self.presenter = Presenter(
            list(runtime.models),
            {name: getattr(model, "context_window", 0) for name, model in runtime.models.items()},
            runtime.bash.sandboxes.protections,
        )
        runtime.hooks.on(SESSION_EVENT, self._on_event, scope=self.scope)
        runtime.hooks.on(MCP_STATUS, self._on_server, scope=self.scope)
        runtime.hooks.on(SUBAGENT_STARTED, self._on_subagent, scope=self.scope)
        runtime.hooks.on(AGENT_STATUS, self._on_status, scope=self.scope)
        runtime.hooks.on(AGENT_TOOL_PROGRESS, self._on_progress, scope=self.scope)
        runtime.hooks.on(MCP_PROMPTS, self._on_prompts, scope=self.scope)
        nursery.start_soon(self._pace)

    # -- frames in ---------------------------------------------------------------------

    def handle_frame(self, frame: frames.Frame) -> None:
        """Act on one frame: a request is answered exactly once, a notification never, a
        reply (read or not) settles the request of ours it answers; nothing a frame holds
        can raise out of here."""
        outbox = self.outbox
        if isinstance(frame, frames.Bad):
            outbox.fail(frame.id, frame.code, frame.message)
        elif isinstance(frame, frames.Request):
            try:
                self._request(frame.id, frame.method, frame.params)
            except RpcError as exc:
                outbox.fail(frame.id, exc.code, exc.message)
            except Exception as exc:  # one request's failure never ends the connection
                logger.warning("request %s failed", frame.method, exc_info=True)
                outbox.fail(frame.id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        elif isinstance(frame, frames.Notification):
            try:
                notification = NOTIFICATIONS.get(frame.method)
                if notification is not None:
                    notification.run(self, decode(notification.params, frame.params))
                elif not frame.method.startswith("_"):
                    logger.info("ignored unknown notification %s", frame.method)
            except RpcError as exc:
                logger.info("dropped notification %s: %s", frame.method, exc.message)
            except Exception:
                logger.warning("notification %s failed", frame.method, exc_info=True)
        elif isinstance(frame, frames.Reply):  # a reply to a request greenroom sent
            error = None if frame.error is msgspec.UNSET else bytes(frame.error).decode()
            result = None if frame.result is msgspec.UNSET else frame.result
            outbox.requests.reply(frame.id, result, error)
        else:  # a reply that could not be read: its request fails, saying why
            outbox.requests.reply(frame.id, None, frame.why)

    def _request(self, request_id: RequestId, method: str, raw: msgspec.Raw) -> None:
        route = self._routes.get(method)
        if route is not None:
            params = decode(route.params, raw)
            if isinstance(route, Inline):
                route.run(self, request_id, params)
            else:
                self._spawn(request_id, route.run(self, params))
            return
        if self._routes is not ROUTES and (method in ROUTES or method in NOTIFICATIONS):
            raise RpcError(
                INVALID_REQUEST, f"{method} before initialize: the client must initialize first"
            )
        notification = NOTIFICATIONS.get(method)
        if notification is None:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")
        # Notifications by the spec; sent as a request, they act alike and get an answer.
        notification.run(self, decode(notification.params, raw))
        self.outbox.respond(request_id, Empty())

    def _spawn(self, request_id: RequestId, handler: Coroutine[object, object, object]) -> None:
        scope = trio.CancelScope()
        self._in_flight[request_id] = scope

        async def run() -> None:
            outbox = self.outbox
            try:
                with scope:
                    result = await handler
                    if isinstance(result, Started):
                        # Installed in the step its answer is sent, so its notices,
                        # told here, always follow that answer.
                        outbox.respond(request_id, result.answer)
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
                self._in_flight.pop(request_id, None)

        self.nursery.start_soon(run)

    # -- inline: order matters -------------------------------------------------------------

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
        self.outbox.respond(request_id, INITIALIZED)
        self._routes = ROUTES

    def _authenticate(self, request_id: RequestId, params: AuthenticateParams) -> None:
        # `authMethods` is empty: no method id is one of ours, and none is needed.
        raise RpcError(
            INVALID_PARAMS,
            f"invalid params: methodId {params.method_id!r} is not an advertised auth method"
            " (this agent advertises none: it needs no authentication)",
        )

    def _prompt(self, request_id: RequestId, params: PromptParams) -> None:
        record = self.live_record(params.session_id)
        if request_id in record.prompts:  # its answer would be the other's, sent once
            raise RpcError(
                INVALID_REQUEST, f"request id {request_id!r} is already a prompt's in flight"
            )
        agent = record.handle.agent  # type: ignore[union-attr]
        content = prompt_content(params.prompt, agent.session.header)
        command = None
        if isinstance(content, str):
            command = self._commands(record.session_id).parse(content.strip())
        if command is not None:
            self._run(request_id, record, agent, command)
            return
        self._in_flight_prompt(record, request_id, agent.send(content))

    def _run(
        self, request_id: RequestId, record: SessionRecord, agent: Agent, command: Command
    ) -> None:
        """Run a slash command: ``/compact`` compacts, ``/mode`` and ``/model`` change the
        setting (answered at once), a server's prompt is got and sent as the prompt."""
        if command.name == COMPACT:
            last_turn = agent.session.last_turn
            try:
                agent.compact(command.rest or None)
            except ValueError as exc:  # instructions past the cap: nothing is asked
                raise RpcError(INVALID_PARAMS, f"invalid params: /compact: {exc}") from None
            self.nursery.start_soon(self._compacted, request_id, agent, last_turn)
        elif command.name in (MODE, MODEL):
            self._configure(record.session_id, command.name, command.rest)
            self.outbox.respond(request_id, PromptResult("end_turn"))
        else:
            self.nursery.start_soon(self._prompted, request_id, record, agent, command)

    async def _prompted(
        self, request_id: RequestId, record: SessionRecord, agent: Agent, command: Command
    ) -> None:
        """Get a server's prompt and send its messages' text as the prompt; a prompt the
        server cannot give is an error answer naming why (nothing is sent)."""
        offered, prompt = self._commands(record.session_id).prompt(command.name)
        scope = self._fetching[request_id] = (record.session_id, trio.CancelScope())
        try:
            with scope[1]:  # a cancel of the session or the request withdraws it
                texts = await offered.get(prompt.name, arguments(prompt, command.rest))
        except ValueError as exc:
            self.outbox.fail(request_id, INVALID_PARAMS, f"invalid params: /{command.name}: {exc}")
            return
        except McpServerError as exc:
            self.outbox.fail(request_id, INTERNAL_ERROR, f"/{command.name}: {exc}")
            return
        finally:
            del self._fetching[request_id]
        if scope[1].cancelled_caught:
            self.outbox.respond(request_id, PromptResult("cancelled"))
            return
        text = "\n\n".join(t for t in texts if t.strip())
        if not text:
            self.outbox.fail(request_id, INTERNAL_ERROR, f"/{command.name}: the prompt is empty")
            return
        if self.sessions.get(record.session_id) is not record:  # closed meanwhile
            self.outbox.respond(request_id, PromptResult("cancelled"))
            return
        try:
            sent = agent.send(text)
        except AgentDisposed:
            self.outbox.respond(request_id, PromptResult("cancelled"))
            return
        self._in_flight_prompt(record, request_id, sent)

    def _in_flight_prompt(
        self, record: SessionRecord, request_id: RequestId, prompt: Prompt[Any]
    ) -> None:
        """Answer `request_id` from `prompt` the moment it settles (in the agent's task, so
        before its next turn can start and show anything), unless its session went first."""
        entry = record.prompts[request_id] = InFlight(request_id, prompt)

        def answer(answer: Answer[Any]) -> None:
            if record.prompts.pop(request_id, None) is None:
                return  # answered ``cancelled`` when its session was closed
            try:
                self.outbox.respond(request_id, prompt_result(answer, entry.cancelled))
            except RpcError as exc:
                self.outbox.fail(request_id, exc.code, exc.message)

        prompt.on_settled(answer)

    async def _compacted(self, request_id: RequestId, agent: Agent, last_turn: int) -> None:
        """Answer a ``/compact`` once the agent is idle again: by its compaction turn's end
        (``end_turn`` when nothing needed one)."""
        await agent.when_idle()
        for event in reversed(agent.session.events):
            if isinstance(event, TurnEnd) and event.turn > last_turn:
                completed = isinstance(event.reason, Completed)
                self.outbox.respond(
                    request_id, PromptResult("end_turn" if completed else "cancelled")
                )
                return
            if isinstance(event, TurnStart) and event.turn <= last_turn:
                break
        self.outbox.respond(request_id, PromptResult("end_turn"))

    def _steer(self, request_id: RequestId, params: PromptParams) -> None:
        agent = self._agent(params.session_id)
        running = agent.status == "running"
        agent.steer(prompt_text(params.prompt))
        self.outbox.respond(request_id, SteeringResult("injected" if running else "startedNewTurn"))

    def _set_mode(self, request_id: RequestId, params: SetModeParams) -> None:
        self._configure(params.session_id, "mode", params.mode_id)
        self.outbox.respond(request_id, Empty())

    def _set_config_option(self, request_id: RequestId, params: SetConfigOptionParams) -> None:
        session = self._configure(params.session_id, params.config_id, params.value)
        self.outbox.respond(
            request_id, SetConfigOptionResult(self.presenter.config_options(session))
        )

    def _configure(self, session_id: str, key: str, value: str) -> Session:
        agent = self._agent(session_id)
        try:
            agent.configure(key, value)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
        return agent.session

    def _cancel(self, params: SessionParams) -> None:
        record = self.sessions.get(params.session_id)
        if record is None or record.handle is None:
            return  # a notification: nothing to answer
        self._cancel_session(record)

    def _cancel_session(self, record: SessionRecord) -> None:
        assert record.handle is not None
        record.handle.agent.cancel("session/cancel")  # what was queued settles at once
        for entry in record.prompts.values():  # each unsettled: a settled one is answered
            entry.cancelled = True
        self._stop_fetching(record.session_id)

    def _stop_fetching(self, session_id: str) -> None:
        """Withdraw the server prompts being got for the session's commands."""
        for fetching, scope in self._fetching.values():
            if fetching == session_id:
                scope.cancel()

    def _cancel_request(self, params: CancelRequestParams) -> None:
        request_id = params.request_id
        fetching = self._fetching.get(request_id)
        if fetching is not None:
            fetching[1].cancel()
            return
        for record in self.sessions.values():
            entry = record.prompts.get(request_id)
            if entry is None:
                continue
            # A prompt still queued is withdrawn alone; the running one is the
            # session's cancel (queue-aware: what waits behind it is dropped too).
            assert record.handle is not None
            if not record.handle.agent.withdraw(entry.prompt.id):
                self._cancel_session(record)
            return
        scope = self._in_flight.get(request_id)
        if scope is not None:
            scope.cancel(reason="$/cancel_request")

    # -- sessions --------------------------------------------------------------------------------

    def live_record(self, session_id: str) -> SessionRecord:
        """The record of a live session here; -32002 for any other id."""
        record = self.sessions.get(session_id)
        if record is None or record.handle is None:
            raise RpcError(RESOURCE_NOT_FOUND, f"unknown session {session_id!r}")
        return record

    def _agent(self, session_id: str) -> Agent:
        handle = self.live_record(session_id).handle
        assert handle is not None
        return handle.agent

    def client_for(self, session_id: str) -> SessionClient:
        """What the tools of `session_id` get from this client (`client.session_client`)."""
        read, write = self._files
        return session_client(
            self.outbox.requests, session_id, read=read, write=write, ask=self._ask
        )

    def require_open(self) -> None:
        """Refuse a session start once the teardown began."""
        if self.closed:
            raise RpcError(INTERNAL_ERROR, "the connection is closing")

    def _on_event(self, session: Session, event: SessionEvent) -> None:
        record = self.sessions.get(session.id)
        if record is None or record.handle is None:
            if self.subagents:
                self.subagents.on_event(session.id, event)
            return
        if type(event) is ToolResult:
            self.live.drop(session.id, event.call_id)  # no snapshot after the result
        for update in self.presenter.present(session, event, replay=False):
            record.show(self.outbox, update)

    def _on_progress(self, agent: Agent, progress: ToolProgress) -> None:
        record = self.sessions.get(agent.session.id)
        if record is not None and record.handle is not None and record.held is None:
            self.live.show(record.session_id, progress)

    async def _pace(self) -> None:
        with self._pacing:
            await self.live.run()

    def _commands(self, session_id: str) -> SessionCommands:
        commands = self.commands.get(session_id)
        if commands is None:
            commands = self.commands[session_id] = SessionCommands(list(self.runtime.models))
        return commands

    def _offer_commands(self, session_id: str) -> None:
        self.outbox.update(session_id, self._commands(session_id).update())

    def _on_prompts(self, agent: Agent, prompts: McpPrompts) -> None:
        """A server of a session here offers other prompts: the commands change; told now
        if the session was announced, else with its announcement."""
        record = self.sessions.get(agent.session.id)
        if record is None:
            return
        if self._commands(record.session_id).offer(prompts) and record.notices is None:
            self._offer_commands(record.session_id)

    def _on_subagent(self, parent: Agent, call_id: str, child: Agent) -> None:
        record = self.sessions.get(parent.session.id)
        if record is not None and record.handle is not None:
            self.subagents.follow(parent.session.id, call_id, child.session.id)

    def _on_status(self, agent: Agent, status: StatusName) -> None:
        # A child can end without the turn/end its progress forgets it at: a cancel
        # that dropped its turn before it began, a disposal before its prompt.
        if status == "disposed":
            self.subagents.forget(agent.session.id)
            record = self.sessions.get(agent.session.id)
            if record is not None and record.handle is not None and record.handle.agent is agent:
                self._gone(record)

    def _gone(self, record: SessionRecord) -> None:
        """A session of the client's ended under it, not by a request of its own nor the
        teardown (both drop the record first): another node asked for it (a hand-off).
        Its prompts are answered ``cancelled``, the client told; loading it again asks
        for it back."""
        if self.closed:
            return
        del self.sessions[record.session_id]
        record.abandon(self.outbox)
        self.outbox.tell(
            record.session_id,
            "This session was handed to another node that asked for it; load it again to"
            " take it back.",
        )

    def _on_server(self, agent: Agent, status: McpStatus) -> None:
        """Tell the editor when a server of one of its sessions fails, gives up, or is back."""
        record = self.sessions.get(agent.session.id)
        if record is None:
            return  # another connection's session
        before = status.previous
        quiet = status.state == before or (status.state == "ready" and before == "starting")
        slow = bool(status.message) and "starting" in (status.state, before)
        if quiet and not slow:  # a slow start and its end are told
            return
        record.notice(self.outbox, status.describe() + "\n")

    async def release(self, record: SessionRecord) -> None:
        """Answer its prompts ``cancelled``, kill its background bash tasks, dispose its agent."""
        self.commands.pop(record.session_id, None)
        self._abandon(record)
        assert record.handle is not None
        await record.handle.dispose()

    def _abandon(self, record: SessionRecord) -> None:
        """Answer its prompts ``cancelled`` and start killing its bash tasks, at once."""
        self._stop_fetching(record.session_id)
        record.abandon(self.outbox)
        kill_owned(self.runtime.bash, record.session_id)

    async def teardown(self) -> None:
        """Close: every session released, all at once. Memoised by ``closed``.

        Every prompt is answered and every task killed first, at once, so a
        dispose that overruns the teardown's grace cannot leave them behind;
        then the agents are disposed together, each in its own order (a
        session whose MCP server or bash task ignores SIGTERM costs its kill
        grace once, not once per session). A session still starting is left
        to its request, which disposes it (`_go_live`).
        """
        if self.closed:
            return
        self.closed = True
        self._pacing.cancel()
        self.outbox.requests.close()  # a question open to the client is answered no more
        records = [record for record in self.sessions.values() if record.handle is not None]
        for record in records:
            del self.sessions[record.session_id]
        try:
            for record in records:
                self._abandon(record)
            async with trio.open_nursery() as disposing:
                for record in reversed(records):
                    assert record.handle is not None
                    disposing.start_soon(record.handle.dispose)
        finally:
            await self.scope.close()


class Inline(NamedTuple):
    """A request acted on in the reader, in arrival order; it answers itself."""

    params: type[msgspec.Struct]
    run: Callable[[AcpConnection, RequestId, Any], None]


class Waiting(NamedTuple):
    """A request run in a task of its own, answered with what it returns."""

    params: type[msgspec.Struct]
    run: Callable[[AcpConnection, Any], Coroutine[object, object, object]]


class Acting(NamedTuple):
    """A notification, acted on in the reader; as a request it is answered ``{}``."""

    params: type[msgspec.Struct]
    run: Callable[[AcpConnection, Any], None]


#: Each method served: its params Struct and its handler.
ROUTES: Final[dict[str, Inline | Waiting]] = {
    "initialize": Inline(InitializeParams, AcpConnection._initialize),
    "authenticate": Inline(AuthenticateParams, AcpConnection._authenticate),
    "session/prompt": Inline(PromptParams, AcpConnection._prompt),
    "_session/steering": Inline(PromptParams, AcpConnection._steer),
    "session/set_mode": Inline(SetModeParams, AcpConnection._set_mode),
    "session/set_config_option": Inline(SetConfigOptionParams, AcpConnection._set_config_option),
    "session/new": Waiting(NewSessionParams, starts.new),
    "session/load": Waiting(LoadSessionParams, starts.load),
    "session/resume": Waiting(LoadSessionParams, starts.resume),
    "session/fork": Waiting(ForkSessionParams, starts.fork),
    "session/list": Waiting(ListSessionsParams, starts.list_sessions),
    "session/close": Waiting(SessionParams, starts.close),
    "session/delete": Waiting(SessionParams, starts.delete),
}
#: The only method served before `initialize` is answered: any other known one is -32600.
UNINITIALIZED: Final[dict[str, Inline | Waiting]] = {"initialize": ROUTES["initialize"]}
#: Each notification acted on (any other is ignored).
NOTIFICATIONS: Final[dict[str, Acting]] = {
    "session/cancel": Acting(SessionParams, AcpConnection._cancel),
    "$/cancel_request": Acting(CancelRequestParams, AcpConnection._cancel_request),
}


# -- the loop --------------------------------------------------------------------------------------

#: Seconds the teardown may take (disposing agents flushes their sessions) before it is cut.
TEARDOWN_GRACE: Final = 5.0


async def serve_connection(
    runtime: Runtime, stream: trio.abc.Stream, *, interrupted: Interruption = "close"
) -> None:
    """Serve ACP on `stream` until the peer closes it (or the caller cancels), then tear down.

    ``interrupted="continue"``: a session loaded or resumed whose last turn a crash
    cut has that turn carried on (docs/semantics.md, "Durable turns").

    Agents of the connection are owned by a supervisor of its own: when this
    returns, none is left registered and no session of it is in the store.
    """
    frames_in, frames_out = trio.open_memory_channel[bytes](math.inf)
    # The writer outlives a cancel of the connection (a signal): the teardown's
    # answers must still reach the peer. It stops at the end of its channel, or
    # when its grace after the teardown runs out.
    writing = trio.CancelScope(shield=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_frames, frames_out, stream, writing)
        try:
            # Requests still in flight at the end (a load racing the teardown) finish
            # inside `handlers`, so their answers are written before the writer stops.
            async with trio.open_nursery() as handlers:
                try:
                    # Sessions are independent: stopped together, in one grace.
                    async with Supervisor(name="acp-connection", stop_together=True) as owner:
                        connection = AcpConnection(runtime, owner, handlers, frames_in, interrupted)
                        try:
                            await frames.read_lines(stream, connection.handle_frame)
                        finally:
                            with trio.CancelScope(shield=True), trio.move_on_after(TEARDOWN_GRACE):
                                await connection.teardown()
                finally:
                    handlers.cancel_scope.deadline = trio.current_time() + TEARDOWN_GRACE
        finally:
            frames_in.close()
            writing.deadline = trio.current_time() + TEARDOWN_GRACE
