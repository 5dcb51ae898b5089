"""Floor 3: sessions. `Session` is an append-only log; `SessionStore` publishes
the live ones and wires their appends to the ``session/event`` hook."""

from greenroom.session.session import Session
from greenroom.session.store import (
    SESSION_CREATED,
    SESSION_EVENT,
    SESSION_FLUSH,
    SessionIdInUse,
    SessionStore,
)

__all__ = [
    "SESSION_CREATED",
    "SESSION_EVENT",
    "SESSION_FLUSH",
    "Session",
    "SessionIdInUse",
    "SessionStore",
]
