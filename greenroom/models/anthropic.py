"""`AnthropicModel`: the Messages API streaming wire format, natively on Trio over httpx2
(see `greenroom.models.http`).

Nothing beyond greenroom's own dependencies (the ``anthropic`` extra is kept, empty, for
``pip install 'greenroom[anthropic]'``).

It sets prompt-cache breakpoints, asks for extended thinking by ``thought_level`` and
sends its `Thought` blocks back, and keeps ``max_tokens`` and the thinking budget under a
request's ``max_output_tokens``.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, ClassVar, Final

import msgspec

from greenroom.backoff import Backoff
from greenroom.models.base import ModelError
from greenroom.models.http import (
    DEFAULT_BACKOFF,
    DEFAULT_RETRY_BUDGET,
    HttpModel,
    SseEvent,
    endpoint,
    output_limit,
)
from greenroom.models.parts import WirePart, answering
from greenroom.protocol.arguments import arguments_value
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    Thought,
    ToolCallChunk,
    ToolTurn,
    Usage,
    UserTurn,
)

API_VERSION: Final = "2023-06-01"
DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
#: Extended thinking's token budget per ``thought_level`` (off: no thinking). The largest
#: keeps ``max_tokens`` (twice the budget) within every Claude 4 model's 32,000 output limit.
THINKING_BUDGETS: Final = {"off": 0, "low": 4_000, "medium": 8_000, "high": 16_000}
#: The smallest thinking budget the API takes: a request whose output limit leaves less
#: (half of it: the other half is the answer's) is sent without thinking.
MIN_THINKING_BUDGET: Final = 1_024
#: A prompt-cache breakpoint (the default five-minute cache).
EPHEMERAL: Final = {"type": "ephemeral"}
_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
    "refusal": "refusal",
}


class AnthropicModel(HttpModel):
    """Streams ``POST {base_url}/v1/messages``; tool inputs are assembled from their JSON deltas.

    ``base_url`` and ``api_key`` default to ``ANTHROPIC_BASE_URL`` and
    ``ANTHROPIC_API_KEY`` (the URL then to the public API), as in the
    ``greenroom`` command (`greenroom.models.http.endpoint`). ``retry_budget`` is
    the seconds one call may wait between attempts, in all; ``verify`` the TLS
    trust for the endpoint (default: the system's store, or ``SSL_CERT_FILE``);
    ``images`` whether the model takes images (default: its family's,
    `greenroom.models.parts.IMAGE_INPUT`): one that does not refuses a prompt's
    image before any request is made.
    """

    #: The GenAI semantic conventions' ``gen_ai.provider.name`` (`greenroom.tracing`).
    provider: ClassVar[str] = "anthropic"

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        max_tokens: int = 8192,
        backoff: Backoff = DEFAULT_BACKOFF,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        context_window: int | None = None,
        verify: ssl.SSLContext | None = None,
        images: bool | None = None,
    ) -> None:
        if not model:
            raise TypeError("AnthropicModel: name the model (model=...)")
        base_url, api_key = endpoint(base_url, api_key, "anthropic", DEFAULT_BASE_URL)
        super().__init__(
            base_url + "/v1/messages",
            {
                "x-api-key": api_key,
                "anthropic-version": API_VERSION,
                "content-type": "application/json",
            },
            model,
            backoff=backoff,
            retry_budget=retry_budget,
            context_window=context_window,
            verify=verify,
            images=images,
        )
        self._max_tokens = max_tokens

    def overflowed(self, kind: str | None, message: str) -> bool:
        """Anthropic's over-long request: a 400 ``invalid_request_error`` "prompt is too long"."""
        return kind == "invalid_request_error" and "prompt is too long" in message

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body, laid out for the prompt cache.

        Consecutive same-role turns are merged, as the API requires. The keys go in
        the cache's order (tools, system, messages), so the encoded bytes of one
        request up to a breakpoint are a byte prefix of the next one's. Four
        ``cache_control`` breakpoints (the API's limit): the last tool, the system
        prompt, the last block of the message that ended the previous request (the
        third from the end: a user message, then the reply, then this user message)
        and the last block of this request. Each step thus reads everything up to the
        previous request from cache and writes what it adds; the previous request's
        last breakpoint is the same block with the same marker, so nothing before it
        changes by a byte. Everything is derived from the log, in its order, with no
        clock in it: a resumed session rebuilds the same bytes.

        A ``thought_level`` of low, medium or high asks for extended thinking with a
        budget of `THINKING_BUDGETS` tokens (``max_tokens`` then at least twice the
        budget), and sends each earlier reply's thinking blocks back ahead of it, as
        they came (signatures, redacted blocks), as the API requires during tool use.
        A request's ``max_output_tokens`` lowers ``max_tokens`` when smaller (never
        raises it), and the thinking budget to half of that at most: below
        `MIN_THINKING_BUDGET` the request thinks not at all.
        """
        budget, limit = self._limits(request)
        messages: list[dict[str, Any]] = []

        def add(role: str, block: dict[str, Any]) -> None:
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": role, "content": [block]})

        current = answering(request.messages)
        for index, message in enumerate(request.messages):
            match message:
                case UserTurn(parts=parts) if parts:
                    wire = self._wire_parts(request, message, index >= current)
                    for part in wire:
                        add("user", _part(part))
                case UserTurn(content=content):
                    add("user", {"type": "text", "text": content})
                case AssistantTurn(content=content, tool_calls=calls, thoughts=thoughts):
                    if budget:
                        for thought in thoughts:
                            if not thought.source:  # another wire format's: not Anthropic's
                                add("assistant", _thinking_block(thought))
                    if content:
                        add("assistant", {"type": "text", "text": content})
                    for call in calls:
                        add(
                            "assistant",
                            {
                                "type": "tool_use",
                                "id": call.call_id,
                                "name": call.name,
                                "input": _input(call.arguments),
                            },
                        )
                case ToolTurn(call_id=call_id, content=content, is_error=is_error):
                    add(
                        "user",
                        {
                            "type": "tool_result",
                            "tool_use_id": call_id,
                            "content": content,
                            "is_error": is_error,
                        },
                    )
        for index in (-3, -1):
            if len(messages) >= -index:
                messages[index]["content"][-1]["cache_control"] = EPHEMERAL
        body: dict[str, Any] = {
            "model": request.model or self._model,
            "max_tokens": limit,
            "stream": True,
        }
        if budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if request.tools:
            tools: list[dict[str, Any]] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
            tools[-1]["cache_control"] = EPHEMERAL
            body["tools"] = tools
        if request.system:
            body["system"] = [{"type": "text", "text": request.system, "cache_control": EPHEMERAL}]
        body["messages"] = messages
        return body

    def _limits(self, request: ModelRequest) -> tuple[int, int]:
        """The thinking budget and ``max_tokens`` of `request` (see `body`)."""
        budget = THINKING_BUDGETS.get(request.thought_level or "off", 0)
        own = max(self._max_tokens, 2 * budget)
        limit = max(output_limit(request.max_output_tokens, own) or own, 1)
        if limit < own:  # the request asked for less: the thinking within half of it
            budget = min(budget, limit // 2)
            if budget < MIN_THINKING_BUDGET:
                budget = 0
        return budget, limit

    async def _chunks(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[StreamChunk, None]:
        blocks: dict[int, _Block] = {}  # by index
        usage: dict[str, int] = {}  # the latest figure of each count
        finish: Finish | None = None
        stopped = False
        async for event in events:
            if event.event == "ping":
                continue
            payload = self._object(event)
            kind = payload.get("type", event.event)
            if kind == "error":
                raise self._stream_error(payload.get("error"))
            if kind == "message_start":
                _counts(usage, (payload.get("message") or {}).get("usage"))
            elif kind == "content_block_start":
                block = payload.get("content_block") or {}
                blocks[int(payload.get("index", 0))] = _Block(
                    str(block.get("type", "")),
                    str(block.get("id", "")),
                    str(block.get("name", "")),
                    str(block.get("data", "")),  # a redacted block's, whole at its start
                )
            elif kind == "content_block_delta":
                delta = payload.get("delta") or {}
                index = int(payload.get("index", 0))
                match delta.get("type"):
                    case "text_delta":
                        yield TextDelta(str(delta.get("text", "")))
                    case "thinking_delta":
                        text = str(delta.get("thinking", ""))
                        blocks.setdefault(index, _Block("thinking")).text.append(text)
                        yield ReasoningDelta(text)
                    case "signature_delta":
                        signature = str(delta.get("signature", ""))
                        blocks.setdefault(index, _Block("thinking")).signature.append(signature)
                    case "input_json_delta":
                        json = str(delta.get("partial_json", ""))
                        blocks.setdefault(index, _Block("tool_use")).text.append(json)
            elif kind == "content_block_stop":
                ended = blocks.pop(int(payload.get("index", 0)), None)
                if ended is None:
                    continue
                text = "".join(ended.text)
                if ended.kind == "tool_use":
                    yield ToolCallChunk(ended.id, ended.name, text or "{}")
                elif ended.kind == "thinking":
                    yield Thought(text=text, signature="".join(ended.signature))
                elif ended.kind == "redacted_thinking":
                    yield Thought(redacted=text)
            elif kind == "message_delta":
                _counts(usage, payload.get("usage"))
                reason = (payload.get("delta") or {}).get("stop_reason")
                if reason:
                    finish = _finish(str(reason))
            elif kind == "message_stop":
                stopped = True
                break
        if not stopped:
            raise ModelError(
                f"{self._url}: the stream ended before the response finished", "truncated"
            )
        read = usage.get("cache_read_input_tokens", 0)
        written = usage.get("cache_creation_input_tokens", 0)
        yield Usage(
            input_tokens=usage.get("input_tokens", 0) + read + written,
            output_tokens=usage.get("output_tokens", 0),
            cache_read_tokens=read,
            cache_write_tokens=written,
        )
        yield finish or Finish("stop")


def _thinking_block(thought: Thought) -> dict[str, Any]:
    if thought.redacted:
        return {"type": "redacted_thinking", "data": thought.redacted}
    return {"type": "thinking", "thinking": thought.text, "signature": thought.signature}


class _Block:
    """A content block of the reply while it streams: its type, a ``tool_use``'s id and
    name, its text so far in parts (a tool call's input JSON, a thinking block's
    thinking, a redacted block's data) and a thinking block's signature."""

    __slots__ = ("id", "kind", "name", "signature", "text")

    def __init__(self, kind: str, id: str = "", name: str = "", text: str = "") -> None:
        self.kind = kind
        self.id = id
        self.name = name
        self.text = [text] if text else []
        self.signature: list[str] = []


def _counts(usage: dict[str, int], reported: object) -> None:
    """Take the counts of a ``usage`` object (``message_delta`` repeats some, cumulatively)."""
    if isinstance(reported, dict):
        for name, value in reported.items():
            if isinstance(value, int):
                usage[name] = value


def _input(arguments: str) -> object:
    try:
        return arguments_value(arguments)
    except msgspec.DecodeError:
        return {"_raw": arguments}


def _finish(reason: str) -> Finish:
    if reason in _FINISH:
        return Finish(_FINISH[reason])
    return Finish("error", f"the model stopped: {reason}")


def _part(part: WirePart) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    source = {"type": "base64", "media_type": part.mime_type, "data": part.data}
    return {"type": "image", "source": source}
