"""Session persistence: the seam and its logs, JSONL (the default) and SQLite backends.

The PostgreSQL backend is `greenroom.session.persistence.postgres.PostgresPersistence`,
imported from there: psycopg takes longer to import than the rest of greenroom does.

psycopg is imported by three modules only: `postgres`, `leases` and `handoff`.
"""

from greenroom.session.persistence.base import (
    DEADLINE,
    INTERRUPTIONS,
    LEASE_TTL,
    SYNC_POLICIES,
    AnswerKept,
    CorruptLog,
    HandOff,
    Holder,
    Interruption,
    LeaseLost,
    NotASessionLog,
    OperationTimeout,
    Persistence,
    PersistenceError,
    ReleaseAsked,
    SeqMismatch,
    SessionExists,
    SessionLocked,
    SessionLog,
    SessionNotFound,
    StoredSession,
    SyncPolicy,
    UnsupportedVersion,
    repair,
)
from greenroom.session.persistence.jsonl import JsonlPersistence, encode_session_id
from greenroom.session.persistence.sqlite import SqlitePersistence

__all__ = [
    "DEADLINE",
    "INTERRUPTIONS",
    "LEASE_TTL",
    "SYNC_POLICIES",
    "CorruptLog",
    "HandOff",
    "Holder",
    "Interruption",
    "JsonlPersistence",
    "LeaseLost",
    "NotASessionLog",
    "OperationTimeout",
    "Persistence",
    "PersistenceError",
    "AnswerKept",
    "ReleaseAsked",
    "SeqMismatch",
    "SessionExists",
    "SessionLocked",
    "SessionLog",
    "SessionNotFound",
    "SqlitePersistence",
    "StoredSession",
    "SyncPolicy",
    "UnsupportedVersion",
    "encode_session_id",
    "repair",
]
