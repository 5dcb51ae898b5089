"""Token usage summed per turn and per session, read off the log (``turn/usage``)."""

from __future__ import annotations

from collections.abc import Sequence

from greenroom.protocol.events import AssistantMessage, SessionEvent, TurnStart, TurnUsage
from greenroom.protocol.model import Usage

_NONE = Usage()


def turn_usage(events: Sequence[SessionEvent], start: int, turn: int) -> TurnUsage | None:
    """The ``turn/usage`` record that closes `turn`, whose events begin at index `start`.

    Its ``usage`` sums the usage of the turn's steps; its ``session`` adds that to
    the ``session`` of the last earlier record (so a resumed or forked session
    goes on from what its log holds). None when no step of the turn reported
    usage (the scripted model): no record is written then.
    """
    usage: Usage | None = None
    for index in range(start, len(events)):
        event = events[index]
        if type(event) is AssistantMessage and event.usage is not None:
            usage = event.usage if usage is None else usage + event.usage
    if usage is None:
        return None
    earlier = _NONE
    for index in range(start - 1, -1, -1):
        event = events[index]
        if type(event) is TurnUsage:
            earlier = event.session
            break
    return TurnUsage(turn=turn, usage=usage, session=earlier + usage)


def usage_of_turn(events: Sequence[SessionEvent], turn: int) -> Usage | None:
    """The ``turn/usage`` of `turn`, read back from the log's end to the turn's start (the
    turn that just ended: a few events); None when it has none."""
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if type(event) is TurnUsage and event.turn == turn:
            return event.usage
        if type(event) is TurnStart and event.turn == turn:
            return None
    return None
