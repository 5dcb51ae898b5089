"""`SessionStore`: the live sessions, unique by id.

The publication steps are `reserved`, `prepare`, `enter` ... `leave`; `new_header` makes a
new session's header; the observer hooks are ``session/created`` and ``session/event``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from greenroom.hooks import EmitHook, Emitter, Hooks
from greenroom.protocol.events import SessionEvent, SessionHeader
from greenroom.session.session import Session, SessionSink

SESSION_CREATED: EmitHook[[Session]] = EmitHook("session/created")
SESSION_EVENT: EmitHook[[Session, SessionEvent]] = EmitHook("session/event")


class SessionIdInUse(ValueError):
    """A session id is live in the store, or reserved by a create or resume in flight."""


class SessionStore:
    """Live sessions by id, with the three-step publication of the seeds.

    `prepare` builds a session without publishing it; `enter` publishes it
    (checking again, so a stale prepared session never overwrites a live
    one), wires its appends to the ``session/event`` observers and emits
    ``session/created``; `leave` undoes that. `reserved` holds an id across an
    async create, so two racing creates cannot both publish it.
    """

    __slots__ = ("_hooks", "_live", "_observers", "_reserved")

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._live: dict[str, Session] = {}
        self._reserved: set[str] = set()
        self._observers = Emitter(hooks, SESSION_EVENT)  # one for every session's appends

    def get(self, session_id: str) -> Session | None:
        return self._live.get(session_id)

    def list(self) -> list[Session]:
        return list(self._live.values())

    @contextmanager
    def reserved(self, session_id: str) -> Iterator[None]:
        """Hold `session_id` against other creates for the body."""
        check_session_id(session_id)
        if session_id in self._live:
            raise SessionIdInUse(f"session {session_id!r} is already live")
        if session_id in self._reserved:
            raise SessionIdInUse(f"session {session_id!r} is being created or resumed already")
        self._reserved.add(session_id)
        try:
            yield
        finally:
            self._reserved.discard(session_id)

    def prepare(
        self,
        header: SessionHeader,
        *,
        seed: Sequence[SessionEvent] = (),
        sink: SessionSink | None = None,
    ) -> Session:
        """Build a session on `header`, unpublished. Rejects a live id."""
        if header.id in self._live:
            raise SessionIdInUse(f"session {header.id!r} is already live")
        return Session(header, seed, sink=sink)

    def enter(self, session: Session) -> None:
        """Publish `session`, wire its appends to ``session/event``, emit ``session/created``.

        Raises `SessionIdInUse` if the id is live (a stale prepared session
        never overwrites a live one). `leave` undoes it.
        """
        if session.id in self._live:
            raise SessionIdInUse(f"session {session.id!r} is already live")
        self._live[session.id] = session
        session.on_append = self._observers
        self._hooks.emit(SESSION_CREATED, session)

    def leave(self, session: Session) -> None:
        """Unwire `session`'s appends and take it out of the store."""
        session.on_append = None
        del self._live[session.id]


def new_header(
    session_id: str,
    *,
    cwd: str | None = None,
    additional_directories: Sequence[str] = (),
    parent_session: str | None = None,
    forked_from: str | None = None,
    principal: str | None = None,
) -> SessionHeader:
    """The header of a new session, created now. Rejects a bad id and a relative directory."""
    check_session_id(session_id)
    if cwd is not None:
        check_directory(session_id, "cwd", cwd)
    for path in additional_directories:
        check_directory(session_id, "additional directory", path)
    return SessionHeader(
        id=session_id,
        created_at=time.time_ns() // 1_000_000,
        cwd=cwd,
        additional_directories=list(additional_directories),
        parent_session=parent_session,
        forked_from=forked_from,
        principal=principal,
    )


def check_directory(session_id: str, name: str, path: str) -> None:
    """Refuse a relative directory for session `session_id`, naming it as `name`."""
    if not os.path.isabs(path):
        raise ValueError(f"session {session_id!r}: {name} must be an absolute path, got {path!r}")


def check_session_id(session_id: object) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"a session id must be a non-empty string, got {session_id!r}")
