"""Model adapters: the `ModelAdapter` seam and the scripted model (the embedded default)."""

from greenroom.models.base import ModelAdapter, ModelError
from greenroom.models.scripted import (
    CallTool,
    End,
    Fail,
    Hang,
    Say,
    ScriptedModel,
    Think,
    Tokens,
    Wait,
)

__all__ = [
    "CallTool",
    "End",
    "Fail",
    "Hang",
    "ModelAdapter",
    "ModelError",
    "Say",
    "ScriptedModel",
    "Think",
    "Tokens",
    "Wait",
]
