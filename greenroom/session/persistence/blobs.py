"""A session's blobs as side files: ``<directory>/<sha256>``, one file per blob.

The bytes of a prompt's images and blob resources never enter the log
(`greenroom.protocol.content`): the ``user/message`` names each by its
SHA-256, and the JSONL and SQLite backends keep them here (PostgreSQL keeps
them in a table). Content-addressed, so a blob is written once however many
prompts send it, and a write is never partial: a temporary file, renamed
into place. Names are joined as text, not as `pathlib.Path`: a Path interns
each name it is made of, and names made per blob would churn the
interpreter's table of interned strings. Blocking: call from a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from typing import Final

from greenroom.session.persistence.base import PersistenceError

#: A blob's name: its SHA-256 in lowercase hex.
DIGEST_LENGTH: Final = 64


def check_digest(digest: str) -> None:
    """`PersistenceError` unless `digest` is a SHA-256 in hex (it names a file)."""
    if len(digest) != DIGEST_LENGTH or digest.strip("0123456789abcdef"):
        raise PersistenceError(f"not a blob name (a SHA-256 in hex): {digest!r}")


def _private_directory(directory: str) -> None:
    """Make `directory` and each of its parents that is missing, mode 0700 (`os.makedirs`
    makes the parents with the default mode)."""
    if os.path.exists(directory):
        return
    parent = os.path.dirname(directory)
    if parent and parent != directory:
        _private_directory(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)


def put_files(directory: str, blobs: Mapping[str, bytes], *, durable: bool) -> None:
    """Write each blob not there yet (made mode 0700, with its missing parents, files 0600);
    with `durable`, each file and the directory are fsynced before it returns."""
    try:
        _private_directory(directory)
        wrote = False
        for digest, data in blobs.items():
            check_digest(digest)
            path = os.path.join(directory, digest)
            if os.path.exists(path):
                continue
            temp = os.path.join(directory, f".{digest[:16]}-{secrets.token_hex(4)}.tmp")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.replace(temp, path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
            wrote = True
        if wrote and durable:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        raise PersistenceError(f"cannot store a blob in {directory}: {exc}") from None


def read_files(directory: str, digests: Sequence[str]) -> dict[str, bytes]:
    """The blobs among `digests` found in `directory`; a missing one is left out."""
    found: dict[str, bytes] = {}
    for digest in digests:
        check_digest(digest)
        try:
            with open(os.path.join(directory, digest), "rb") as file:
                found[digest] = file.read()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise PersistenceError(f"cannot read blob {digest} in {directory}: {exc}") from None
    return found


def remove_files(directory: str) -> None:
    """Remove `directory` and its blobs (none there is no error)."""
    shutil.rmtree(directory, ignore_errors=True)
