"""The model seam's data: what a model adapter is asked, and what it streams back.

The stream a model step reads (`StreamChunk`: `TextDelta`, `ReasoningDelta`, `Thought`,
`ToolCallChunk`, `Usage`, `Retry`, `Finish`), the request it is asked (`ModelRequest`: the
system prompt, the messages `UserTurn` / `AssistantTurn` / `ToolTurn`, the offered tools'
`ToolSchema`, the output schema, ``max_output_tokens``, ``thought_level``) and `Usage`:
tokens and their `Decimal` cost, unknown as None; `NO_USAGE` is where a running total
starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Final, Literal, TypeAlias, final

import msgspec

from greenroom.protocol.content import Part

FinishReason: TypeAlias = Literal["stop", "tool-calls", "max-tokens", "refusal", "error", "aborted"]

# -- stream chunks -----------------------------------------------------------


@final
class TextDelta(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="text-delta"):
    text: str


@final
class ReasoningDelta(
    msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="reasoning-delta"
):
    text: str


@final
class Thought(
    msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="thought", omit_defaults=True
):
    """One whole thinking block, as the provider sent it, to be sent back as it came: its
    `text` and `signature`, or a redacted block's opaque `redacted` data. Streamed once
    the block closed (its text streamed before as `ReasoningDelta`s); the turn keeps it on
    the step's ``assistant/message``, not as a chunk.

    `source` names the wire format that made it, and only that format's adapter sends it
    back (another provider would refuse it): "" Anthropic's Messages API (every thought
    logged before there were others), ``openai-responses`` a Responses reasoning item (its
    summary in `text`, its encrypted content in `signature`, its id in `item`), ``gemini``
    a thought signature (`item`: the id of the tool call whose part carried it, "" the
    reply's text part), ``deepseek`` the reply's ``reasoning_content`` (in `text`)."""

    text: str = ""
    signature: str = ""
    redacted: str = ""
    source: str = ""
    item: str = ""


@final
class ToolCallChunk(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="tool-call"):
    """One whole tool call: adapters assemble the fragments a wire format splits it into."""

    call_id: str
    name: str
    arguments: str  # JSON text


@final
class Usage(
    msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="usage", omit_defaults=True
):
    """Tokens of one model call. ``input_tokens`` counts the whole prompt, cached parts
    included: ``cache_read_tokens`` were read from the provider's prompt cache and
    ``cache_write_tokens`` written to it (both part of the input);
    ``reasoning_tokens`` are the part of ``output_tokens`` spent thinking, where the
    provider says.

    ``cost``: what those tokens cost in USD, by the price table in force
    (`greenroom.models.prices`), exact; None when it is unknown (no price for the model,
    or an adapter's usage not yet priced: adapters never price). A sum is unknown when
    any part of it is: ``a + b`` adds the costs only when both are known. `NO_USAGE` is
    the zero a running total starts from (no tokens, nothing spent)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost: Decimal | None = None

    def __add__(self, other: Usage) -> Usage:
        mine, theirs = self.cost, other.cost
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            None if mine is None or theirs is None else mine + theirs,
        )


#: Nothing used and nothing spent: where a turn's or a session's running total starts.
NO_USAGE: Final = Usage(cost=Decimal(0))


@final
class Retry(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="retry"):
    """Not part of the reply: the adapter's `attempt` (from 1) failed with `error` before
    any of its reply was streamed, and the call is tried again after `wait` seconds. The
    turn driver logs it (``model/retry``) instead of a chunk."""

    attempt: int
    wait: float
    error: str
    code: str | None = None


@final
class Finish(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="finish"):
    reason: FinishReason
    message: str | None = None


StreamChunk: TypeAlias = (
    TextDelta | ReasoningDelta | ToolCallChunk | Usage | Finish | Retry | Thought
)

# -- requests ----------------------------------------------------------------


@final
class UserTurn(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="user"):
    """A user message: `content` its text, or, when it has `parts`, what they say in text
    (each adapter then sends the parts, the blobs they name read off `ModelRequest.blobs`)."""

    content: str
    parts: list[Part] = []


@final
class AssistantTurn(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="assistant"):
    content: str
    tool_calls: list[ToolCallChunk] = []
    thoughts: list[Thought] = []


@final
class ToolTurn(msgspec.Struct, frozen=True, gc=False, tag_field="role", tag="tool"):
    call_id: str
    content: str
    is_error: bool = False


Message: TypeAlias = UserTurn | AssistantTurn | ToolTurn


@final
class ToolSchema(msgspec.Struct, frozen=True, gc=False):
    name: str
    description: str
    parameters: dict[str, object]  # JSON Schema of the arguments


@final
class ModelRequest(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One model call. ``output``: the turn asked for a structured final answer; it is
    offered in ``tools`` under its name (every adapter sees it there), and an adapter
    whose provider takes a JSON schema for its output natively may ask for that instead."""

    messages: Sequence[Message]
    model: str | None = None
    system: str | None = None
    tools: list[ToolSchema] = []
    output: ToolSchema | None = None
    #: How hard the model thinks: one of `THOUGHT_LEVELS` (None or anything else: off).
    thought_level: str | None = None
    #: The bytes of the images and blob resources the messages' parts name, by SHA-256
    #: (one missing is sent as a marker saying so).
    blobs: Mapping[str, bytes] = {}
    #: The most output tokens this call may spend, thinking included (None: the adapter's
    #: own maximum). An adapter takes the smaller of this and its own, and keeps any
    #: thinking budget under it.
    max_output_tokens: int | None = None
    #: The session the call is for: an adapter whose provider routes its prompt cache by a
    #: key derives that key from it (None: no key is sent).
    session_id: str | None = None


#: The ``thought_level`` setting's values (ACP's ``thought_level`` config category).
THOUGHT_LEVELS: Final = ("off", "low", "medium", "high")
