"""`OpenAIResponsesModel`: OpenAI's Responses API streaming wire format (and the servers that
speak "Open Responses"), natively on Trio over httpx2 (see `greenroom.models.http`).

Stateless: every call sends the whole history (``store: false``), the reasoning items of
earlier replies among it, each with its encrypted content, so a reasoning model keeps its
reasoning between calls without the provider keeping anything.

Each session's requests carry one ``prompt_cache_key``.
"""

from __future__ import annotations

import hashlib
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
    RetryableError,
    SseEvent,
    endpoint,
    output_limit,
)
from greenroom.models.parts import WirePart, answering
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
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

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
#: `Thought.source` of a Responses reasoning item.
SOURCE: Final = "openai-responses"
#: Failure codes (of a ``response.failed`` or an ``error`` event in a 200 stream) worth
#: another attempt when nothing of the reply was streamed yet.
RETRIED_CODES: Final = frozenset({"server_error", "rate_limit_exceeded"})
_EFFORTS: Final = frozenset({"low", "medium", "high"})


class OpenAIResponsesModel(HttpModel):
    """Streams ``POST {base_url}/responses``; each output item emitted once it is done.

    ``base_url`` and ``api_key`` default to ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (the
    URL then to the public API), as in the ``greenroom`` command
    (`greenroom.models.http.endpoint`). ``max_output_tokens`` is the most a reply may
    spend, reasoning included (None: the model's own limit); a request's
    `ModelRequest.max_output_tokens` lowers it. ``retry_budget``, ``verify``,
    ``context_window`` and ``images`` as for `greenroom.models.openai.OpenAIChatModel`.
    """

    #: The GenAI semantic conventions' ``gen_ai.provider.name`` (`greenroom.tracing`).
    provider: ClassVar[str] = "openai"

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        max_output_tokens: int | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        context_window: int | None = None,
        verify: ssl.SSLContext | None = None,
        images: bool | None = None,
    ) -> None:
        if not model:
            raise TypeError("OpenAIResponsesModel: name the model (model=...)")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {max_output_tokens!r}")
        base_url, api_key = endpoint(base_url, api_key, "openai", DEFAULT_BASE_URL)
        super().__init__(
            base_url + "/responses",
            {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
            model,
            backoff=backoff,
            retry_budget=retry_budget,
            context_window=context_window,
            verify=verify,
            images=images,
        )
        self._max_output_tokens = max_output_tokens

    def overflowed(self, kind: str | None, message: str) -> bool:
        """OpenAI's over-long request: a 400 with ``code: context_length_exceeded``."""
        return kind == "context_length_exceeded"

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for `request`: the history as input items, stateless.

        The fixed options first, then ``tools``, ``instructions`` (the system prompt) and
        ``input``, so one request's bytes are a prefix of the next one's (OpenAI caches
        the longest prefix it saw lately, routed by ``prompt_cache_key``: a digest of the
        session's id, so a key names no session). A ``thought_level`` of low, medium or
        high sends ``reasoning: {effort, summary: "auto"}`` and asks for each reasoning
        item's encrypted content; off sends no ``reasoning``. Each earlier reply's
        reasoning items that came with encrypted content go back ahead of its message and
        calls, as they came; one without (a server that keeps none) cannot be sent back
        under ``store: false`` and is left out.
        """
        items: list[dict[str, Any]] = []
        current = answering(request.messages)
        for index, message in enumerate(request.messages):
            match message:
                case UserTurn(parts=parts) if parts:
                    wire = self._wire_parts(request, message, index >= current)
                    items.append({"role": "user", "content": [_part(p) for p in wire]})
                case UserTurn(content=content):
                    items.append({"role": "user", "content": content})
                case AssistantTurn(content=content, tool_calls=calls, thoughts=thoughts):
                    for thought in thoughts:
                        if thought.source == SOURCE and thought.signature:
                            items.append(_reasoning_item(thought))
                    if content:
                        items.append({"role": "assistant", "content": content})
                    for call in calls:
                        items.append(
                            {
                                "type": "function_call",
                                "call_id": call.call_id,
                                "name": call.name,
                                "arguments": call.arguments,
                            }
                        )
                case ToolTurn(call_id=call_id, content=content):
                    items.append(
                        {"type": "function_call_output", "call_id": call_id, "output": content}
                    )
        body: dict[str, Any] = {
            "model": request.model or self._model,
            "stream": True,
            "store": False,
        }
        if request.thought_level in _EFFORTS:
            body["reasoning"] = {"effort": request.thought_level, "summary": "auto"}
            body["include"] = ["reasoning.encrypted_content"]
        limit = output_limit(request.max_output_tokens, self._max_output_tokens)
        if limit is not None:
            body["max_output_tokens"] = limit
        if request.session_id:
            digest = hashlib.sha256(request.session_id.encode()).hexdigest()
            body["prompt_cache_key"] = digest[:32]
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": False,
                }
                for tool in request.tools
            ]
        if request.system:
            body["instructions"] = request.system
        body["input"] = items
        return body

    async def _chunks(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[StreamChunk, None]:
        """The reply's chunks: text and reasoning-summary deltas as they arrive, each
        function call and reasoning item once its ``response.output_item.done`` came, the
        usage and the finish from the final ``response.completed`` /
        ``response.incomplete``. Any other event type is skipped; an event without an
        ``event:`` line is told by its ``type``."""
        called = refused = False
        async for event in events:
            kind = event.event
            if kind == "message":  # a server that sends no `event:` lines
                kind = self._decode(_KIND, event).type
            if kind == "response.output_text.delta":
                delta = self._decode(_DELTA, event).delta
                if delta:
                    yield TextDelta(delta)
            elif kind == "response.reasoning_summary_text.delta":
                delta = self._decode(_DELTA, event).delta
                if delta:
                    yield ReasoningDelta(delta)
            elif kind == "response.reasoning_summary_part.added":
                if self._decode(_SUMMARY_PART, event).summary_index:
                    yield ReasoningDelta("\n\n")  # the summary's parts are paragraphs
            elif kind == "response.refusal.delta":
                refused = True
                delta = self._decode(_DELTA, event).delta
                if delta:
                    yield TextDelta(delta)
            elif kind == "response.output_item.done":
                item = self._decode(_ITEM_DONE, event).item
                if item.type == "function_call":
                    called = True
                    yield ToolCallChunk(item.call_id or item.id, item.name, item.arguments)
                elif item.type == "reasoning" and item.encrypted_content:
                    summary = "\n\n".join(part.text for part in item.summary)
                    yield Thought(
                        text=summary,
                        signature=item.encrypted_content,
                        source=SOURCE,
                        item=item.id,
                    )
            elif kind in ("response.completed", "response.incomplete"):
                response = self._decode(_RESPONSE_EVENT, event).response
                if response.usage is not None:
                    yield _usage(response.usage)
                if kind == "response.incomplete":
                    reason = (
                        response.incomplete_details.reason if response.incomplete_details else ""
                    )
                    yield _incomplete(reason)
                elif refused:
                    yield Finish("refusal")
                else:
                    yield Finish("tool-calls" if called else "stop")
                return
            elif kind == "response.failed":
                error = self._decode(_RESPONSE_EVENT, event).response.error or _Error()
                raise self._failure("response.failed", error.code, error.message)
            elif kind == "error":
                error = self._decode(_ERROR_EVENT, event)
                raise self._failure("error event", error.code, error.message)
        raise ModelError(f"{self._url}: the stream ended before the response finished", "truncated")

    def _failure(self, where: str, code: str | None, message: str) -> Exception:
        """What a failure in a 200 stream raises: `RetryableError` for a code in
        `RETRIED_CODES` (tried again if nothing was streamed yet), else `ModelError`."""
        text = f"{self._url}: {where}: {code or 'error'}: {message or 'no message'}"
        if code in RETRIED_CODES:
            return RetryableError(text, code)
        return ModelError(text, code or "error")


# -- the events read (each field as the API documents it; any other is skipped) -----------


class _Kind(msgspec.Struct, frozen=True, gc=False):
    type: str = ""


class _Delta(msgspec.Struct, frozen=True, gc=False):
    delta: str = ""


class _SummaryPart(msgspec.Struct, frozen=True, gc=False):
    summary_index: int = 0


class _SummaryText(msgspec.Struct, frozen=True, gc=False):
    text: str = ""


class _Item(msgspec.Struct, frozen=True, gc=False):
    type: str = ""
    id: str = ""
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    encrypted_content: str | None = None
    summary: list[_SummaryText] = []


class _ItemDone(msgspec.Struct, frozen=True, gc=False):
    item: _Item


class _InputDetails(msgspec.Struct, frozen=True, gc=False):
    cached_tokens: int = 0


class _OutputDetails(msgspec.Struct, frozen=True, gc=False):
    reasoning_tokens: int = 0


class _Usage(msgspec.Struct, frozen=True, gc=False):
    input_tokens: int = 0
    output_tokens: int = 0
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None


class _Incomplete(msgspec.Struct, frozen=True, gc=False):
    reason: str = ""


class _Error(msgspec.Struct, frozen=True, gc=False):
    code: str | None = None
    message: str = ""


class _Response(msgspec.Struct, frozen=True, gc=False):
    usage: _Usage | None = None
    incomplete_details: _Incomplete | None = None
    error: _Error | None = None


class _ResponseEvent(msgspec.Struct, frozen=True, gc=False):
    response: _Response


_KIND = msgspec.json.Decoder(_Kind)
_DELTA = msgspec.json.Decoder(_Delta)
_SUMMARY_PART = msgspec.json.Decoder(_SummaryPart)
_ITEM_DONE = msgspec.json.Decoder(_ItemDone)
_RESPONSE_EVENT = msgspec.json.Decoder(_ResponseEvent)
_ERROR_EVENT = msgspec.json.Decoder(_Error)


def _usage(usage: _Usage) -> Usage:
    """`Usage` of a response's ``usage`` (``input_tokens`` includes the cached ones,
    ``output_tokens`` the reasoning ones)."""
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.input_tokens_details.cached_tokens
        if usage.input_tokens_details
        else 0,
        reasoning_tokens=usage.output_tokens_details.reasoning_tokens
        if usage.output_tokens_details
        else 0,
    )


def _incomplete(reason: str) -> Finish:
    if reason == "max_output_tokens":
        return Finish("max-tokens")
    if reason == "content_filter":
        return Finish("refusal")
    return Finish("error", f"the response is incomplete: {reason or 'no reason given'}")


def _reasoning_item(thought: Thought) -> dict[str, Any]:
    summary = [{"type": "summary_text", "text": thought.text}] if thought.text else []
    return {
        "type": "reasoning",
        "id": thought.item,
        "summary": summary,
        "encrypted_content": thought.signature,
    }


def _part(part: WirePart) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "input_text", "text": part}
    return {"type": "input_image", "image_url": f"data:{part.mime_type};base64,{part.data}"}
