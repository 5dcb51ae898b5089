"""`SessionStore`: the live sessions, unique by id."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from greenroom.protocol.events import SessionEvent, SessionHeader
from greenroom.session.session import Session
from greenroom.supervisor.hooks import AsyncEmitHook, EmitHook, Hooks

SESSION_CREATED: EmitHook[[Session]] = EmitHook("session/created")
SESSION_EVENT: EmitHook[[Session, SessionEvent]] = EmitHook("session/event")
SESSION_FLUSH: AsyncEmitHook[[Session]] = AsyncEmitHook("session/flush")


class SessionIdInUse(ValueError):
    """A session id is live in the store, or reserved by a create or resume in flight."""


class SessionStore:
    """Live sessions by id, with the three-step publication of the seeds.

    `prepare` builds a session without publishing it; `enter` publishes it
    (checking again, so a stale prepared session never overwrites a live one)
    and wires its appends to ``session/event``; `announce` emits
    ``session/created``. `reserve` holds an id across an async create, so
    two racing creates cannot both publish it.
    """

    __slots__ = ("_hooks", "_live", "_reserved")

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._live: dict[str, Session] = {}
        self._reserved: set[str] = set()

    def get(self, session_id: str) -> Session | None:
        return self._live.get(session_id)

    def list(self) -> list[Session]:
        return list(self._live.values())

    def reserve(self, session_id: str) -> Callable[[], None]:
        """Hold `session_id` against other creates; returns the release."""
        check_session_id(session_id)
        if session_id in self._live:
            raise SessionIdInUse(f"session {session_id!r} is already live")
        if session_id in self._reserved:
            raise SessionIdInUse(f"session {session_id!r} is being created or resumed already")
        self._reserved.add(session_id)
        return lambda: self._reserved.discard(session_id)

    def prepare(
        self,
        session_id: str,
        *,
        seed: Sequence[SessionEvent] = (),
        cwd: str | None = None,
        parent_session: str | None = None,
        created_at: int | None = None,
    ) -> Session:
        """Build a session, unpublished. Rejects a live id and a relative cwd."""
        check_session_id(session_id)
        if session_id in self._live:
            raise SessionIdInUse(f"session {session_id!r} is already live")
        if cwd is not None and not os.path.isabs(cwd):
            raise ValueError(f"session {session_id!r}: cwd must be an absolute path, got {cwd!r}")
        header = SessionHeader(
            id=session_id,
            created_at=created_at if created_at is not None else time.time_ns() // 1_000_000,
            cwd=cwd,
            parent_session=parent_session,
        )
        return Session(header, seed)

    def enter(self, session: Session) -> Callable[[], None]:
        """Publish `session`; returns the detach (unwire appends, leave the store)."""
        if session.id in self._live:
            raise SessionIdInUse(f"session {session.id!r} is already live")
        self._live[session.id] = session
        session.on_append = self._hooks_emit_event
        return lambda: self._detach(session)

    def _detach(self, session: Session) -> None:
        session.on_append = None
        if self._live.get(session.id) is session:
            del self._live[session.id]

    def announce(self, session: Session) -> None:
        self._hooks.emit(SESSION_CREATED, session)

    def entered(self, session: Session) -> _Entered:
        """``with store.entered(session):`` entered and announced for the body, detached after."""
        return _Entered(self, session)

    def _hooks_emit_event(self, session: Session, event: SessionEvent) -> None:
        self._hooks.emit(SESSION_EVENT, session, event)


class _Entered:
    __slots__ = ("_session", "_store")

    def __init__(self, store: SessionStore, session: Session) -> None:
        self._store = store
        self._session = session

    def __enter__(self) -> Session:
        self._store.enter(self._session)
        try:
            self._store.announce(self._session)
        except BaseException:
            self._store._detach(self._session)
            raise
        return self._session

    def __exit__(self, *exc_info: object) -> None:
        self._store._detach(self._session)


def check_session_id(session_id: object) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"a session id must be a non-empty string, got {session_id!r}")
