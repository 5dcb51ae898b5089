"""The model seam's data: what a model adapter is asked, and what it streams back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

import msgspec

FinishReason: TypeAlias = Literal["stop", "tool-calls", "max-tokens", "refusal", "error", "aborted"]

# -- stream chunks -----------------------------------------------------------


class TextDelta(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="text-delta"):
    text: str


class ReasoningDelta(
    msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="reasoning-delta"
):
    text: str


class ToolCallChunk(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="tool-call"):
    """One whole tool call: adapters assemble the fragments a wire format splits it into."""

    call_id: str
    name: str
    arguments: str  # JSON text


class Usage(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="usage"):
    input_tokens: int = 0
    output_tokens: int = 0


class Finish(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="finish"):
    reason: FinishReason
    message: str | None = None


StreamChunk: TypeAlias = TextDelta | ReasoningDelta | ToolCallChunk | Usage | Finish

# -- requests ----------------------------------------------------------------


class UserTurn(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="user"):
    content: str


class AssistantTurn(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="assistant"):
    content: str
    tool_calls: list[ToolCallChunk] = []


class ToolTurn(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="tool"):
    call_id: str
    content: str
    is_error: bool = False


Message: TypeAlias = UserTurn | AssistantTurn | ToolTurn


class ToolSchema(msgspec.Struct, frozen=True, gc=False):
    name: str
    description: str
    parameters: dict[str, object]  # JSON Schema of the arguments


class ModelRequest(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    messages: Sequence[Message]
    model: str | None = None
    system: str | None = None
    tools: list[ToolSchema] = []
