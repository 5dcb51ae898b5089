"""The requests that start, list and end a connection's sessions: new, load, resume, fork,
list, close, delete.

Each runs in a task of its own (`connection.WaitingRoute`) and returns its answer. One
that starts a session returns `SessionStarted`: the session is live under its
record (`table.SessionTable.go_live`: the record is made before the start, so that
a second load of the same id is refused meanwhile), and the connection sends the
answer, then what the session's servers did meanwhile, then the updates of a turn
a load carries on. A session that comes live once the teardown began is disposed
and the request fails. What is refused is an `RpcError`, answered as the protocol
says.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, NamedTuple

from greenroom.acp.access import Principal
from greenroom.acp.outbox import Outbox
from greenroom.acp.params import (
    RpcError,
    check_cwd,
    check_roots,
    offset,
    servers_from_acp,
)
from greenroom.acp.presenter import Presenter, iso_time
from greenroom.acp.shared import Attachment, Attachments
from greenroom.acp.table import LiveHandle, SessionRecord, SessionTable
from greenroom.actors.decisions import open_decisions
from greenroom.actors.life import AgentHandle, Owner
from greenroom.actors.prompt import Prompt
from greenroom.actors.types import AgentOptions, SessionClient, Titles
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    AgentMessageChunk,
    AvailableCommandsUpdate,
    ConfigOptionUpdate,
    CurrentModeUpdate,
    Empty,
    ForkSessionParams,
    ListSessionsParams,
    ListSessionsResult,
    LoadSessionParams,
    LoadSessionResult,
    NewSessionParams,
    NewSessionResult,
    PlanUpdate,
    SessionInfo,
    SessionInfoUpdate,
    SessionParams,
    SessionUpdate,
    TextBlock,
    UsageUpdate,
)
from greenroom.protocol.events import (
    DecisionRequested,
    SessionEvent,
    SteeringMessage,
    TurnEnd,
    TurnResumed,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.mcp import McpServer
from greenroom.runtime import Runtime
from greenroom.session.persistence import (
    HandOff,
    Interruption,
    PersistenceError,
    SessionLocked,
    SessionNotFound,
)
from greenroom.session.transcript import describe_decision

__all__ = ["LIST_PAGE", "SERVER_WAIT", "SessionStarted", "SessionStarts"]

#: Seconds a load under ``greenroom serve`` waits for another node to let go of a session it
#: holds (PostgreSQL's hand-off: at once when idle, after its turn when busy).
HAND_OFF_WAIT: Final = 30.0
#: Sessions per page of ``session/list``.
LIST_PAGE: Final = 50
#: Seconds ``session/new`` and ``load`` wait for the session's MCP servers before they
#: answer; a server not ready by then goes on starting (the editor is told).
SERVER_WAIT: Final = 2.0


#: The updates that say a session's state (each replaces the one before): what a load with
#: ``_meta.greenroom.after`` sends again of what came before, the latest of each kind.
STATE_UPDATES: Final[frozenset[type[SessionUpdate]]] = frozenset(
    {
        CurrentModeUpdate,
        ConfigOptionUpdate,
        SessionInfoUpdate,
        UsageUpdate,
        PlanUpdate,
        AvailableCommandsUpdate,
    }
)


def _after(meta: dict[str, Any] | None) -> int | None:
    """``_meta.greenroom.after`` of a load: the last log event the client has (None: it
    has none, replay all); -32602 for anything but an integer >= -1."""
    mine = (meta or {}).get("greenroom")
    if not isinstance(mine, dict) or "after" not in mine:
        return None
    after = mine["after"]
    if type(after) is not int or after < -1:
        raise RpcError(
            INVALID_PARAMS,
            f"invalid params: _meta.greenroom.after must be the seq of a log event (an"
            f" integer >= -1), got {str(after)[:40]!r}",
        )
    return after


def unasked(session_id: str, request: DecisionRequested) -> str:
    """What a client that cannot be asked questions is told of one its session's turn is
    parked on: the question, and how to answer it from elsewhere."""
    return (
        f"The parked turn asks: {describe_decision(request)}. This editor offers no"
        " elicitation, so it is not asked here: the turn waits in the session's log until"
        f" it is answered (greenroom sessions decide {session_id} {request.decision_id}"
        " ANSWER); load the session again after."
    )


class SessionStarted(NamedTuple):
    """What a request that starts a session returns: its answer, then the session's notices."""

    answer: object
    record: SessionRecord


