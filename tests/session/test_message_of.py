"""`Session._read` builds the model history incrementally, the common kinds inline for speed;
`message_of` says what one event puts in the history (compaction rebuilds from it). The two
must agree for every kind of event, in any order."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st

from greenroom.protocol.content import ImageRef, Resource
from greenroom.protocol.events import (
    USER,
    AgentSource,
    AssistantChunk,
    AssistantMessage,
    ConfigSet,
    ContextMessage,
    PermissionRule,
    PlanEntry,
    PlanSet,
    PluginSource,
    SessionEvent,
    SteeringMessage,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    ToolStart,
    TurnUsage,
    UserMessage,
)
from greenroom.protocol.model import TextDelta, Thought, ToolCallChunk, Usage
from greenroom.session import Session, new_header
from greenroom.session.session import message_of

CALL = ToolCallChunk("c1", "read_file", '{"path": "a"}')
IMAGE = ImageRef(sha256="ab" * 32, mime_type="image/png", size=10)

#: One event of each kind the history reads, and several that it does not.
POOL: list[SessionEvent] = [
    UserMessage(content="hello", source=USER, message_id="m1"),
    UserMessage(content="see", source=USER, message_id="m2", parts=[IMAGE]),
    UserMessage(
        content="doc", source=USER, message_id="m3", parts=[Resource(uri="f:/a", text="x")]
    ),
    AssistantMessage(turn=1, step=1, content="hi"),
    AssistantMessage(turn=1, step=1, content="", tool_calls=[CALL]),
    AssistantMessage(turn=1, step=1, content="", reasoning="only thinking"),
    AssistantMessage(turn=1, step=1, content="t", thoughts=[Thought(text="x", signature="s")]),
    AssistantMessage(turn=1, step=1, content="used", usage=Usage(input_tokens=3)),
    ToolResult(turn=1, step=1, call_id="c1", content="result"),
    ToolResult(turn=1, step=1, call_id="c1", content="failed", is_error=True),
    ContextMessage(content="notice", source=PluginSource("bash"), message_id="m4"),
    SteeringMessage(turn=1, content="also", source=AgentSource("boss"), message_id="m5"),
    StepStart(turn=1, step=1),
    StepEnd(turn=1, step=1),
    AssistantChunk(turn=1, step=1, chunk=TextDelta("h")),
    ToolCall(turn=1, step=1, call_id="c1", name="read_file", arguments="{}"),
    ToolStart(turn=1, step=1, call_id="c1"),
    ConfigSet(key="mode", value="read-only"),
    PermissionRule(tool="bash", allow=True),
    PlanSet(turn=1, call_id="c2", entries=[PlanEntry("a", "high", "pending")]),
    TurnUsage(turn=1, usage=Usage(), session=Usage()),
]


def _copy(event: SessionEvent) -> SessionEvent:
    return type(event)(**{f: getattr(event, f) for f in event.__struct_fields__})


@hypothesis.given(st.lists(st.sampled_from(range(len(POOL))), max_size=40))
def test_the_history_read_incrementally_is_each_events_message_of(picks: list[int]) -> None:
    events = [_copy(POOL[index]) for index in picks]
    session = Session(new_header("s"))
    for event in events:
        session.append(event)
    expected = [m for e in session.events if (m := message_of(e)) is not None]
    assert list(session.messages()) == expected


def test_every_kind_in_the_pool_is_read() -> None:
    """The pool holds every kind `message_of` gives a message for."""
    kinds = {type(e) for e in POOL if message_of(e) is not None}
    assert kinds == {UserMessage, AssistantMessage, ToolResult, ContextMessage, SteeringMessage}
