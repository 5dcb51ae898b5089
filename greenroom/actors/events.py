"""The ``agent/*`` hooks: the live surface of every agent (the log is the durable one).

Emits tell; waterfalls shape what happens next. Appending to the session
log always precedes the matching emit.
"""

from __future__ import annotations

from greenroom.actors.types import Agent
from greenroom.hooks import EmitHook, WaterfallHook
from greenroom.protocol.events import AssistantMessage, StatusName, ToolProgress, TurnEndReason
from greenroom.protocol.model import ModelRequest, StreamChunk

AGENT_CREATED: EmitHook[[Agent]] = EmitHook("agent/created")
AGENT_DISPOSED: EmitHook[[Agent]] = EmitHook("agent/disposed")
AGENT_STATUS: EmitHook[[Agent, StatusName]] = EmitHook("agent/status")
#: (agent, message id, steering?)
AGENT_QUEUED: EmitHook[[Agent, str, bool]] = EmitHook("agent/queued")
AGENT_TURN_START: EmitHook[[Agent, int]] = EmitHook("agent/turn-start")
AGENT_TURN_END: EmitHook[[Agent, int, TurnEndReason]] = EmitHook("agent/turn-end")
#: (agent, turn, step)
AGENT_STEP_START: EmitHook[[Agent, int, int]] = EmitHook("agent/step-start")
AGENT_STEP_END: EmitHook[[Agent, int, int]] = EmitHook("agent/step-end")
AGENT_STREAM_CHUNK: EmitHook[[Agent, int, int, StreamChunk]] = EmitHook("agent/stream-chunk")
#: a running call's output so far (`Session.show_progress`: transient, never logged)
AGENT_TOOL_PROGRESS: EmitHook[[Agent, ToolProgress]] = EmitHook("agent/tool-progress")
#: (agent, turn, steering content)
AGENT_STEERING: EmitHook[[Agent, int, str]] = EmitHook("agent/steering")
#: (agent, turn, step, error); turn or step is 0 outside one
AGENT_ERROR: EmitHook[[Agent, int, int, Exception]] = EmitHook("agent/error")
#: a tool call started a child of its agent: (the calling agent, the call's id, the child)
SUBAGENT_STARTED: EmitHook[[Agent, str, Agent]] = EmitHook("subagent/started")

#: the model request of (agent, turn, step), before it is sent
AGENT_REQUEST: WaterfallHook[ModelRequest, [Agent, int, int]] = WaterfallHook("agent/request")
#: the assistant message of (agent, turn, step), before it is logged and its tools run
AGENT_STEP_RESULT: WaterfallHook[AssistantMessage, [Agent, int, int]] = WaterfallHook(
    "agent/step-result"
)
#: whether (agent, turn) takes another step; the default is "it called tools or was steered"
AGENT_TURN_CONTINUATION: WaterfallHook[bool, [Agent, int]] = WaterfallHook(
    "agent/turn-continuation"
)
