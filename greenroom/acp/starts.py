"""The requests that start, list and end a connection's sessions: new, load, resume, fork,
list, close, delete.

Each runs in a task of its own (`connection.Waiting`) and returns its answer. One
that starts a session returns `Started`: the session is live under its record
(`sessions.SessionRecord`, made before the start so that a second load of the same
id is refused meanwhile), and the connection sends the answer, then what the
session's servers did meanwhile, then the updates of a turn a load carries on.
A session that comes live once the teardown began is disposed here and the
request fails. What is refused is an `RpcError`, answered as the protocol says.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, NamedTuple

from greenroom.acp.params import (
    RpcError,
    check_cwd,
    check_roots,
    offset,
    servers_from_acp,
)
from greenroom.acp.presenter import iso_time
from greenroom.acp.sessions import SessionRecord
from greenroom.actors.life import AgentHandle
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    Empty,
    ForkSessionParams,
    ListSessionsParams,
    ListSessionsResult,
    LoadSessionParams,
    LoadSessionResult,
    NewSessionParams,
    NewSessionResult,
    SessionInfo,
    SessionParams,
)
from greenroom.protocol.events import TurnResumed
from greenroom.protocol.mcp import McpServer
from greenroom.session.persistence import PersistenceError, SessionLocked, SessionNotFound

if TYPE_CHECKING:
    from greenroom.acp.connection import AcpConnection

__all__ = [
    "LIST_PAGE",
    "SERVER_WAIT",
    "Started",
    "close",
    "delete",
    "fork",
    "list_sessions",
    "load",
    "new",
    "resume",
]

#: Sessions per page of ``session/list``.
LIST_PAGE: Final = 50
#: Seconds ``session/new`` and ``load`` wait for the session's MCP servers before they
#: answer; a server not ready by then goes on starting (the editor is told).
SERVER_WAIT: Final = 2.0


class Started(NamedTuple):
    """What a request that starts a session returns: its answer, then the session's notices."""

    answer: object
    record: SessionRecord


async def new(connection: AcpConnection, params: NewSessionParams) -> Started:
    """``session/new``: a fresh session (a new id), created live here."""
    check_cwd(params.cwd, must_exist=True)
    check_roots(params.additional_directories)
    servers = servers_from_acp(params.mcp_servers)
    connection.require_open()
    session_id = str(uuid.uuid4())
    record = await _go_live(
        connection,
        session_id,
        lambda: connection.runtime.agents.create(
            agent_id=session_id,
            session_id=session_id,
            cwd=params.cwd,
            additional_directories=params.additional_directories,
            owner=connection.owner,
            client=connection.client_for(session_id),
            mcp_servers=servers,
            wait_for_servers=SERVER_WAIT,
        ),
    )
    return _new_session_result(connection, record)


async def load(connection: AcpConnection, params: LoadSessionParams) -> Started:
    """``session/load``: a stored session taken live here, its log replayed first."""
    return await _take_stored(connection, params, replay=True)


async def resume(connection: AcpConnection, params: LoadSessionParams) -> Started:
    """``session/resume``: a stored session taken live here, not replayed."""
    return await _take_stored(connection, params, replay=False)


async def _take_stored(
    connection: AcpConnection, params: LoadSessionParams, *, replay: bool
) -> Started:
    session_id = params.session_id
    _check_stored_id(connection, session_id)
    check_cwd(params.cwd, must_exist=False)
    check_roots(params.additional_directories)
    servers = servers_from_acp(params.mcp_servers)
    connection.require_open()

    async def start() -> AgentHandle:
        # The roots are the ones sent now (none if omitted), never the stored ones.
        handle = await _resume_stored(
            connection, session_id, servers, params.additional_directories
        )
        stored_cwd = handle.agent.session.header.cwd
        if stored_cwd != params.cwd:
            await handle.dispose()
            raise RpcError(
                INVALID_PARAMS,
                f"session {session_id!r} belongs to cwd {stored_cwd!r}, not {params.cwd!r}",
            )
        return handle

    record = await _go_live(connection, session_id, start)
    assert record.handle is not None
    session = record.handle.agent.session
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
            for update in connection.presenter.present(session, event, replay=False)
        ]
    if replay and session.blobs_wanted:  # its prompts' images, to send back
        with contextlib.suppress(PersistenceError):  # then each is a marker
            await session.hold_blobs({})
    if replay:  # the log as it was stored: the cut turn as it stands
        for event in events[:stored]:
            for update in connection.presenter.present(session, event, replay=True):
                connection.outbox.update(session_id, update)
    answer = LoadSessionResult(
        connection.presenter.modes(session), connection.presenter.config_options(session)
    )
    return Started(answer, record)


