"""greenroom: an actor runtime for AI agents on Trio."""

from greenroom.actors.factory import AgentFactory
from greenroom.actors.life import AgentHandle
from greenroom.actors.limits import Limits
from greenroom.actors.prompt import Answer, Prompt, PromptEvent, StopReason, ToolCallRecord
from greenroom.actors.registry import AgentRegistry
from greenroom.actors.spec import AgentSpec
from greenroom.actors.types import (
    Agent,
    AgentDisposed,
    AgentOptions,
    Guard,
    SpawnLimits,
    SpawnRefused,
)
from greenroom.blocking import (
    BlockingAgent,
    BlockingHandle,
    BlockingPrompt,
    BlockingRuntime,
    blocking_runtime,
    run_sync,
)
from greenroom.models.prices import Price, Prices
from greenroom.protocol.content import Image, Resource, Text
from greenroom.runtime import Runtime, open_runtime
from greenroom.session.history import (
    AssistantEntry,
    CompactionEntry,
    ContextEntry,
    HistoryEntry,
    ToolCallEntry,
    UserEntry,
)
from greenroom.supervisor import Supervisor
from greenroom.tools.subagents import task_tool
from greenroom.tools.typed import tool

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentDisposed",
    "AgentFactory",
    "AgentHandle",
    "AgentOptions",
    "AgentRegistry",
    "AgentSpec",
    "Answer",
    "AssistantEntry",
    "BlockingAgent",
    "BlockingHandle",
    "BlockingPrompt",
    "BlockingRuntime",
    "CompactionEntry",
    "ContextEntry",
    "Guard",
    "HistoryEntry",
    "Image",
    "Limits",
    "Price",
    "Prices",
    "Prompt",
    "PromptEvent",
    "Resource",
    "Runtime",
    "SpawnLimits",
    "SpawnRefused",
    "StopReason",
    "Supervisor",
    "Text",
    "ToolCallEntry",
    "ToolCallRecord",
    "UserEntry",
    "blocking_runtime",
    "open_runtime",
    "run_sync",
    "task_tool",
    "tool",
]
