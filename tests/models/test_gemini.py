"""The Gemini adapter: the request it builds (contents, function declarations and responses,
thinking budgets, thought signatures sent back on their parts), the stream it reads (tests.wire's
chunks, after the API reference), and each bad stream ending the step as the other adapters end
it. Loopback servers over TLS on the real clock; the body and the event reader alone in virtual
time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from greenroom import open_runtime
from greenroom.models.base import ContextOverflow, ModelError, context_window_of
from greenroom.models.gemini import MINTED, GeminiModel
from greenroom.models.http import RetryableError
from greenroom.protocol.content import ImageRef, Text
from greenroom.protocol.events import COMPLETED, Errored, ToolResult
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    ModelRequest,
    ReasoningDelta,
    Retry,
    StreamChunk,
    TextDelta,
    Thought,
    ToolCallChunk,
    ToolSchema,
    ToolTurn,
    Usage,
    UserTurn,
)
from greenroom.session.persistence import JsonlPersistence
from tests.agents_helpers import turn_ends
from tests.bindings import FAST, KEY, SIGNATURE
from tests.models.test_pool import NOTE
from tests.sse_server import CutOff, Served, client_tls, sse_server
from tests.wire import events, gem, gem_sse, gem_usage

LIMIT = 10
LOOKUP = ToolSchema(
    "lookup",
    "look a word up",
    {"type": "object", "properties": {"word": {"type": "string"}}, "$defs": {}},
)
REQUEST = ModelRequest(messages=[UserTurn("hi")], system="be brief")


def model(
    url: str = "https://api.example.com/v1beta", name: str = "gemini-2.5-flash", **options: Any
) -> GeminiModel:
    return GeminiModel(url, KEY, name, backoff=FAST, verify=client_tls(), **options)


async def read(pieces: Sequence[bytes]) -> list[StreamChunk]:
    """The event reader alone over `pieces` (no socket): what `stream` would yield."""
    return [chunk async for chunk in model()._chunks(events(pieces))]


# -- the request --------------------------------------------------------------------------------


def test_the_body_is_the_history_as_contents() -> None:
    signed = ToolCallChunk("call_from_gemini", "lookup", '{"word": "trio"}')
    minted = ToolCallChunk(f"{MINTED}0a1b2c", "lookup", '{"word": "anyio"}')
    thoughts = [
        Thought(signature=SIGNATURE, source="gemini", item="call_from_gemini"),
        Thought(signature="TEXT-SIG", source="gemini"),
        Thought(text="Claude's", signature="EqQB"),  # another wire's: never sent here
    ]
    image = ImageRef(mime_type="image/png", size=3, sha256="ab" * 32)
    request = ModelRequest(
        messages=[
            UserTurn("see", [Text("look these up"), image]),
            AssistantTurn("Looking.", [signed, minted], thoughts),
            ToolTurn("call_from_gemini", "a library"),
            ToolTurn(f"{MINTED}0a1b2c", "no such word", is_error=True),
            UserTurn("and?"),
        ],
        system="be brief",
        tools=[LOOKUP],
        blobs={"ab" * 32: b"png"},
    )
    body = model().body(request)
    assert list(body) == ["generationConfig", "tools", "systemInstruction", "contents"]
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "lookup",
                    "description": "look a word up",
                    "parametersJsonSchema": LOOKUP.parameters,  # JSON Schema, as it is
                }
            ]
        }
    ]
    assert body["systemInstruction"] == {"parts": [{"text": "be brief"}]}
    assert body["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "look these up"},
                {"inlineData": {"mimeType": "image/png", "data": "cG5n"}},
            ],
        },
        {
            "role": "model",
            "parts": [
                {"text": "Looking.", "thoughtSignature": "TEXT-SIG"},
                {
                    "functionCall": {
                        "name": "lookup",
                        "args": {"word": "trio"},
                        "id": "call_from_gemini",
                    },
                    "thoughtSignature": SIGNATURE,
                },
                # An id greenroom made up is not Gemini's: never sent.
                {"functionCall": {"name": "lookup", "args": {"word": "anyio"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "lookup",
                        "response": {"output": "a library"},
                        "id": "call_from_gemini",
                    }
                },
                {"functionResponse": {"name": "lookup", "response": {"error": "no such word"}}},
                {"text": "and?"},
            ],
        },
    ]


def test_a_signature_without_text_goes_back_on_an_empty_text_part() -> None:
    thought = Thought(signature="TEXT-SIG", source="gemini")
    request = ModelRequest(messages=[UserTurn("a"), AssistantTurn("", [], [thought])])
    assert model().body(request)["contents"][1] == {
        "role": "model",
        "parts": [{"text": "", "thoughtSignature": "TEXT-SIG"}],
    }


@pytest.mark.parametrize(
    ("name", "level", "config"),
    [
        ("gemini-2.5-flash", "low", {"thinkingBudget": 1024, "includeThoughts": True}),
        ("gemini-2.5-pro", "medium", {"thinkingBudget": 8192, "includeThoughts": True}),
        ("gemini-3-pro-preview", "high", {"thinkingBudget": 24576, "includeThoughts": True}),
        ("gemini-2.5-flash", "off", {"thinkingBudget": 0}),
        ("gemini-2.5-flash-lite", "off", {"thinkingBudget": 0}),
        ("gemini-2.5-pro", "off", None),  # it cannot stop thinking: its default
        ("gemini-2.5-pro", None, None),
    ],
)
def test_the_thought_level_is_a_thinking_budget(
    name: str, level: str | None, config: dict[str, Any] | None
) -> None:
    body = model(name=name).body(ModelRequest(messages=[UserTurn("hi")], thought_level=level))
    assert body.get("generationConfig", {}).get("thinkingConfig") == config


def test_the_output_limit_caps_the_thinking_budget() -> None:
    request = ModelRequest(messages=[UserTurn("hi")], thought_level="high", max_output_tokens=6000)
    config = model(max_output_tokens=8000).body(request)["generationConfig"]
    assert config == {
        "maxOutputTokens": 6000,
        "thinkingConfig": {"thinkingBudget": 3000, "includeThoughts": True},
    }
    assert model(max_output_tokens=900).body(REQUEST)["generationConfig"] == {
        "maxOutputTokens": 900,
        "thinkingConfig": {"thinkingBudget": 0},
    }


def test_the_model_is_in_the_path_and_the_key_in_a_header() -> None:
    adapter = model("https://api.example.com/v1beta", "models/gemini-2.5-pro")
    assert adapter.url_of(REQUEST) == (
        "https://api.example.com/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    )
    other = ModelRequest(messages=[UserTurn("hi")], model="gemini-2.5-flash")
    assert adapter.url_of(other).endswith("/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    assert KEY not in repr(adapter)
    assert KEY not in adapter.url_of(REQUEST)


def test_the_families_context_windows() -> None:
    assert context_window_of("gemini-2.5-pro") == 1_048_576
    assert context_window_of("gemini-1.5-pro-002") == 2_097_152


# -- the stream ---------------------------------------------------------------------------------


async def test_thoughts_text_calls_and_signatures_stream_in_order() -> None:
    chunks = await read(
        gem_sse(
            gem([{"text": "**Looking**", "thought": True}]),
            gem([{"text": " it up.", "thought": True}]),
            gem([{"text": "Let me check."}]),
            gem(
                [
                    {
                        "functionCall": {"name": "lookup", "args": {"word": "trio"}, "id": "fc_1"},
                        "thoughtSignature": SIGNATURE,
                    },
                    {"functionCall": {"name": "lookup", "args": {"word": "anyio"}}},
                ],
                "STOP",
                gem_usage(1200, 40, cached=1000, thoughts=25),
            ),
        )
    )
    calls = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert chunks[:4] == [
        ReasoningDelta("**Looking**"),
        ReasoningDelta(" it up."),
        TextDelta("Let me check."),
        ToolCallChunk("fc_1", "lookup", '{"word":"trio"}'),
    ]
    assert chunks[4] == Thought(signature=SIGNATURE, source="gemini", item="fc_1")
    assert calls[1].call_id.startswith(MINTED)
    assert calls[1].arguments == '{"word":"anyio"}'
    assert chunks[-2:] == [
        Usage(input_tokens=1200, output_tokens=65, cache_read_tokens=1000, reasoning_tokens=25),
        Finish("tool-calls"),
    ]


async def test_a_text_replys_signature_comes_in_its_last_empty_part() -> None:
    chunks = await read(
        gem_sse(
            gem([{"text": "Hello"}]),
            gem([{"text": " world"}]),
            gem([{"text": "", "thoughtSignature": "TEXT-SIG"}], "STOP"),
        )
    )
    assert chunks == [
        TextDelta("Hello"),
        TextDelta(" world"),
        Thought(signature="TEXT-SIG", source="gemini"),
        Usage(input_tokens=25, output_tokens=9),
        Finish("stop"),
    ]


@pytest.mark.real_clock
async def test_signatures_and_ids_go_back_through_a_turn_and_a_resume(tmp_path: Path) -> None:
    call = {"functionCall": {"name": "note", "args": {"text": "x"}}, "thoughtSignature": SIGNATURE}
    replies = [
        Served(pieces=gem_sse(gem([call], "STOP"))),
        Served(pieces=gem_sse(gem([{"text": "Noted."}], "STOP"))),
        Served(pieces=gem_sse(gem([{"text": "You're welcome."}], "STOP"))),
    ]
    with trio.fail_after(LIMIT):
        async with sse_server(replies, tls=True) as server:
            adapter = model(server.url + "/v1beta")
            store = JsonlPersistence(tmp_path)
            async with open_runtime(model=adapter, tools=[NOTE], persistence=store) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
                await agent.send("take a note")
            async with open_runtime(model=adapter, tools=[NOTE], persistence=store) as rt:
                resumed = (await rt.agents.resume(agent_id="a", session_id="s")).agent
                await resumed.send("thanks")
    assert turn_ends(resumed.session.events) == [(1, COMPLETED), (2, COMPLETED)]
    (result,) = [e for e in resumed.session.events if isinstance(e, ToolResult)]
    assert result.content == "noted x"
    first, second, third = server.requests
    assert first.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert first.headers["x-goog-api-key"] == KEY
    response = {"functionResponse": {"name": "note", "response": {"output": "noted x"}}}
    exchange = [
        {"role": "model", "parts": [{**call, "thoughtSignature": SIGNATURE}]},
        {"role": "user", "parts": [response]},
    ]
    assert second.body["contents"][1:] == exchange
    assert third.body["contents"][1:3] == exchange  # read back from the log


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("MAX_TOKENS", Finish("max-tokens")),
        ("SAFETY", Finish("refusal")),
        ("RECITATION", Finish("refusal")),
        ("MALFORMED_FUNCTION_CALL", Finish("error", "the model stopped: MALFORMED_FUNCTION_CALL")),
        ("SOMETHING_NEW", Finish("error", "the model stopped: SOMETHING_NEW")),
    ],
)
async def test_a_finish_reason_says_how_the_reply_ended(reason: str, finish: Finish) -> None:
    chunks = await read(gem_sse(gem([{"text": "cut sh"}], reason)))
    assert chunks[-1] == finish


async def test_a_blocked_prompt_is_a_refusal() -> None:
    blocked = {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}, "usageMetadata": {}}
    assert await read(gem_sse(blocked)) == [
        Usage(),
        Finish("refusal", "the prompt was blocked: PROHIBITED_CONTENT"),
    ]


async def test_an_empty_reply_finishes_stop() -> None:
    chunks = await read(gem_sse(gem([], "STOP")))
    assert chunks[-1] == Finish("stop")
    assert not any(isinstance(c, TextDelta) for c in chunks)


async def test_a_stream_without_a_finish_is_truncated() -> None:
    with pytest.raises(ModelError, match="ended before the response finished") as caught:
        await read(gem_sse(gem([{"text": "Hello"}])))
    assert caught.value.code == "truncated"


async def test_unknown_fields_are_skipped_and_a_wrong_type_is_named() -> None:
    odd = gem([{"text": "Hello", "videoMetadata": {"fps": 2}}], "STOP")
    odd["candidates"][0]["groundingMetadata"] = {"webSearchQueries": ["x"]}
    odd["sdkHttpResponse"] = 5
    assert (await read(gem_sse(odd)))[0] == TextDelta("Hello")
    with pytest.raises(ModelError, match="malformed 'message' event") as caught:
        await read(gem_sse({"candidates": [{"content": {"parts": [{"text": 5}]}}]}))
    assert caught.value.code == "malformed"


async def test_arguments_nested_past_the_decoders_depth_are_malformed() -> None:
    deep = '{"candidates": [{"content": {"parts": [{"functionCall": {"name": "a", "args": {"x": '
    deep += "[" * 100_000 + "]" * 100_000 + "}}}]}}]}"
    with pytest.raises(ModelError, match="malformed 'message' event") as caught:
        await read([f"data: {deep}\r\n\r\n".encode()])
    assert caught.value.code == "malformed"


async def test_an_error_in_the_stream_names_its_status() -> None:
    busy = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    with pytest.raises(RetryableError, match="error in the stream: UNAVAILABLE: overloaded"):
        await read(gem_sse(busy))
    bad = {"error": {"code": 400, "message": "bad part", "status": "INVALID_ARGUMENT"}}
    with pytest.raises(ModelError, match="INVALID_ARGUMENT: bad part") as caught:
        await read(gem_sse(gem([{"text": "a"}]), bad))
    assert not isinstance(caught.value, RetryableError)


@pytest.mark.real_clock
async def test_a_busy_error_after_text_is_not_retried() -> None:
    busy = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    pieces = gem_sse(gem([{"text": "Hello"}]), busy)
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=pieces), Served(pieces=pieces)], tls=True) as server,
            open_runtime(model=model(server.url + "/v1beta")) as rt,
        ):
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            await agent.send("talk")
    ((_, reason),) = turn_ends(agent.session.events)
    assert isinstance(reason, Errored)
    assert reason.code == "UNAVAILABLE"
    assert len(server.requests) == 1


@pytest.mark.real_clock
async def test_an_unknown_model_a_bad_key_and_an_overlong_prompt_end_the_step() -> None:
    def error(status: int, message: str, kind: str) -> Served:
        body = {"error": {"code": status, "message": message, "status": kind}}
        return Served(status, body=json.dumps(body).encode())

    replies = [
        error(404, "models/gemini-9 is not found for API version v1beta", "NOT_FOUND"),
        error(
            400,
            "The input token count (1200000) exceeds the maximum number of tokens allowed"
            " (1048576).",
            "INVALID_ARGUMENT",
        ),
        error(403, "Permission denied", "PERMISSION_DENIED"),
    ]
    with trio.fail_after(LIMIT):
        async with sse_server(replies, tls=True) as server:
            adapter = model(server.url + "/v1beta", "gemini-9")
            with pytest.raises(ModelError, match="HTTP 404: models/gemini-9 is not found"):
                await collect(adapter)
            with pytest.raises(ContextOverflow):
                await collect(adapter)
            with pytest.raises(ModelError, match="refused the credentials") as denied:
                await collect(adapter)
    assert denied.value.code == "unauthorized"
    assert len(server.requests) == 3


def quota(delay: object) -> Served:
    """A 429 that asks, in its body as Gemini does, to wait `delay`."""
    details = [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
    ]
    body = {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}
    body["error"]["details"] = details
    return Served(429, body=json.dumps(body).encode())


@pytest.mark.real_clock
async def test_a_rate_limit_waits_as_long_as_its_body_asks() -> None:
    replies = [
        quota(7),  # unreadable: the backoff's first delay, 0.01 s, instead
        quota("0.005s"),
        quota("34s"),
        Served(pieces=gem_sse(gem([{"text": "Hello"}], "STOP"))),
    ]
    chunks: list[StreamChunk] = []
    with trio.fail_after(LIMIT):
        async with sse_server(replies, tls=True) as server:
            with pytest.raises(ModelError, match=r"the next wait of 34\.0 s would pass the 1 s"):
                await collect_into(chunks, model(server.url + "/v1beta", retry_budget=1))
    assert [c.wait for c in chunks if isinstance(c, Retry)] == [0.01, 0.005]
    assert len(server.requests) == 3


async def collect(adapter: GeminiModel) -> list[StreamChunk]:
    return [c async for c in adapter.stream(REQUEST)]


@pytest.mark.real_clock
async def test_a_cut_mid_chunk_ends_the_step_with_the_text_kept() -> None:
    pieces = [*gem_sse(gem([{"text": "Hello"}])), b'data: {"candidates": [{"con', CutOff()]
    chunks: list[StreamChunk] = []
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=pieces)], tls=True) as server:
            with pytest.raises(ModelError) as caught:
                await collect_into(chunks, model(server.url + "/v1beta"))
    assert caught.value.code == "connection"
    assert chunks == [TextDelta("Hello")]


async def collect_into(chunks: list[StreamChunk], adapter: GeminiModel) -> None:
    async for chunk in adapter.stream(REQUEST):
        chunks.append(chunk)


PART = st.fixed_dictionaries(
    {},
    optional={
        "text": st.none() | st.text(max_size=5) | st.integers(),
        "thought": st.booleans() | st.none(),
        "thoughtSignature": st.text(max_size=5) | st.none(),
        "functionCall": st.none()
        | st.fixed_dictionaries(
            {"name": st.text(max_size=5)},
            optional={
                "args": st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                "id": st.none() | st.text(max_size=5),
            },
        ),
    },
)
CHUNK = st.fixed_dictionaries(
    {},
    optional={
        "candidates": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "content": st.fixed_dictionaries({}, optional={"parts": st.lists(PART)}),
                    "finishReason": st.sampled_from(["STOP", "MAX_TOKENS", "SAFETY", "X"]),
                },
            ),
            max_size=2,
        ),
        "usageMetadata": st.dictionaries(
            st.sampled_from(["promptTokenCount", "thoughtsTokenCount"]),
            st.integers(min_value=0, max_value=10**6),
        ),
        "promptFeedback": st.fixed_dictionaries({}, optional={"blockReason": st.text(max_size=5)}),
        "error": st.fixed_dictionaries(
            {}, optional={"code": st.integers(), "status": st.text(max_size=5)}
        ),
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(CHUNK | st.text(max_size=10), max_size=6))
def test_any_stream_ends_in_a_finish_or_a_model_error(chunks: list[Any]) -> None:
    """Whatever the server sends, the reader yields chunks and a finish, or raises a
    `ModelError` (or the retryable kind): never another exception."""

    async def main() -> None:
        pieces = [
            f"data: {c if isinstance(c, str) else json.dumps(c)}\r\n\r\n".encode() for c in chunks
        ]
        try:
            read_chunks = await read(pieces)
        except (ModelError, RetryableError):
            return
        assert isinstance(read_chunks[-1], Finish)

    trio.run(main)