async def fork(connection: AcpConnection, params: ForkSessionParams) -> Started:
    """A new session holding the stored one's whole log, taken live here (not replayed:
    the client has the original's history)."""
    _check_stored_id(connection, params.session_id)
    check_cwd(params.cwd, must_exist=True)
    check_roots(params.additional_directories)
    servers = servers_from_acp(params.mcp_servers)
    connection.require_open()
    session_id = str(uuid.uuid4())
    try:
        await connection.runtime.agents.fork(
            params.session_id,
            session_id,
            cwd=params.cwd,
            additional_directories=params.additional_directories,
        )
    except SessionNotFound as exc:
        raise RpcError(RESOURCE_NOT_FOUND, str(exc)) from None
    except PersistenceError as exc:
        raise RpcError(INTERNAL_ERROR, str(exc)) from None
    record = await _go_live(
        connection, session_id, lambda: _resume_stored(connection, session_id, servers)
    )
    return _new_session_result(connection, record)


async def _go_live(
    connection: AcpConnection, session_id: str, start: Callable[[], Awaitable[AgentHandle]]
) -> SessionRecord:
    """Start `session_id` (`start`: a create or a resume) under a record of its own, kept
    once it is live; what its servers do meanwhile is told after the answer. A session
    loaded or loading here is refused; one started while teardown began is disposed."""
    if session_id in connection.sessions:
        raise RpcError(INVALID_PARAMS, f"session {session_id!r} is already loaded")
    record = connection.sessions[session_id] = SessionRecord(session_id)
    try:
        handle = await start()
    except BaseException:
        del connection.sessions[session_id]
        raise
    if connection.closed:  # the teardown left it to this request
        del connection.sessions[session_id]
        await handle.dispose()
        raise RpcError(INTERNAL_ERROR, "the connection closed while the session was starting")
    record.handle = handle
    return record


def _new_session_result(connection: AcpConnection, record: SessionRecord) -> Started:
    assert record.handle is not None
    session = record.handle.agent.session
    answer = NewSessionResult(
        record.session_id,
        connection.presenter.modes(session),
        connection.presenter.config_options(session),
    )
    return Started(answer, record)


def _check_stored_id(connection: AcpConnection, session_id: str) -> None:
    """Refuse, as the protocol answers it, a stored session this bridge could not read."""
    if connection.persistence is None:
        raise RpcError(INTERNAL_ERROR, "session persistence is not configured")
    try:
        connection.persistence.check_session_id(session_id)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"invalid params: sessionId: {exc}") from None


async def _resume_stored(
    connection: AcpConnection,
    session_id: str,
    servers: list[McpServer],
    additional_directories: list[str] | None = None,
) -> AgentHandle:
    """Take a stored session live here, owned by this connection (with the stored
    additional roots unless others are given)."""
    try:
        return await connection.runtime.agents.resume(
            agent_id=session_id,
            session_id=session_id,
            owner=connection.owner,
            client=connection.client_for(session_id),
            mcp_servers=servers,
            wait_for_servers=SERVER_WAIT,
            additional_directories=additional_directories,
            interrupted=connection.interrupted,
        )
    except SessionNotFound as exc:
        raise RpcError(RESOURCE_NOT_FOUND, str(exc)) from None
    except PersistenceError as exc:
        raise RpcError(INTERNAL_ERROR, str(exc)) from None


async def list_sessions(
    connection: AcpConnection, params: ListSessionsParams
) -> ListSessionsResult:
    """Most recently changed first, `LIST_PAGE` at a time; the cursor is an offset."""
    if connection.persistence is None:
        return ListSessionsResult([])
    stored = [
        s
        for s in await connection.persistence.list()
        if s.header.cwd is not None and params.cwd in (None, s.header.cwd)
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


async def delete(connection: AcpConnection, params: SessionParams) -> Empty:
    """Idempotent: a session open here is closed first; one live elsewhere is refused."""
    _check_stored_id(connection, params.session_id)
    assert connection.persistence is not None
    record = connection.sessions.get(params.session_id)
    if record is not None and record.handle is not None:
        del connection.sessions[params.session_id]
        await connection.release(record)
    try:
        await connection.persistence.delete(params.session_id)
    except SessionLocked as exc:
        raise RpcError(INTERNAL_ERROR, str(exc)) from None
    return Empty()


async def close(connection: AcpConnection, params: SessionParams) -> Empty:
    """``session/close``: a live session here released (its log stays stored)."""
    record = connection.live_record(params.session_id)
    del connection.sessions[params.session_id]
    await connection.release(record)
    return Empty()
