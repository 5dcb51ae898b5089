"""greenroom: an actor runtime for AI agents on Trio."""

from greenroom.actors.registry import AgentHandle, AgentRegistry
from greenroom.actors.types import Agent, AgentDisposed, AgentOptions
from greenroom.runtime import Runtime, open_runtime

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentDisposed",
    "AgentHandle",
    "AgentOptions",
    "AgentRegistry",
    "Runtime",
    "open_runtime",
]
