"""JSONL's append path: a write that fails keeps what it was given, in order, for the next
write; what a write took is never written twice."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from greenroom.protocol.events import (
    COMPLETED,
    USER,
    MessageTrigger,
    SessionHeader,
    TurnEnd,
    TurnStart,
)
from greenroom.session.persistence import JsonlPersistence, PersistenceError
from greenroom.session.persistence import jsonl as jsonl_module


def _turn(seq: int, turn: int) -> list[TurnStart | TurnEnd]:
    return [
        TurnStart(seq=seq, time=1.0, turn=turn, trigger=MessageTrigger(USER)),
        TurnEnd(seq=seq + 1, time=1.0, turn=turn, reason=COMPLETED),
    ]


async def test_a_failed_write_keeps_its_events_for_the_next_and_none_is_written_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlPersistence(tmp_path, sync="os")
    log = await store.create(SessionHeader(id="s", created_at=1))
    full = [False]
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if full[0] and fd == log.fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(jsonl_module.os, "write", write)
    for event in _turn(0, 1):
        log.append(event)
    await log.flush()
    full[0] = True
    for event in _turn(2, 2):
        log.append(event)
    with pytest.raises(PersistenceError, match="No space left on device"):
        await log.flush()
    full[0] = False
    for event in _turn(4, 3):  # appended after the failure: behind the kept ones
        log.append(event)
    await log.write_ahead()
    await log.flush()  # nothing left: writes nothing more
    await log.close()
    _, stored = await store.load("s")
    assert [(e.seq, e.turn) for e in stored] == [(0, 1), (1, 1), (2, 2), (3, 2), (4, 3), (5, 3)]
