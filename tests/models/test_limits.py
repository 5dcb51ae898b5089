"""The output limit every adapter honours, and the window an over-long request's refusal names.

Bodies built by the adapters themselves (what goes on the wire); the echo's reply read.
"""

from __future__ import annotations

from typing import Any

import pytest

from greenroom.models.anthropic import AnthropicModel
from greenroom.models.base import context_limit
from greenroom.models.openai import OpenAIChatModel
from greenroom.models.scripted import ScriptedModel
from greenroom.protocol.model import Finish, ModelRequest, TextDelta, UserTurn


@pytest.mark.parametrize(
    ("message", "window"),
    [
        (
            "This model's maximum context length is 128000 tokens. However, your messages"
            " resulted in 131072 tokens. Please reduce the length of the messages.",
            128_000,
        ),
        ("prompt is too long: 211234 tokens > 200000 maximum", 200_000),
        (  # vLLM's, which counts the completion too
            "This model's maximum context length is 4096 tokens. However, you requested 5000"
            " tokens (4000 in the messages, 1000 in the completion).",
            4_096,
        ),
        ("This endpoint's maximum context length is 131,072 tokens.", 131_072),
        (
            "The input token count (1200000) exceeds the maximum number of tokens allowed"
            " (1048576).",
            1_048_576,
        ),
        ("the request exceeds the available context size", None),
        ("maximum context length is 0 tokens", None),
        ("", None),
    ],
)
def test_a_refusal_names_its_window_or_none(message: str, window: int | None) -> None:
    assert context_limit(message) == window


def _request(**fields: Any) -> ModelRequest:
    return ModelRequest(messages=[UserTurn("hello there you")], **fields)


def test_openai_sends_the_output_limit_under_the_name_its_model_takes() -> None:
    def body(model: str, **fields: Any) -> dict[str, Any]:
        return OpenAIChatModel("http://127.0.0.1:9", "sk-test", model).body(_request(**fields))

    assert "max_tokens" not in body("gpt-4o")
    assert "max_completion_tokens" not in body("gpt-4o")
    assert body("gpt-4o", max_output_tokens=600)["max_tokens"] == 600
    assert body("local-llama", max_output_tokens=600)["max_tokens"] == 600
    for reasoning in ("o3-mini", "o4-mini", "gpt-5-mini", "o1"):
        sent = body(reasoning, max_output_tokens=600, thought_level="high")
        assert sent["max_completion_tokens"] == 600, reasoning
        assert "max_tokens" not in sent


def test_anthropic_takes_the_smaller_limit_and_keeps_thinking_under_it() -> None:
    model = AnthropicModel("http://127.0.0.1:9", "sk-test", "claude-sonnet-4-5")

    def body(**fields: Any) -> dict[str, Any]:
        return model.body(_request(**fields))

    assert body()["max_tokens"] == 8_192
    assert body(max_output_tokens=600)["max_tokens"] == 600
    assert body(max_output_tokens=100_000)["max_tokens"] == 8_192  # never raised
    high = body(thought_level="high")
    assert (high["max_tokens"], high["thinking"]["budget_tokens"]) == (32_000, 16_000)
    lowered = body(thought_level="high", max_output_tokens=10_000)
    assert (lowered["max_tokens"], lowered["thinking"]["budget_tokens"]) == (10_000, 5_000)
    too_small = body(thought_level="low", max_output_tokens=2_000)  # half is under 1,024
    assert too_small["max_tokens"] == 2_000
    assert "thinking" not in too_small


async def test_the_echo_stops_at_the_output_limit() -> None:
    model = ScriptedModel(delay=0)
    request = ModelRequest(messages=[UserTurn("one two three four five")], max_output_tokens=2)
    chunks = [chunk async for chunk in model.stream(request)]
    assert chunks == [TextDelta("one "), TextDelta("two"), Finish("max-tokens")]


#: How servers refuse an over-long request: OpenAI's, vLLM's (OpenAI's wording under a code
#: of its own), Anthropic's.
REFUSALS = {
    "openai": {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your"
            " messages resulted in 9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
    "vllm": {
        "object": "error",
        "message": "This model's maximum context length is 4096 tokens. However, you requested"
        " 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the"
        " length of the messages or completion.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    },
    "anthropic": {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 211234 tokens > 200000 maximum",
        },
    },
}


@pytest.mark.real_clock
@pytest.mark.parametrize(
    ("server", "window"), [("openai", 8_192), ("vllm", 4_096), ("anthropic", 200_000)]
)
async def test_an_over_long_request_is_refused_naming_the_window(server: str, window: int) -> None:
    import json

    import trio

    from greenroom.models.base import ContextOverflow
    from tests.sse_server import Served, sse_server

    body = json.dumps(REFUSALS[server]).encode()  # vLLM's at the top level, not under "error"
    with trio.fail_after(10):
        async with sse_server([Served(400, body=body)]) as http:
            model: Any = (
                AnthropicModel(http.url, "sk-test", "claude-sonnet-4-5")
                if server == "anthropic"
                else OpenAIChatModel(http.url + "/v1", "sk-test", "local-model")
            )
            with pytest.raises(ContextOverflow) as refused:
                async for _ in model.stream(_request()):
                    pass
    assert refused.value.window == window
    assert refused.value.code == "context-overflow"
