"""greenroom's adapters bound to the conformance suite (`greenroom.models.conformance`): each wire
format's replies built from the documented shapes in `tests.wire`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from greenroom.backoff import Backoff
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.base import ModelAdapter
from greenroom.models.deepseek import DeepSeekModel
from greenroom.models.gemini import GeminiModel
from greenroom.models.loopback import Piece
from greenroom.models.openai import OpenAIChatModel
from greenroom.models.responses import OpenAIResponsesModel
from greenroom.protocol.model import Usage
from tests.sse_server import sse
from tests.wire import (
    ant_block,
    ant_delta,
    ant_end,
    ant_start,
    ant_stop_block,
    gem,
    gem_sse,
    gem_usage,
    oai,
    oai_call,
    rsp,
    rsp_call,
    rsp_created,
    rsp_end,
    rsp_failed,
    rsp_message,
    rsp_reasoning,
    rsp_text_start,
    rsp_usage,
)

KEY = "sk-test-SECRET-1234"
FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)
ENCRYPTED = "gAAAAABpF3k2-ZfQ0x6m8w=="
SIGNATURE = "CiQBcsjafE2wm3yOBq8JhfD5Y9xgmQ=="


def halves(text: str) -> list[str]:
    """`text` as two deltas, cut after its first word."""
    head, space, tail = text.partition(" ")
    return [head, space + tail] if tail else [text]


class ChatCompletions:
    counts = frozenset({"input_tokens", "output_tokens", "cache_read_tokens", "reasoning_tokens"})

    def adapter(self, url: str) -> ModelAdapter:
        return OpenAIChatModel(url + "/v1", KEY, "gpt-4o-mini", backoff=FAST)

    def usage(self, usage: Usage) -> dict[str, Any]:
        return {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        }

    def text(self, text: str, usage: Usage) -> Sequence[Piece]:
        last = oai()
        last["choices"] = []
        last["usage"] = self.usage(usage)
        deltas = [oai({"content": part}) for part in halves(text)]
        return sse(oai({"role": "assistant", "content": ""}), *deltas, oai(finish="stop"), last)

    def partial(self, text: str) -> Sequence[Piece]:
        return sse(oai({"role": "assistant", "content": ""}), oai({"content": text}))

    def tool_call(self, call_id: str, name: str, arguments: str) -> Sequence[Piece]:
        cut = len(arguments) // 2
        return sse(
            oai_call(0, "", call_id, name),
            oai_call(0, arguments[:cut]),
            oai_call(0, arguments[cut:]),
            oai(finish="tool_calls"),
            "[DONE]",
        )

    def thinking(self, thought: str, text: str) -> Sequence[Piece]:
        return sse(
            oai({"role": "assistant", "content": None, "reasoning_content": thought}),
            oai({"content": text}),
            oai(finish="stop"),
            "[DONE]",
        )

    def overloaded(self) -> Sequence[Piece]:
        error = {"type": "overloaded_error", "message": "Overloaded"}  # as a gateway forwards it
        return sse(oai({"role": "assistant", "content": ""}), {"error": error})

    def error(self, status: int, message: str) -> bytes:
        kind = "rate_limit_exceeded" if status == 429 else "server_error"
        return json.dumps(
            {"error": {"message": message, "type": kind, "param": None, "code": None}}
        ).encode()

    def limits(self, body: Any) -> tuple[int | None, int | None]:
        return body.get("max_completion_tokens", body.get("max_tokens")), None

    def thinks(self, body: Any) -> bool:
        return "reasoning_effort" in body


class DeepSeek(ChatCompletions):
    """DeepSeek's Chat Completions, after its API docs (https://api-docs.deepseek.com:
    "Create Chat Completion" usage with ``prompt_cache_hit_tokens`` and
    ``prompt_cache_miss_tokens``, "Thinking Mode" with ``thinking`` and
    ``reasoning_content``), as documented on 2026-12-04."""

    def adapter(self, url: str) -> ModelAdapter:
        return DeepSeekModel(url, KEY, "deepseek-v4-flash", backoff=FAST)

    def usage(self, usage: Usage) -> dict[str, Any]:
        return {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "prompt_cache_hit_tokens": usage.cache_read_tokens,
            "prompt_cache_miss_tokens": usage.input_tokens - usage.cache_read_tokens,
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        }

    def thinks(self, body: Any) -> bool:
        return bool(body["thinking"]["type"] == "enabled")


class Anthropic:
    counts = frozenset({"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"})

    def adapter(self, url: str) -> ModelAdapter:
        return AnthropicModel(url, KEY, "claude-sonnet-4-5", backoff=FAST)

    def text(self, text: str, usage: Usage) -> Sequence[Piece]:
        start = ant_start()
        start[1]["message"]["usage"] = {
            "input_tokens": usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens,
            "cache_read_input_tokens": usage.cache_read_tokens,
            "cache_creation_input_tokens": usage.cache_write_tokens,
            "output_tokens": 1,
        }
        return sse(
            start,
            ant_block(0, {"type": "text", "text": ""}),
            *[ant_delta(0, {"type": "text_delta", "text": part}) for part in halves(text)],
            ant_stop_block(0),
            *ant_end("end_turn", usage.output_tokens),
        )

    def partial(self, text: str) -> Sequence[Piece]:
        return sse(
            ant_start(),
            ant_block(0, {"type": "text", "text": ""}),
            ant_delta(0, {"type": "text_delta", "text": text}),
        )

    def tool_call(self, call_id: str, name: str, arguments: str) -> Sequence[Piece]:
        return sse(
            ant_start(),
            ant_block(0, {"type": "tool_use", "id": call_id, "name": name, "input": {}}),
            ant_delta(0, {"type": "input_json_delta", "partial_json": arguments}),
            ant_stop_block(0),
            *ant_end("tool_use"),
        )

    def thinking(self, thought: str, text: str) -> Sequence[Piece]:
        return sse(
            ant_start(),
            ant_block(0, {"type": "thinking", "thinking": ""}),
            ant_delta(0, {"type": "thinking_delta", "thinking": thought}),
            ant_delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
            ant_stop_block(0),
            ant_block(1, {"type": "text", "text": ""}),
            ant_delta(1, {"type": "text_delta", "text": text}),
            ant_stop_block(1),
            *ant_end("end_turn"),
        )

    def overloaded(self) -> Sequence[Piece]:
        error = {"type": "overloaded_error", "message": "Overloaded"}
        return sse(ant_start(), ("error", {"type": "error", "error": error}))

    def error(self, status: int, message: str) -> bytes:
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    def limits(self, body: Any) -> tuple[int | None, int | None]:
        return body["max_tokens"], body.get("thinking", {}).get("budget_tokens")

    def thinks(self, body: Any) -> bool:
        return bool(body.get("thinking", {}).get("type") == "enabled")


class Responses:
    counts = frozenset({"input_tokens", "output_tokens", "cache_read_tokens", "reasoning_tokens"})

    def adapter(self, url: str) -> ModelAdapter:
        return OpenAIResponsesModel(url + "/v1", KEY, "gpt-5", backoff=FAST)

    def text(self, text: str, usage: Usage) -> Sequence[Piece]:
        counts = rsp_usage(
            usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.reasoning_tokens
        )
        return rsp(*rsp_created(), *rsp_message(0, halves(text)), rsp_end(counts))

    def partial(self, text: str) -> Sequence[Piece]:
        return rsp(*rsp_created(), *rsp_text_start(0, text))

    def tool_call(self, call_id: str, name: str, arguments: str) -> Sequence[Piece]:
        cut = len(arguments) // 2
        fragments = [arguments[:cut], arguments[cut:]]
        return rsp(*rsp_created(), *rsp_call(0, call_id, name, fragments), rsp_end())

    def thinking(self, thought: str, text: str) -> Sequence[Piece]:
        return rsp(
            *rsp_created(),
            *rsp_reasoning(0, [thought], ENCRYPTED),
            *rsp_message(1, [text]),
            rsp_end(),
        )

    def overloaded(self) -> Sequence[Piece]:
        message = "The server had an error while processing your request. Sorry about that!"
        return rsp(*rsp_created(), rsp_failed("server_error", message))

    def error(self, status: int, message: str) -> bytes:
        kind = "requests" if status == 429 else "server_error"
        return json.dumps(
            {"error": {"message": message, "type": kind, "param": None, "code": None}}
        ).encode()

    def limits(self, body: Any) -> tuple[int | None, int | None]:
        return body.get("max_output_tokens"), None

    def thinks(self, body: Any) -> bool:
        return "reasoning" in body


class Gemini:
    counts = frozenset({"input_tokens", "output_tokens", "cache_read_tokens", "reasoning_tokens"})

    def adapter(self, url: str) -> ModelAdapter:
        return GeminiModel(url + "/v1beta", KEY, "gemini-2.5-flash", backoff=FAST)

    def text(self, text: str, usage: Usage) -> Sequence[Piece]:
        counts = gem_usage(
            usage.input_tokens,
            usage.output_tokens - usage.reasoning_tokens,
            usage.cache_read_tokens,
            usage.reasoning_tokens,
        )
        head, *rest = halves(text)
        so_far = gem_usage(usage.input_tokens, 1, usage.cache_read_tokens, usage.reasoning_tokens)
        return gem_sse(
            gem([{"text": head}], usage=so_far),
            gem([{"text": "".join(rest)}], "STOP", counts),
        )

    def partial(self, text: str) -> Sequence[Piece]:
        return gem_sse(gem([{"text": text}]))

    def tool_call(self, call_id: str, name: str, arguments: str) -> Sequence[Piece]:
        call = {"name": name, "args": json.loads(arguments)}  # no id, as the API often sends
        return gem_sse(gem([{"functionCall": call, "thoughtSignature": SIGNATURE}], "STOP"))

    def thinking(self, thought: str, text: str) -> Sequence[Piece]:
        return gem_sse(
            gem([{"text": thought, "thought": True}]),
            gem([{"text": text}]),
            gem([{"text": "", "thoughtSignature": SIGNATURE}], "STOP", gem_usage(25, 9, 0, 30)),
        )

    def overloaded(self) -> Sequence[Piece]:
        message = "The model is overloaded. Please try again later."
        return gem_sse({"error": {"code": 503, "message": message, "status": "UNAVAILABLE"}})

    def error(self, status: int, message: str) -> bytes:
        kind = {429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}.get(status, "INTERNAL")
        return json.dumps({"error": {"code": status, "message": message, "status": kind}}).encode()

    def limits(self, body: Any) -> tuple[int | None, int | None]:
        config = body.get("generationConfig", {})
        return config.get("maxOutputTokens"), config.get("thinkingConfig", {}).get("thinkingBudget")

    def thinks(self, body: Any) -> bool:
        config = body.get("generationConfig", {}).get("thinkingConfig", {})
        return bool(config.get("thinkingBudget"))


BINDINGS = {
    "chat-completions": ChatCompletions(),
    "deepseek": DeepSeek(),
    "anthropic": Anthropic(),
    "responses": Responses(),
    "gemini": Gemini(),
}
