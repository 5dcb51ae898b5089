"""From the session log to ``session/update``: one presenter for live turns and load replay.

Updates are derived from log events only (never from ``agent/*`` emits), so a
replayed session and a live one produce the same frames. Message ids are
stable: a user message keeps its own id; an assistant reply is
``<session>/<turn>/<step>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from greenroom.protocol.acp import (
    AgentMessageChunk,
    AgentThoughtChunk,
    SessionUpdate,
    TextBlock,
    ToolCallContent,
    ToolCallProgress,
    ToolCallStart,
    ToolKind,
    ToolStatus,
    UserMessageChunk,
)
from greenroom.protocol.events import (
    AssistantChunk,
    SessionEvent,
    ToolCall,
    ToolResult,
    UserMessage,
)
from greenroom.protocol.model import ReasoningDelta, TextDelta


def present(session_id: str, event: SessionEvent, *, replay: bool) -> Iterator[SessionUpdate]:
    """The updates one log event becomes (user messages only on replay: the client sent them)."""
    match event:
        case AssistantChunk(turn=turn, step=step, chunk=TextDelta(text=text)) if text:
            yield AgentMessageChunk(TextBlock(text), f"{session_id}/{turn}/{step}")
        case AssistantChunk(turn=turn, step=step, chunk=ReasoningDelta(text=text)) if text:
            yield AgentThoughtChunk(TextBlock(text), f"{session_id}/{turn}/{step}")
        case UserMessage(content=content, message_id=message_id) if replay:
            yield UserMessageChunk(TextBlock(content), message_id)
        case ToolCall(call_id=call_id, name=name, arguments=arguments):
            raw = _arguments(arguments)
            yield ToolCallStart(call_id, _title(name, raw), tool_kind(name), "in_progress", raw)
        case ToolResult(call_id=call_id, content=content, is_error=is_error):
            status: ToolStatus = "failed" if is_error else "completed"
            yield ToolCallProgress(call_id, status, [ToolCallContent(TextBlock(content))])


def tool_kind(name: str) -> ToolKind:
    if name.startswith("bash"):
        return "execute"
    if name.startswith("read"):
        return "read"
    if name in ("write", "edit"):
        return "edit"
    return "other"


def _arguments(arguments: str) -> object:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def _title(name: str, raw: object) -> str:
    if name == "bash" and isinstance(raw, dict) and isinstance(raw.get("command"), str):
        return str(raw["command"])
    return name
