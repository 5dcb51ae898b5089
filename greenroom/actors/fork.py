"""Forking a stored session: a new session holding a prefix of another's log."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from greenroom.actors.loop import CLOSING_GRACE
from greenroom.protocol.content import referenced
from greenroom.protocol.events import SessionEvent, SessionHeader, TurnEnd, TurnStart, UserMessage
from greenroom.session import SessionStore, new_header
from greenroom.session.persistence import Persistence


async def fork_session(
    persistence: Persistence,
    sessions: SessionStore,
    session_id: str,
    new_session_id: str,
    *,
    at_turn: int | None = None,
    cwd: str | None = None,
    additional_directories: Sequence[str] | None = None,
    principal: str | None = None,
) -> SessionHeader:
    """Store `new_session_id` holding `session_id`'s log up to the end of turn `at_turn`
    (`AgentFactory.fork`, which checks the ids first; see there)."""
    header, events = await persistence.load(session_id)
    kept = _up_to(events, at_turn, session_id)
    with sessions.reserved(new_session_id):
        fork = new_header(
            new_session_id,
            cwd=header.cwd if cwd is None else cwd,
            additional_directories=header.additional_directories
            if additional_directories is None
            else additional_directories,
            parent_session=header.parent_session,
            forked_from=session_id,
            principal=principal,
        )
        log = await persistence.create(fork)
        try:
            try:
                digests = [d for e in kept if type(e) is UserMessage for d in referenced(e.parts)]
                if digests:  # the prompts' images go with the copy, ahead of its log
                    await log.put_blobs(await persistence.read_blobs(session_id, digests))
                for event in kept:
                    log.append(event)
                await log.flush()
            finally:
                await log.close()
        except BaseException as exc:
            await _unstore(persistence, new_session_id, exc)
            raise
    return fork


def _up_to(
    events: Sequence[SessionEvent], at_turn: int | None, session_id: str
) -> Sequence[SessionEvent]:
    """The events of turns 1..`at_turn` (all of them for None), in order."""
    if at_turn is None:
        return events
    last = max((e.turn for e in events if isinstance(e, TurnEnd)), default=0)
    # Only an int: True is not turn 1, nor 1.0 or "1" a turn.
    if type(at_turn) is not int or not 0 <= at_turn <= last:
        raise ValueError(
            f"session {session_id!r} has turns 1..{last}; cannot fork it at turn {at_turn!r}"
        )
    for index, event in enumerate(events):
        if isinstance(event, TurnStart) and event.turn > at_turn:
            return events[:index]
    return events


async def _unstore(persistence: Persistence, session_id: str, cause: BaseException) -> None:
    """Delete a session whose copy failed or was cancelled part way, so no partial copy
    stays stored; shielded, bounded by `CLOSING_GRACE`. A delete that fails too is told
    on `cause` (which the caller raises) rather than hiding it."""
    with trio.move_on_after(CLOSING_GRACE, shield=True) as bound:
        try:
            await persistence.delete(session_id)
        except Exception as exc:
            cause.add_note(f"the partial fork {session_id!r} is still stored: {exc!r}")
    if bound.cancelled_caught:
        cause.add_note(f"the partial fork {session_id!r} may still be stored: its delete timed out")
