"""`DeepSeekModel`: DeepSeek's API, and the OpenAI-compatible servers that copy it: the Chat
Completions wire format (`greenroom.models.openai`) with DeepSeek's thinking switch and its
``reasoning_content`` sent back."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, ClassVar, Final

from greenroom.models.http import SseEvent
from greenroom.models.openai import OpenAIChatModel
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    ModelRequest,
    ReasoningDelta,
    StreamChunk,
    Thought,
)

#: `Thought.source` of a reply's ``reasoning_content``.
SOURCE: Final = "deepseek"


class DeepSeekModel(OpenAIChatModel):
    """Streams ``POST {base_url}/chat/completions`` as `OpenAIChatModel` does, with
    ``base_url`` and ``api_key`` from ``DEEPSEEK_BASE_URL`` and ``DEEPSEEK_API_KEY`` (the
    URL then to ``https://api.deepseek.com``).

    DeepSeek thinks unless told not to, and refuses a request whose earlier calls come
    without the reasoning that led to them (HTTP 400). So a ``thought_level`` of off sends
    ``thinking: {"type": "disabled"}``, low, medium and high send ``enabled`` with the
    ``reasoning_effort``; a reply's reasoning, streamed as `ReasoningDelta`s, is kept whole
    as a `Thought` and goes back as its message's ``reasoning_content`` (DeepSeek ignores
    it where it is not needed). Cache hits (``prompt_cache_hit_tokens``) count as cached
    input.
    """

    provider: ClassVar[str] = "deepseek"
    default_url: ClassVar[str] = "https://api.deepseek.com"

    def overflowed(self, kind: str | None, message: str) -> bool:
        """DeepSeek's over-long request: a 400 naming the model's maximum context length."""
        return kind == "context_length_exceeded" or "maximum context length" in message

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """`OpenAIChatModel.body` with ``thinking`` among the fixed options (ahead of the
        tools and messages, for the cache) and each assistant message's reasoning."""
        body = super().body(request)
        tools = body.pop("tools", None)
        messages: list[dict[str, Any]] = body.pop("messages")
        thinking = request.thought_level in ("low", "medium", "high")
        body["thinking"] = {"type": "enabled" if thinking else "disabled"}
        if tools is not None:
            body["tools"] = tools
        # One wire message per assistant turn, in order (`OpenAIChatModel.body`).
        replies = iter([entry for entry in messages if entry["role"] == "assistant"])
        for message in request.messages:
            if type(message) is AssistantTurn:
                entry = next(replies)
                reasoning = "".join(t.text for t in message.thoughts if t.source == SOURCE)
                if reasoning:
                    entry["reasoning_content"] = reasoning
        body["messages"] = messages
        return body

    async def _chunks(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[StreamChunk, None]:
        """The reply's chunks as `OpenAIChatModel` reads them, and before the finish its
        reasoning, whole, as a `Thought` (none when it streamed none)."""
        reasoning: list[str] = []
        async with aclosing(super()._chunks(events)) as chunks:
            async for chunk in chunks:
                if type(chunk) is ReasoningDelta:
                    reasoning.append(chunk.text)
                elif type(chunk) is Finish and reasoning:
                    yield Thought(text="".join(reasoning), source=SOURCE)
                yield chunk
