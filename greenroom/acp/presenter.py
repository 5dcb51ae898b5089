"""From the session log to ``session/update``: one presenter for live turns and load replay.

Updates are derived from log events only (never from ``agent/*`` emits), so a
replayed session and a live one produce the same frames. Message ids are
stable: a user message keeps its own id; an assistant reply is
``<session>/<turn>/<step>``. A tool call shows ``pending`` when the model
makes it, ``in_progress`` once it was allowed to run, then ``completed`` or
``failed`` with its output (and its edits as diffs).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator, Mapping, Sequence

from greenroom.actors.types import DEFAULT_MODE, MODES
from greenroom.protocol.acp import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ConfigChoice,
    ConfigOption,
    ConfigOptionUpdate,
    CurrentModeUpdate,
    DiffContent,
    SessionInfoUpdate,
    SessionMode,
    SessionModeState,
    SessionUpdate,
    TextBlock,
    ToolCallContent,
    ToolCallProgress,
    ToolCallStart,
    ToolContent,
    ToolLocation,
    ToolStatus,
    UsageUpdate,
    UserMessageChunk,
)
from greenroom.protocol.events import (
    AssistantChunk,
    AssistantMessage,
    ConfigSet,
    SessionEvent,
    ToolCall,
    ToolResult,
    ToolStart,
    UserMessage,
)
from greenroom.protocol.model import ReasoningDelta, TextDelta
from greenroom.session import Session

_MODES = [SessionMode(id, name, what) for id, (name, what) in MODES.items()]


class Presenter:
    """Log events as ``session/update``s, and a session's settings as ACP shows them.

    ``models`` are the runtime's model ids (the first is the default);
    ``context_windows`` the tokens each can hold, for ``usage_update``.
    """

    __slots__ = ("_context_windows", "_models")

    def __init__(self, models: Sequence[str], context_windows: Mapping[str, int]) -> None:
        self._models = list(models)
        self._context_windows = context_windows

    def modes(self, session: Session) -> SessionModeState:
        return SessionModeState(session.config.get("mode", DEFAULT_MODE), _MODES)

    def config_options(self, session: Session) -> list[ConfigOption]:
        mode = session.config.get("mode", DEFAULT_MODE)
        return [
            ConfigOption(
                "mode",
                "Mode",
                "mode",
                mode,
                [ConfigChoice(mode.id, mode.name) for mode in _MODES],
            ),
            ConfigOption(
                "model",
                "Model",
                "model",
                self._model(session),
                [ConfigChoice(model, model) for model in self._models],
            ),
        ]

    def present(
        self, session: Session, event: SessionEvent, *, replay: bool
    ) -> Iterator[SessionUpdate]:
        """The updates one log event becomes (user messages only on replay: the client has
        them)."""
        session_id = session.id
        match event:
            case AssistantChunk(turn=turn, step=step, chunk=TextDelta(text=text)) if text:
                yield AgentMessageChunk(TextBlock(text), f"{session_id}/{turn}/{step}")
            case AssistantChunk(turn=turn, step=step, chunk=ReasoningDelta(text=text)) if text:
                yield AgentThoughtChunk(TextBlock(text), f"{session_id}/{turn}/{step}")
            case UserMessage(content=content, message_id=message_id):
                if replay:
                    yield UserMessageChunk(TextBlock(content), message_id)
                if event.seq == session.title_seq and session.title is not None:
                    yield SessionInfoUpdate(session.title, iso_time(event.time))
            case AssistantMessage(usage=usage) if usage is not None:
                used = usage.input_tokens + usage.output_tokens
                window = self._context_windows.get(self._model(session), 0)
                yield UsageUpdate(used, max(window, used))
            case ToolCall(call_id=call_id, arguments=arguments):
                cwd = session.header.cwd
                locations = [
                    ToolLocation(_absolute(cwd, loc.path), loc.line) for loc in event.locations
                ]
                yield ToolCallStart(
                    call_id,
                    event.title or event.name,
                    event.kind,
                    "pending",
                    locations or None,
                    _arguments(arguments),
                )
            case ToolStart(call_id=call_id):
                yield ToolCallProgress(call_id, "in_progress")
            case ToolResult(call_id=call_id, content=content, is_error=is_error):
                status: ToolStatus = "failed" if is_error else "completed"
                shown: list[ToolContent] = [ToolCallContent(TextBlock(content))]
                shown += [DiffContent(d.path, d.new_text, d.old_text) for d in event.diffs]
                yield ToolCallProgress(call_id, status, shown)
            case ConfigSet(key="mode", value=value):
                yield CurrentModeUpdate(value)
                yield ConfigOptionUpdate(self.config_options(session))
            case ConfigSet(key="model"):
                yield ConfigOptionUpdate(self.config_options(session))

    def _model(self, session: Session) -> str:
        chosen = session.config.get("model")
        return chosen if chosen in self._models else self._models[0]


def iso_time(seconds: float) -> str:
    """Wall-clock seconds as ACP's ``updatedAt``: ISO 8601, UTC."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


def _absolute(cwd: str | None, path: str) -> str:
    """A tool's location as ACP wants every path: absolute (a model's relative path is
    the session's cwd's, as the file tools read it)."""
    if cwd is None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(cwd, path))


def _arguments(arguments: str) -> object:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments
