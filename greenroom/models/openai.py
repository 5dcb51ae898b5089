"""`OpenAIChatModel`: the Chat Completions streaming wire format (OpenAI, vLLM, Ollama, llama.cpp,
DeepSeek and most gateways), natively on Trio over httpx2 (see `greenroom.models.http`).

Nothing beyond greenroom's own dependencies (the ``openai`` extra is kept, empty, for
``pip install 'greenroom[openai]'``).

Cache hits are read as OpenAI or DeepSeek reports them; a request's ``max_output_tokens``
goes as ``max_tokens``, or ``max_completion_tokens`` for the reasoning families;
OpenAI's wording of an over-long request is a `ContextOverflow` under any status code.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, ClassVar, Final

from greenroom.backoff import Backoff
from greenroom.models.base import ModelError, context_limit
from greenroom.models.http import (
    DEFAULT_BACKOFF,
    DEFAULT_RETRY_BUDGET,
    HttpModel,
    SseEvent,
    endpoint,
)
from greenroom.models.parts import WirePart, answering
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    ToolTurn,
    Usage,
    UserTurn,
)

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "max-tokens",
    "content_filter": "refusal",
}
#: The families that take only ``max_completion_tokens`` (OpenAI's reasoning models refuse
#: ``max_tokens``); every other model is sent ``max_tokens``, the name Ollama, LM Studio and
#: the older OpenAI-compatible servers know (OpenAI's other models take both).
COMPLETION_TOKENS_FAMILIES: Final = ("o1", "o3", "o4", "gpt-5")


class OpenAIChatModel(HttpModel):
    """Streams ``POST {base_url}/chat/completions``; tool calls assembled from their fragments.

    ``base_url`` and ``api_key`` default to ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY`` (the URL then to the public API), as in the
    ``greenroom`` command (`greenroom.models.http.endpoint`). ``retry_budget`` is
    the seconds one call may wait between attempts, in all; ``verify`` the TLS
    trust for the endpoint (default: the system's store, or ``SSL_CERT_FILE``);
    ``images`` whether the model takes images (default: its family's,
    `greenroom.models.parts.IMAGE_INPUT`): one that does not refuses a prompt's
    image before any request is made.
    """

    #: The GenAI semantic conventions' ``gen_ai.provider.name`` (`greenroom.tracing`), and
    #: the prefix of the environment variables the endpoint is read from.
    provider: ClassVar[str] = "openai"
    #: The base URL when none is given or set.
    default_url: ClassVar[str] = DEFAULT_BASE_URL

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        backoff: Backoff = DEFAULT_BACKOFF,
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        context_window: int | None = None,
        verify: ssl.SSLContext | None = None,
        images: bool | None = None,
    ) -> None:
        if not model:
            raise TypeError(f"{type(self).__name__}: name the model (model=...)")
        base_url, api_key = endpoint(base_url, api_key, self.provider, self.default_url)
        super().__init__(
            base_url + "/chat/completions",
            {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
            model,
            backoff=backoff,
            retry_budget=retry_budget,
            context_window=context_window,
            verify=verify,
            images=images,
        )

    def overflowed(self, kind: str | None, message: str) -> bool:
        """OpenAI's over-long request: a 400 with ``code: context_length_exceeded``, or a
        message in its wording ("maximum context length is N tokens") from a server that
        copies the text and not the code (vLLM answers ``BadRequestError``)."""
        return kind == "context_length_exceeded" or context_limit(message) is not None

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body for `request` (the wire's messages, tools, streaming options).

        OpenAI caches a prompt's longest prefix seen lately by itself; the body keeps
        that prefix byte-stable: fixed key order, tools ahead of the messages, the
        history derived from the log in its order, no clock in it.
        """
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        current = answering(request.messages)
        for index, message in enumerate(request.messages):
            match message:
                case UserTurn(parts=parts) if parts:
                    wire = self._wire_parts(request, message, index >= current)
                    messages.append({"role": "user", "content": [_part(p) for p in wire]})
                case UserTurn(content=content):
                    messages.append({"role": "user", "content": content})
                case AssistantTurn(content=content, tool_calls=calls):
                    entry: dict[str, Any] = {"role": "assistant", "content": content or None}
                    if calls:
                        entry["tool_calls"] = [
                            {
                                "id": call.call_id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments},
                            }
                            for call in calls
                        ]
                    messages.append(entry)
                case ToolTurn(call_id=call_id, content=content):
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        body: dict[str, Any] = {
            "model": request.model or self._model,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.thought_level in ("low", "medium", "high"):
            body["reasoning_effort"] = request.thought_level  # for a reasoning model
        if request.max_output_tokens is not None:  # reasoning included, as the API counts it
            model = body["model"]
            limit = "max_tokens"
            if model.startswith(COMPLETION_TOKENS_FAMILIES):
                limit = "max_completion_tokens"
            body[limit] = max(request.max_output_tokens, 1)
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        body["messages"] = messages
        return body

    async def _chunks(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[StreamChunk, None]:
        calls: dict[int, list[str]] = {}  # index → [id, name, arguments so far]
        finish: Finish | None = None
        async for event in events:
            if event.data == "[DONE]":
                break
            payload = self._object(event)
            if "error" in payload:
                raise self._stream_error(payload["error"])
            usage = payload.get("usage")
            if isinstance(usage, dict):
                yield _usage(usage)
            for choice in payload.get("choices") or ():
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    yield ReasoningDelta(str(reasoning))
                if delta.get("content"):
                    yield TextDelta(str(delta["content"]))
                for fragment in delta.get("tool_calls") or ():
                    entry = calls.setdefault(int(fragment.get("index", 0)), ["", "", ""])
                    function = fragment.get("function") or {}
                    entry[0] = fragment.get("id") or entry[0]
                    entry[1] += function.get("name") or ""
                    entry[2] += function.get("arguments") or ""
                reason = choice.get("finish_reason")
                if reason:
                    finish = _finish(str(reason))
        else:
            if finish is None:
                raise ModelError(
                    f"{self._url}: the stream ended before the response finished", "truncated"
                )
        for index in sorted(calls):
            call_id, name, arguments = calls[index]
            yield ToolCallChunk(call_id or f"call-{index}", name, arguments)
        yield finish or Finish("stop")


def _part(part: WirePart) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    return {"type": "image_url", "image_url": {"url": f"data:{part.mime_type};base64,{part.data}"}}


def _usage(usage: dict[str, Any]) -> Usage:
    """`Usage` of a chunk's ``usage`` (``prompt_tokens`` includes the cached ones: OpenAI's
    ``prompt_tokens_details.cached_tokens``, DeepSeek's ``prompt_cache_hit_tokens``)."""
    prompt = usage.get("prompt_tokens_details")
    completion = usage.get("completion_tokens_details")
    cached = (prompt or {}).get("cached_tokens") or usage.get("prompt_cache_hit_tokens")
    return Usage(
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cache_read_tokens=int(cached or 0),
        reasoning_tokens=int((completion or {}).get("reasoning_tokens") or 0),
    )


def _finish(reason: str) -> Finish:
    if reason in _FINISH:
        return Finish(_FINISH[reason])
    return Finish("error", f"the model stopped: {reason}")
