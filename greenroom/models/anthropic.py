"""`AnthropicModel`: the Messages API streaming wire format, natively on Trio over httpx2
(see `greenroom.models.http`).

Requires the ``anthropic`` extra (``pip install 'greenroom[anthropic]'``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

import msgspec

from greenroom.backoff import Backoff
from greenroom.models.base import ModelError
from greenroom.models.http import (
    DEFAULT_BACKOFF,
    DEFAULT_CONTEXT_WINDOW,
    HttpModel,
    endpoint,
)
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

API_VERSION: Final = "2023-06-01"
DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
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
    ``greenroom`` command (`greenroom.models.http.endpoint`).
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        max_tokens: int = 8192,
        attempts: int = 4,
        backoff: Backoff = DEFAULT_BACKOFF,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
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
            attempts,
            backoff,
            context_window,
        )
        self._max_tokens = max_tokens

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body: consecutive same-role turns merged, as the API requires."""
        messages: list[dict[str, Any]] = []

        def add(role: str, block: dict[str, Any]) -> None:
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": role, "content": [block]})

        for message in request.messages:
            match message:
                case UserTurn(content=content):
                    add("user", {"type": "text", "text": content})
                case AssistantTurn(content=content, tool_calls=calls):
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
        body: dict[str, Any] = {
            "model": request.model or self._model,
            "max_tokens": self._max_tokens,
            "messages": messages,
            "stream": True,
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        return body

    async def _stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        blocks: dict[int, list[str]] = {}  # index → [kind, id, name, input JSON so far]
        usage = [0, 0]
        finish: Finish | None = None
        stopped = False
        async with self._events(request) as events:
            async for event in events:
                if event.event == "ping":
                    continue
                payload = self._object(event)
                kind = payload.get("type", event.event)
                if kind == "error":
                    error = payload.get("error") or {}
                    raise ModelError(
                        f"{self._url}: error event: {error.get('message', error)}",
                        str(error.get("type", "error")),
                    )
                if kind == "message_start":
                    start_usage = (payload.get("message") or {}).get("usage") or {}
                    usage[0] = int(start_usage.get("input_tokens") or 0)
                elif kind == "content_block_start":
                    block = payload.get("content_block") or {}
                    blocks[int(payload.get("index", 0))] = [
                        str(block.get("type", "")),
                        str(block.get("id", "")),
                        str(block.get("name", "")),
                        "",
                    ]
                elif kind == "content_block_delta":
                    delta = payload.get("delta") or {}
                    match delta.get("type"):
                        case "text_delta":
                            yield TextDelta(str(delta.get("text", "")))
                        case "thinking_delta":
                            yield ReasoningDelta(str(delta.get("thinking", "")))
                        case "input_json_delta":
                            index = int(payload.get("index", 0))
                            blocks.setdefault(index, ["tool_use", "", "", ""])
                            blocks[index][3] += str(delta.get("partial_json", ""))
                elif kind == "content_block_stop":
                    entry = blocks.pop(int(payload.get("index", 0)), None)
                    if entry is not None and entry[0] == "tool_use":
                        yield ToolCallChunk(entry[1], entry[2], entry[3] or "{}")
                elif kind == "message_delta":
                    delta_usage = payload.get("usage") or {}
                    usage[1] = int(delta_usage.get("output_tokens") or usage[1])
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
        yield Usage(usage[0], usage[1])
        yield finish or Finish("stop")


def _input(arguments: str) -> object:
    try:
        return msgspec.json.decode(arguments) if arguments.strip() else {}
    except msgspec.DecodeError:
        return {"_raw": arguments}


def _finish(reason: str) -> Finish:
    if reason in _FINISH:
        return Finish(_FINISH[reason])
    return Finish("error", f"the model stopped: {reason}")
