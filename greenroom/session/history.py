"""A session's conversation as typed values: what `Agent.history` and `Runtime.history` give.

Read off the log, in its order: each prompt, each steering and injected
message, the assistant's text and thinking of each step, each tool call with
its result, and each compaction where it happened. It is the whole
conversation the log holds, not the model's view of it (a compaction is an
entry; what it summarized stays). Every entry is a msgspec Struct tagged by
``kind``, so a history encodes as JSON (``msgspec.json.encode``) and decodes
back as `HistoryEntry`.

`history_of` reads a log's events as a list of `HistoryEntry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias, final

import msgspec

from greenroom.protocol.content import Part
from greenroom.protocol.events import (
    AssistantMessage,
    Compacted,
    ContextMessage,
    MessageSource,
    SessionEvent,
    SteeringMessage,
    ToolCall,
    ToolResult,
    TurnStart,
    UserMessage,
)


@final
class UserEntry(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="user"):
    """A prompt (`steered`: it joined a running turn), its text and, when sent as blocks,
    its parts (an image or a blob resource by reference)."""

    turn: int
    message_id: str
    text: str
    source: MessageSource
    parts: list[Part] = []
    steered: bool = False


@final
class ContextEntry(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="context"):
    """Context added without a prompt (`Agent.inject`, a background task's notice)."""

    turn: int
    message_id: str
    text: str
    source: MessageSource


@final
class AssistantEntry(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="assistant"):
    """One step's reply: its text and its thinking (either may be empty)."""

    turn: int
    step: int
    text: str
    thinking: str = ""


@final
class ToolCallEntry(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="tool_call"):
    """A tool call and its result (None only in a log cut mid-call and not repaired)."""

    turn: int
    step: int
    call_id: str
    name: str
    arguments: str  # the JSON text the model wrote
    result: str | None = None
    is_error: bool = False


@final
class CompactionEntry(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="compaction"
):
    """From here on the model was sent `summary` in place of turns `first_turn` to
    `last_turn` (`degraded`: why no summary could be written)."""

    turn: int
    summary: str
    first_turn: int
    last_turn: int
    degraded: str | None = None


HistoryEntry: TypeAlias = (
    UserEntry | ContextEntry | AssistantEntry | ToolCallEntry | CompactionEntry
)


def history_of(events: Sequence[SessionEvent]) -> list[HistoryEntry]:
    """The conversation `events` hold, in log order (a tool call's entry stands where the
    call was logged and carries the result logged later). A cold path: read by class
    patterns, not the turn's exact-type dispatch."""
    entries: list[HistoryEntry] = []
    calls: dict[str, int] = {}  # call id -> index of its entry, until its result
    turn = 0
    for event in events:
        match event:
            case TurnStart():
                turn = event.turn
            case UserMessage():
                entries.append(
                    UserEntry(
                        turn=turn,
                        message_id=event.message_id,
                        text=event.content,
                        source=event.source,
                        parts=event.parts,
                    )
                )
            case SteeringMessage():
                entries.append(
                    UserEntry(
                        turn=event.turn,
                        message_id=event.message_id,
                        text=event.content,
                        source=event.source,
                        steered=True,
                    )
                )
            case ContextMessage():
                entries.append(
                    ContextEntry(
                        turn=turn,
                        message_id=event.message_id,
                        text=event.content,
                        source=event.source,
                    )
                )
            case AssistantMessage() if event.content or event.reasoning:
                entries.append(
                    AssistantEntry(
                        turn=event.turn,
                        step=event.step,
                        text=event.content,
                        thinking=event.reasoning,
                    )
                )
            case ToolCall():
                calls[event.call_id] = len(entries)
                entries.append(
                    ToolCallEntry(
                        turn=event.turn,
                        step=event.step,
                        call_id=event.call_id,
                        name=event.name,
                        arguments=event.arguments,
                    )
                )
            case ToolResult() if event.call_id in calls:
                index = calls.pop(event.call_id)
                call = entries[index]
                assert isinstance(call, ToolCallEntry)
                entries[index] = msgspec.structs.replace(
                    call, result=event.content, is_error=event.is_error
                )
            case Compacted():
                entries.append(
                    CompactionEntry(
                        turn=event.turn,
                        summary=event.summary,
                        first_turn=event.first_turn,
                        last_turn=event.last_turn,
                        degraded=event.degraded,
                    )
                )
    return entries
