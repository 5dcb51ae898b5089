"""``python -m bench._persist_child VARIANT N``: N ops of one persistence variant, for
callgrind to count (`bench.counting.instructions`).

VARIANT is ``turn-off``, ``turn-os`` (N one-step turns of an agent without
persistence, or with JSONL under ``sync="os"``), ``append-sqlite-os`` (N turns of 10
events appended to a SQLite log under ``sync="os"``, one flush each) or
``append-sqlite-floor`` (the same rows by a bare ``sqlite3`` connection, fenced, no
fsync). Only ``append-sqlite-os`` runs anything on another thread (the writer's WAL
checkpoint every 256 commits), so its count moves a little from run to run with where
that lands. Everything lives in a temporary directory, removed at the end.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio

from bench.sessions import _log_append, _raw_sqlite_fenced, _turn_cost, _turns
from greenroom.session.persistence import JsonlPersistence


def main(variant: str, n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        root = Path(tmp)
        if variant == "turn-off":
            trio.run(_turn_cost, None, n)
        elif variant == "turn-os":
            trio.run(_turn_cost, JsonlPersistence(root, sync="os"), n)
        elif variant == "append-sqlite-os":
            trio.run(_log_append, root, "sqlite", "os", _turns(n))
        elif variant == "append-sqlite-floor":
            _raw_sqlite_fenced(root, _turns(n), synced=False)
        else:
            raise SystemExit(f"unknown variant {variant!r}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
