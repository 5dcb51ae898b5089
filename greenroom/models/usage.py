"""Token usage and its cost summed per turn and per session, read off the log
(``turn/usage``).

`turn_usage` makes a turn's ``turn/usage`` record from its steps: its tokens and cost, and
the session's running total; `usage_record` one for what a turn spent outside its steps'
replies (a title's call).
"""

from __future__ import annotations

from collections.abc import Sequence

from greenroom.protocol.events import AssistantMessage, SessionEvent, TurnUsage
from greenroom.protocol.model import NO_USAGE, Usage


def turn_usage(events: Sequence[SessionEvent], start: int, turn: int) -> TurnUsage | None:
    """The ``turn/usage`` record that closes `turn`, whose events begin at index `start`.

    Its ``usage`` sums the usage of the turn's steps, their costs included (unknown
    when a step's was); its ``session`` adds that to the ``session`` of the last
    earlier record (so a resumed or forked session goes on from what its log holds,
    its cost too: unknown from the first turn whose cost was). None when no step of
    the turn reported usage (the scripted model): no record is written then.
    """
    usage: Usage | None = None
    for index in range(start, len(events)):
        event = events[index]
        if type(event) is AssistantMessage and event.usage is not None:
            usage = event.usage if usage is None else usage + event.usage
    if usage is None:
        return None
    earlier = NO_USAGE
    for index in range(start - 1, -1, -1):
        event = events[index]
        if type(event) is TurnUsage:
            earlier = event.session
            break
    return TurnUsage(turn=turn, usage=usage, session=earlier + usage)


def usage_record(events: Sequence[SessionEvent], turn: int, usage: Usage) -> TurnUsage:
    """The ``turn/usage`` record of `turn`, open at the end of `events`, that spent `usage`
    outside its steps' replies: the session's total is the last record's plus `usage`.
    (`turn_usage` reads the same total inline: it runs at every turn's end.)"""
    earlier = NO_USAGE
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if type(event) is TurnUsage:
            earlier = event.session
            break
    return TurnUsage(turn=turn, usage=usage, session=earlier + usage)
