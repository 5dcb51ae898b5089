"""Emits on a hot path: one lookup while nothing listens, every guarantee while something does."""

from __future__ import annotations

import logging

import pytest

from greenroom.hooks import EmitHook, Emitter, Hooks
from greenroom.protocol.events import SessionEvent, StepStart
from greenroom.session import Session
from greenroom.session.store import SESSION_EVENT, SessionStore, new_header

PING: EmitHook[[int]] = EmitHook("test/ping")


def test_listened_follows_every_add_and_remove() -> None:
    hooks = Hooks()
    listened = hooks.listened
    assert PING not in listened
    first = hooks.on(PING, lambda n: None)
    second = hooks.on(PING, lambda n: None)
    assert PING in listened  # the same view, kept: it is live
    first()
    assert PING in listened
    second()
    assert PING not in listened
    with pytest.raises(TypeError):
        listened[PING] = ()  # type: ignore[index]


def test_an_emitter_emits_to_listeners_added_after_it_was_made() -> None:
    hooks = Hooks()
    emitter = Emitter(hooks, PING)
    seen: list[int] = []
    assert emitter.hook not in emitter.listened
    remove = hooks.on(PING, seen.append)
    assert emitter.hook in emitter.listened
    emitter.emit(1)
    remove()
    assert emitter.hook not in emitter.listened
    assert seen == [1]


def test_a_raising_listener_through_an_emitter_is_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hooks = Hooks()
    seen: list[int] = []

    def boom(n: int) -> None:
        raise RuntimeError("listener failed")

    hooks.on(PING, boom)
    hooks.on(PING, seen.append)
    with caplog.at_level(logging.ERROR, logger="greenroom.hooks"):
        Emitter(hooks, PING).emit(7)
    assert seen == [7]
    assert "listener failed" in caplog.text


def test_session_event_observers_come_and_go_while_the_session_is_live() -> None:
    hooks = Hooks()
    store = SessionStore(hooks)
    session = store.prepare(new_header("s"))
    store.enter(session)
    session.append(StepStart(turn=1, step=1))  # nobody listens: nothing to see
    seen: list[tuple[Session, int]] = []

    def observe(where: Session, event: SessionEvent) -> None:
        seen.append((where, event.seq))

    remove = hooks.on(SESSION_EVENT, observe)
    session.append(StepStart(turn=1, step=2))
    remove()
    session.append(StepStart(turn=1, step=3))
    assert seen == [(session, 1)]
    assert len(session.events) == 3  # logged whether or not anything listened
    store.leave(session)
    hooks.on(SESSION_EVENT, observe)
    session.append(StepStart(turn=1, step=4))  # left the store: no longer wired
    assert seen == [(session, 1)]
