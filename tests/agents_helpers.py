"""Small readers of a session log, shared by the agent tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from greenroom import Agent, Runtime
from greenroom.protocol.events import (
    SessionEvent,
    StepStart,
    TurnAnswered,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)


def kind(event: SessionEvent) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def kinds(events: Sequence[SessionEvent]) -> list[str]:
    return [kind(e) for e in events]


def turn_ends(events: Sequence[SessionEvent]) -> list[tuple[int, TurnEndReason]]:
    return [(e.turn, e.reason) for e in events if isinstance(e, TurnEnd)]


def user_messages_by_turn(events: Sequence[SessionEvent]) -> dict[int, list[str]]:
    turns: dict[int, list[str]] = {}
    current = 0
    for event in events:
        if isinstance(event, TurnStart):
            current = event.turn
            turns[current] = []
        elif isinstance(event, UserMessage):
            turns[current].append(event.content)
    return turns


def steps_of(events: Sequence[SessionEvent], turn: int) -> int:
    return sum(1 for e in events if isinstance(e, StepStart) and e.turn == turn)


def assert_enclosed(events: Sequence[SessionEvent]) -> None:
    """Every event sits between a turn/start and its turn/end, but a turn/answered, which
    follows the turn/end of the turn it names; seqs run 0, 1, 2, ..."""
    open_turn: int | None = None
    for index, event in enumerate(events):
        assert event.seq == index, f"event {index} has seq {event.seq}"
        if isinstance(event, TurnAnswered):
            before = events[index - 1] if index else None
            assert isinstance(before, TurnEnd), f"turn/answered at seq {index} follows no turn/end"
            assert before.turn == event.turn, f"turn/answered {event.turn} follows another turn"
        elif isinstance(event, TurnStart):
            assert open_turn is None, f"turn {event.turn} opened inside turn {open_turn}"
            open_turn = event.turn
        elif isinstance(event, TurnEnd):
            assert open_turn == event.turn, f"turn/end {event.turn} closes {open_turn}"
            open_turn = None
        else:
            assert open_turn is not None, f"{kind(event)} at seq {index} is outside any turn"


async def new_agent(
    rt: Runtime, agent_id: str = "a", session_id: str = "s", **kwargs: Any
) -> Agent:
    """The agent of ``rt.agents.create(...)``, for tests that never dispose it themselves."""
    return (await rt.agents.create(agent_id=agent_id, session_id=session_id, **kwargs)).agent
