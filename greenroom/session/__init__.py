"""Sessions. `Session` is an append-only log with a sink (its write path);
`SessionStore` publishes the live ones and tells the ``session/*`` observers."""

from greenroom.session.session import Session, SessionSink
from greenroom.session.store import (
    SESSION_CREATED,
    SESSION_EVENT,
    SessionIdInUse,
    SessionStore,
    new_header,
)

__all__ = [
    "SESSION_CREATED",
    "SESSION_EVENT",
    "Session",
    "SessionIdInUse",
    "SessionSink",
    "SessionStore",
    "new_header",
]
