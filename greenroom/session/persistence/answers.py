"""Answers to a session's decisions given while no one held it, as side files: one file per
decision, ``<directory>/<decision id>``, the first answer written wins.

`Runtime.decide` stores an answer here (JSONL and SQLite; PostgreSQL keeps them in a
table) when the session is not live in the process; the session's next holder reads
them and logs each as its ``decision/made``. The log is never written by anyone but its
holder. A file is written whole (a temporary file, then linked into place, which fails
if another answer got there first). The functions block: `AnswersBeside`, the file stores'
`put_answer` and `read_answers`, calls them from a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from functools import partial
from typing import Final

import msgspec
import trio

from greenroom.session.persistence.base import PersistenceError, SyncPolicy

#: What a decision id may be (it names a file): greenroom's own are ``dec-<hex>-<n>``.
_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class StoredAnswer(msgspec.Struct, frozen=True):
    """An answer as kept: what it said, and who gave it."""

    answer: str
    by: str


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(StoredAnswer).decode


class AnswersBeside:
    """`Persistence.put_answer` and `read_answers` of a file store (JSONL, SQLite): each
    answer a side file in the store's `answer_dir` for the session, fsynced unless the
    store's `sync` is ``os``."""

    sync: SyncPolicy

    def answer_dir(self, session_id: str) -> str:
        raise NotImplementedError

    async def put_answer(
        self, session_id: str, decision_id: str, answer: str, by: str
    ) -> tuple[str, str]:
        directory, durable = self.answer_dir(session_id), self.sync != "os"
        kept = await trio.to_thread.run_sync(
            partial(put_answer, directory, decision_id, answer, by, durable=durable)
        )
        return kept.answer, kept.by

    async def read_answers(self, session_id: str) -> dict[str, tuple[str, str]]:
        kept = await trio.to_thread.run_sync(read_answers, self.answer_dir(session_id))
        return {decision: (k.answer, k.by) for decision, k in kept.items()}


def check_decision_id(decision_id: str) -> None:
    """`PersistenceError` unless `decision_id` can name a file."""
    if not isinstance(decision_id, str) or not _ID.fullmatch(decision_id):
        raise PersistenceError(f"not a decision id: {decision_id!r}")


def put_answer(
    directory: str, decision_id: str, answer: str, by: str, *, durable: bool
) -> StoredAnswer:
    """Keep the answer unless one is kept already; the answer kept (the first)."""
    check_decision_id(decision_id)
    path = os.path.join(directory, decision_id)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        temp = os.path.join(directory, f".{secrets.token_hex(8)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, _encode(StoredAnswer(answer, by)))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, path)  # fails if another answer is there: the first wins
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        if durable:
            _sync_directory(directory)
        with open(path, "rb") as kept:
            return _decode(kept.read())
    except (OSError, msgspec.DecodeError) as exc:
        raise PersistenceError(f"cannot keep an answer in {directory}: {exc}") from None


def read_answers(directory: str) -> dict[str, StoredAnswer]:
    """Every answer kept in `directory` (none when it does not exist)."""
    found: dict[str, StoredAnswer] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        if name.startswith("."):
            continue
        try:
            with open(os.path.join(directory, name), "rb") as kept:
                found[name] = _decode(kept.read())
        except (OSError, msgspec.DecodeError) as exc:
            raise PersistenceError(f"cannot read the answer {name} in {directory}: {exc}") from None
    return found


def _sync_directory(directory: str) -> None:
    """The link made durable: the directory's entry synced."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
