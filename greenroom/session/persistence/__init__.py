"""Session persistence: the seam, JSONL (the default) and SQLite backends, write-behind."""

from greenroom.session.persistence.base import (
    CorruptLog,
    NotASessionLog,
    Persistence,
    PersistenceError,
    SeqMismatch,
    SessionExists,
    SessionNotFound,
    UnsupportedVersion,
    repair,
)
from greenroom.session.persistence.jsonl import JsonlPersistence, encode_session_id
from greenroom.session.persistence.sqlite import SqlitePersistence
from greenroom.session.persistence.writebehind import WriteBehind

__all__ = [
    "CorruptLog",
    "JsonlPersistence",
    "NotASessionLog",
    "Persistence",
    "PersistenceError",
    "SeqMismatch",
    "SessionExists",
    "SessionNotFound",
    "SqlitePersistence",
    "UnsupportedVersion",
    "WriteBehind",
    "encode_session_id",
    "repair",
]
