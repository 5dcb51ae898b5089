"""Stores by URL: ``jsonl:DIR``, ``sqlite:PATH``, ``postgresql://...``, as ``--store`` and
``open_runtime(store=...)`` take them, and the directories greenroom keeps state in.

`store_from_url` opens one: ``jsonl:DIR[?fsync_timeout=S]``,
``sqlite:PATH[?commit_timeout=S]``, ``postgresql://...[?statement_timeout=...&
lock_timeout=...]``; no URL is ``$GREENROOM_STORE``, else ``<state-dir>/sessions/``
(JSONL). ``read_only=True`` (the reading commands) creates nothing: a SQLite store is
opened read-only, a PostgreSQL one has its tables checked first.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from pathlib import Path

from greenroom.session.persistence.base import (
    DEADLINE,
    LEASE_TTL,
    Persistence,
    PersistenceError,
    SyncPolicy,
)
from greenroom.session.persistence.jsonl import JsonlPersistence
from greenroom.session.persistence.sqlite import SqlitePersistence


class StateDirError(Exception):
    """The state directory cannot be used; the message names it and the problem."""


def usable_state_dir(path: Path, *, create: bool, named: str = "--state-dir") -> Path:
    """`path` as a directory greenroom can keep state in, made if `create` and missing.

    Raises `StateDirError` naming the path (after `named`, the option that gave it) and
    what is wrong with it.
    """
    if not path.exists():
        if not create:
            raise StateDirError(f"{named} {path}: no such directory")
        try:
            path.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            raise StateDirError(f"{named} {path}: cannot create it: {exc.strerror}") from None
    if not path.is_dir():
        raise StateDirError(f"{named} {path}: not a directory")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK if create else os.R_OK | os.X_OK):
        raise StateDirError(f"{named} {path}: not {'writable' if create else 'readable'}")
    return path


class StoreError(Exception):
    """The store URL cannot be used; the message names it and the problem."""


def store_from_url(
    url: str,
    *,
    what: str = "--store",
    sync: SyncPolicy = "turn",
    lease_ttl: float = LEASE_TTL,
    read_only: bool = False,
    keep_busy: bool = False,
) -> Persistence:
    """The persistence `url` names: ``jsonl:DIR``, ``sqlite:PATH`` or ``postgresql://...``.

    ``keep_busy``: a PostgreSQL node refuses another's request for a session that is
    mid-turn (`PostgresPersistence`). ``read_only`` (the reading commands) never
    creates or changes a store: the
    directory, the database file, or the PostgreSQL tables must exist. Raises
    `StoreError` naming the URL for one greenroom cannot use or reach, or that
    does not exist when reading (after `what`: the option or argument that gave it).
    """
    kind, _, rest = url.partition(":")
    try:
        if kind == "jsonl" and rest:
            named = f"{what} jsonl:"
            rest, fsync_timeout = _deadline(what, url, rest, "fsync_timeout")
            root = usable_state_dir(Path(rest).expanduser(), create=not read_only, named=named)
            return JsonlPersistence(root, sync=sync, fsync_timeout=fsync_timeout)
        if kind == "sqlite" and rest:
            rest, commit_timeout = _deadline(what, url, rest, "commit_timeout")
            path = Path(rest).expanduser()
            if read_only:
                return SqlitePersistence(path, read_only=True, commit_timeout=commit_timeout)
            usable_state_dir(path.parent, create=True, named=f"{what} {safe_url(url)}: its folder")
            return SqlitePersistence(path, sync=sync, commit_timeout=commit_timeout)
        if kind in ("postgresql", "postgres") and rest.startswith("//"):
            from greenroom.session.persistence.postgres import PostgresPersistence

            return PostgresPersistence(
                url, sync=sync, lease_ttl=lease_ttl, keep_busy=keep_busy, read_only=read_only
            )
    except StateDirError as exc:
        raise StoreError(str(exc)) from None
    except (PersistenceError, OSError, sqlite3.Error) as exc:
        raise StoreError(f"{what} {safe_url(url)}: {exc}") from None
    raise StoreError(
        f"{what} {safe_url(url)}: not a store URL (jsonl:DIR, sqlite:PATH or postgresql://...)"
    )


def _deadline(what: str, url: str, rest: str, name: str) -> tuple[str, float]:
    """``PATH?NAME=SECONDS``: the path, and the deadline it gives (`DEADLINE` if none)."""
    path, _, query = rest.partition("?")
    if not query:
        return path, DEADLINE
    key, _, value = query.partition("=")
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if key != name or not 0 < seconds < math.inf:
        raise StoreError(f"{what} {safe_url(url)}: the only option is ?{name}=SECONDS (above 0)")
    return path, seconds


def safe_url(url: str) -> str:
    """`url` with any password it carries (``user:PASSWORD@`` or ``password=``) starred."""
    return _PASSWORD.sub(lambda m: f"{m[1] or m[2]}***", url)


_PASSWORD = re.compile(r"(://[^:/@]*:).*(?=@)|([?&]password=)[^&]*")
