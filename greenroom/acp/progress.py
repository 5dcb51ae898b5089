"""Sub-agent progress: a ``task`` call's child, streamed into the call on its parent's session.

The child's messages and tool calls so far become the call's content (a
``tool_call_update``, ``in_progress``), its latest `PROGRESS_CHARS` only.
A child is followed from its ``subagent/started`` to its one turn's end, or
to its disposal (a cancel that dropped its turn before it began, a disposal
before its prompt).

`SubagentProgress` follows a connection's ``task`` children, by their session id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from greenroom.acp.routes import Watch
from greenroom.protocol.acp import (
    SessionUpdate,
    TextBlock,
    ToolCallContent,
    ToolCallProgress,
)
from greenroom.protocol.events import AssistantMessage, SessionEvent, ToolCall, TurnEnd

#: The most of a sub-agent's progress shown in its ``task`` call (its latest part).
PROGRESS_CHARS: Final = 4000
#: The kinds of event `SubagentProgress.on_event` reads; it passes over any other.
FOLLOWED: Final = frozenset({TurnEnd, AssistantMessage, ToolCall})


class _Child:
    __slots__ = ("call_id", "lines", "parent_session")

    def __init__(self, parent_session: str, call_id: str) -> None:
        self.parent_session = parent_session
        self.call_id = call_id
        self.lines: list[str] = []


class SubagentProgress:
    """The children being followed, by their session id; `update` is called with
    (the parent's session id, the update) for each change to show."""

    __slots__ = ("_children", "_update", "_watch")

    def __init__(self, update: Callable[[str, SessionUpdate], None], watch: Watch) -> None:
        self._update = update
        self._watch = watch  # each child's session held while it is followed
        self._children: dict[str, _Child] = {}

    def __len__(self) -> int:
        return len(self._children)

    def follow(self, parent_session: str, call_id: str, child_session: str) -> None:
        """Show the child of session `child_session` in call `call_id` of `parent_session`."""
        if child_session not in self._children:
            self._watch.hold(child_session)
        self._children[child_session] = _Child(parent_session, call_id)

    def forget(self, child_session: str) -> None:
        """The child is gone (disposed); a no-op for one not followed."""
        if self._children and self._children.pop(child_session, None) is not None:
            self._watch.let_go(child_session)

    def close(self) -> None:
        """Follow no child more (the connection's end): each is let go."""
        for child_session in list(self._children):
            self.forget(child_session)

    def on_event(self, child_session: str, event: SessionEvent) -> None:
        """An event of session `child_session`'s log; nothing for a session not followed."""
        child = self._children.get(child_session)
        if child is None:
            return
        if isinstance(event, TurnEnd):  # its one turn: the call's result follows
            self.forget(child_session)
            return
        if isinstance(event, AssistantMessage) and event.content:
            child.lines.append(event.content)
        elif isinstance(event, ToolCall):
            child.lines.append(f"- {event.title or event.name}")
        else:
            return
        text = "\n\n".join(child.lines)[-PROGRESS_CHARS:]
        update = ToolCallProgress(child.call_id, "in_progress", [ToolCallContent(TextBlock(text))])
        self._update(child.parent_session, update)