class SessionStarts:
    """The requests that start, list and end the sessions of one connection; each holds
    the connection's `SessionTable` and returns its answer (see the module docstring).

    ``interrupted``: what a load or resume does with a turn a crash cut
    (`AgentFactory.resume`). ``client_for`` gives what a session's tools get
    from the client (`AcpConnection.client_for`). ``principal``: who the client
    is (``greenroom serve`` with tokens): the sessions it makes are its own, and
    one it may not see (`Principal.sees`) is refused as unknown by load,
    resume, fork and delete, and left out of list; None sees every session.
    ``attachments``: the sessions this connection shares with others
    (``greenroom serve``, `shared.Attachments`): a load or resume of one live
    there attaches to it, and one live on another node (a `HandOff` store) is
    asked for, waiting up to `HAND_OFF_WAIT`; None (stdio): the connection owns
    its sessions, and one live elsewhere is refused. ``titles``: how the title of a
    session it starts is written when its log sets none (`AgentOptions.titles`).
    """

    __slots__ = (
        "_attachments",
        "_client_for",
        "_hand_off",
        "_interrupted",
        "_options",
        "_outbox",
        "_owner",
        "_persistence",
        "_presenter",
        "_principal",
        "_runtime",
        "_table",
    )

    def __init__(
        self,
        table: SessionTable,
        runtime: Runtime,
        owner: Owner,
        presenter: Presenter,
        outbox: Outbox,
        client_for: Callable[[str], SessionClient],
        interrupted: Interruption,
        principal: Principal | None = None,
        attachments: Attachments | None = None,
        titles: Titles = "prompt",
    ) -> None:
        self._table = table
        self._principal = principal
        self._attachments = attachments
        #: A session live on another node is asked for (serve, on a store that hands off).
        self._hand_off = attachments is not None and isinstance(runtime.persistence, HandOff)
        self._runtime = runtime
        self._persistence = runtime.persistence
        self._owner = owner
        self._presenter = presenter
        self._outbox = outbox
        self._client_for = client_for
        self._interrupted: Interruption = interrupted
        self._options = None if titles == "prompt" else AgentOptions(titles=titles)

    async def new(self, params: NewSessionParams) -> SessionStarted:
        """``session/new``: a fresh session (a new id), created live here."""
        check_cwd(params.cwd, must_exist=True)
        check_roots(params.additional_directories)
        servers = servers_from_acp(params.mcp_servers)
        self._table.require_open()
        session_id = str(uuid.uuid4())
        record = await self._table.go_live(
            session_id,
            lambda: self._live(
                session_id,
                self._client_for(session_id),
                lambda owner, client: self._runtime.agents.create(
                    agent_id=session_id,
                    session_id=session_id,
                    cwd=params.cwd,
                    additional_directories=params.additional_directories,
                    options=self._options,
                    owner=owner,
                    client=client,
                    mcp_servers=servers,
                    wait_for_servers=SERVER_WAIT,
                    principal=None if self._principal is None else self._principal.name,
                ),
            ),
        )
        return self._new_session_result(record)

    async def load(self, params: LoadSessionParams) -> SessionStarted:
        """``session/load``: a stored session taken live here, its log replayed first."""
        return await self._take_stored(params, replay=True)

    async def resume(self, params: LoadSessionParams) -> SessionStarted:
        """``session/resume``: a stored session taken live here, not replayed."""
        return await self._take_stored(params, replay=False)

    async def _take_stored(self, params: LoadSessionParams, *, replay: bool) -> SessionStarted:
        session_id = params.session_id
        after = _after(params.meta) if replay else None
        self._check_stored_id(session_id)
        await self._check_seen(session_id)
        check_cwd(params.cwd, must_exist=False)
        check_roots(params.additional_directories)
        servers = servers_from_acp(params.mcp_servers)
        self._table.require_open()

        asks = False  # whether this client can be asked questions (ask_user)

        async def start() -> LiveHandle:
            nonlocal asks
            client = self._client_for(session_id)
            asks = client.questions is not None
            # The roots are the ones sent now (none if omitted), never the stored ones.
            handle = await self._live(
                session_id,
                client,
                lambda owner, asked: self._resume_stored(
                    session_id, owner, asked, servers, params.additional_directories
                ),
            )
            stored_cwd = handle.agent.session.header.cwd
            if stored_cwd != params.cwd:
                await handle.dispose()
                raise RpcError(
                    INVALID_PARAMS,
                    f"session {session_id!r} belongs to cwd {stored_cwd!r}, not {params.cwd!r}",
                )
            return handle

        record = await self._table.go_live(session_id, start)
        assert record.handle is not None
        session = record.handle.agent.session
        if not asks:
            for request in open_decisions(session.events):
                if request.kind == "question":
                    told = AgentMessageChunk(TextBlock(unasked(session_id, request)))
                    record.notice(self._outbox, told)
        presenter = self._presenter
        events = session.events
        stored = len(events)
        if record.handle.resumed is not None:  # a cut turn goes on: shown after the answer
            stored = next(
                (i for i in range(len(events) - 1, -1, -1) if type(events[i]) is TurnResumed),
                stored,
            )
            record.held = [
                update
                for event in events[stored:]
                for update in presenter.present(session, event, replay=False)
            ]
        if replay and session.blobs_wanted:  # its prompts' images, to send back
            with contextlib.suppress(PersistenceError):  # then each is a marker
                await session.hold_blobs({})
        if replay:  # the log as it was stored: the cut turn as it stands
            shown = 0
            if after is not None:  # the client has up to `after`: only the state again
                shown = min(after + 1, stored)
                state: dict[type[SessionUpdate], tuple[SessionUpdate, int]] = {}
                for event in events[:shown]:
                    for update in presenter.present(session, event, replay=True):
                        if type(update) in STATE_UPDATES:
                            state[type(update)] = (update, event.seq)
                for update, seq in sorted(state.values(), key=lambda kept: kept[1]):
                    self._outbox.update(session_id, update, seq)
            for event in events[shown:stored]:
                for update in presenter.present(session, event, replay=True):
                    self._outbox.update(session_id, update, event.seq)
        answer = LoadSessionResult(presenter.modes(session), presenter.config_options(session))
        return SessionStarted(answer, record)

    async def fork(self, params: ForkSessionParams) -> SessionStarted:
        """A new session holding the stored one's log, taken live here (not replayed: the
        client has the original's history): the whole log, or with a `messageId` up to the
        end of the turn that holds that message (-32602 for a message the log does not
        have, or whose turn has not ended)."""
        self._check_stored_id(params.session_id)
        await self._check_seen(params.session_id)
        check_cwd(params.cwd, must_exist=True)
        check_roots(params.additional_directories)
        servers = servers_from_acp(params.mcp_servers)
        self._table.require_open()
        session_id = str(uuid.uuid4())
        assert self._persistence is not None  # `_check_stored_id` refused it otherwise
        try:
            at_turn = None
            if params.message_id is not None:
                _header, events = await self._persistence.load(params.session_id)
                at_turn = turn_of(events, params.session_id, params.message_id)
            await self._runtime.agents.fork(
                params.session_id,
                session_id,
                at_turn=at_turn,
                cwd=params.cwd,
                additional_directories=params.additional_directories,
                principal=None if self._principal is None else self._principal.name,
            )
        except SessionNotFound as exc:
            raise RpcError(RESOURCE_NOT_FOUND, str(exc)) from None
        except PersistenceError as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None
        record = await self._table.go_live(
            session_id,
            lambda: self._live(
                session_id,
                self._client_for(session_id),
                lambda owner, client: self._resume_stored(session_id, owner, client, servers),
            ),
        )
        return self._new_session_result(record)

    def _new_session_result(self, record: SessionRecord) -> SessionStarted:
        assert record.handle is not None
        session = record.handle.agent.session
        answer = NewSessionResult(
            record.session_id,
            self._presenter.modes(session),
            self._presenter.config_options(session),
        )
        return SessionStarted(answer, record)

    def _check_stored_id(self, session_id: str) -> None:
        """Refuse, as the protocol answers it, a stored session this bridge could not read."""
        if self._persistence is None:
            raise RpcError(INTERNAL_ERROR, "session persistence is not configured")
        try:
            self._persistence.check_session_id(session_id)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"invalid params: sessionId: {exc}") from None

    async def _check_seen(self, session_id: str) -> None:
        """Refuse (-32002, ``unknown session``) a session the principal may not see, or
        that is not stored: both alike, so a refusal tells nothing of another's session."""
        if not await self._seen(session_id):
            raise RpcError(RESOURCE_NOT_FOUND, f"unknown session {session_id!r}")

    async def _seen(self, session_id: str) -> bool:
        """Whether the principal may see `session_id` (and it is stored, when there is a
        principal to check). Only its header is read: nothing of it is touched."""
        principal, persistence = self._principal, self._persistence
        if principal is None or persistence is None:
            return True
        record = self._table.records.get(session_id)
        if record is not None and record.handle is not None:
            return True  # made or loaded by this connection: seen already
        try:
            header, _ = await persistence.load(session_id)
        except SessionNotFound:
            return False
        except PersistenceError as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None
        return principal.sees(header.principal)

    async def _live(
        self,
        session_id: str,
        client: SessionClient,
        start: Callable[[Owner, SessionClient], Awaitable[AgentHandle]],
    ) -> LiveHandle:
        """Start `session_id` with `start` (given its owner and the client its agent asks:
        `client`, this connection's, or the session's shared one), or, where sessions are
        shared, attach `client` to it if it is live in this server."""
        if self._attachments is None:
            return await start(self._owner, client)
        table = self._table

        def prompts() -> Iterable[Prompt[Any]]:
            record = table.records.get(session_id)
            return () if record is None else (entry.prompt for entry in record.prompts.values())

        principal = None if self._principal is None else self._principal.name
        return await self._attachments.attach(session_id, start, client, prompts, principal)

    async def _resume_stored(
        self,
        session_id: str,
        owner: Owner,
        client: SessionClient,
        servers: list[McpServer],
        additional_directories: list[str] | None = None,
    ) -> AgentHandle:
        """Take a stored session live here, owned by this connection (with the stored
        additional roots unless others are given)."""
        try:
            return await self._runtime.agents.resume(
                agent_id=session_id,
                session_id=session_id,
                options=self._options,
                owner=owner,
                client=client,
                mcp_servers=servers,
                wait_for_servers=SERVER_WAIT,
                additional_directories=additional_directories,
                interrupted=self._interrupted,
                take_over="ask" if self._hand_off else "refuse",
                wait=HAND_OFF_WAIT if self._hand_off else 0.0,
            )
        except SessionNotFound as exc:
            raise RpcError(RESOURCE_NOT_FOUND, str(exc)) from None
        except PersistenceError as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None

    async def list_sessions(self, params: ListSessionsParams) -> ListSessionsResult:
        """Most recently changed first, `LIST_PAGE` at a time; the cursor is an offset."""
        if self._persistence is None:
            return ListSessionsResult([])
        stored = [
            s
            for s in await self._persistence.list()
            if s.header.cwd is not None
            and params.cwd in (None, s.header.cwd)
            and (self._principal is None or self._principal.sees(s.header.principal))
        ]
        start = offset(params.cursor)
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

    async def delete(self, params: SessionParams) -> Empty:
        """Idempotent: a session open here is closed first; one live elsewhere is refused."""
        self._check_stored_id(params.session_id)
        if not await self._seen(params.session_id):
            return Empty()  # as for a session that is not stored
        assert self._persistence is not None
        record = self._table.records.get(params.session_id)
        if record is not None and record.handle is not None:
            await self._table.release(record)
        try:
            await self._persistence.delete(params.session_id)
        except SessionLocked as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None
        return Empty()

    async def close(self, params: SessionParams) -> Empty:
        """``session/close``: a live session here released (its log stays stored); its
        turn cancelled unless another connection holds it too."""
        record = self._table.live(params.session_id)
        if isinstance(record.handle, Attachment) and not record.handle.shared:
            # An attachment's last dispose lets a turn finish: cancelled, it is waited for
            # here, so the session ends with this answer (as over stdio), and no longer
            # counts as its principal's once the client is told it is closed.
            self._table.cancel(record)
            await record.handle.agent.when_idle()
        await self._table.release(record)
        return Empty()


#: A turn's or a step's number as greenroom writes it in a reply's message id.
_NUMBER: Final = re.compile(r"[1-9][0-9]{0,9}")


def turn_of(events: list[SessionEvent], session_id: str, message_id: str) -> int:
    """The ended turn of `session_id`'s log that holds the message `message_id`: a prompt's
    own id (a user or steering message), or an agent reply's, ``<session>/<turn>/<step>``
    (as `Presenter` names them). Raises -32602 naming it when the log has no such
    message, or its turn has not ended."""
    turn: int | None = None
    current = 0  # a prompt is logged after the start of the turn it opens
    for event in events:
        if type(event) is TurnStart:
            current = event.turn
        elif isinstance(event, UserMessage | SteeringMessage) and event.message_id == message_id:
            turn = current
            break
    if turn is None:
        head, _, step = message_id.rpartition("/")
        owner, _, number = head.rpartition("/")
        if owner == session_id and _NUMBER.fullmatch(number) and _NUMBER.fullmatch(step):
            turn = int(number)
    started = {event.turn for event in events if type(event) is TurnStart}
    ended = {event.turn for event in events if type(event) is TurnEnd}
    if turn is None or turn not in ended:
        known = turn in started
        what = "is in a turn not ended" if known else "is not a message"
        raise RpcError(
            INVALID_PARAMS,
            f"invalid params: messageId {message_id[:200]!r} {what} of session {session_id!r}",
        )
    return turn
