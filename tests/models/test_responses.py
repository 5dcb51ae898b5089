"""The OpenAI Responses adapter: the request it builds (stateless, reasoning items carried back),
the stream it reads (tests.wire's events, after the API reference), and each bad stream ending
the step as the other adapters end it. Loopback servers over TLS on the real clock; the body and
the event reader alone in virtual time.
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
from greenroom.models.base import ContextOverflow, ModelError
from greenroom.models.http import RetryableError
from greenroom.models.responses import OpenAIResponsesModel
from greenroom.protocol.content import ImageRef, Text
from greenroom.protocol.events import COMPLETED, AssistantMessage, Errored
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    ModelRequest,
    ReasoningDelta,
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
from tests.bindings import ENCRYPTED, FAST, KEY
from tests.models.test_pool import NOTE
from tests.sse_server import CutOff, Served, client_tls, sse, sse_server
from tests.wire import (
    events,
    rsp,
    rsp_call,
    rsp_created,
    rsp_end,
    rsp_failed,
    rsp_message,
    rsp_reasoning,
    rsp_usage,
)

LIMIT = 10
LOOKUP = ToolSchema("lookup", "look a word up", {"type": "object", "properties": {}})


def model(url: str = "https://api.example.com/v1", **options: Any) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(url, KEY, "gpt-5", backoff=FAST, verify=client_tls(), **options)


async def served(replies: list[Served], request: ModelRequest) -> tuple[list[StreamChunk], Any]:
    """The chunks of one call against `replies`, and the requests the server saw."""
    with trio.fail_after(LIMIT):
        async with sse_server(replies, tls=True) as server:
            chunks = [c async for c in model(server.url + "/v1").stream(request)]
    return chunks, server.requests


async def read(pieces: Sequence[bytes]) -> list[StreamChunk]:
    """The event reader alone over `pieces` (no socket): what `stream` would yield."""
    return [chunk async for chunk in model()._chunks(events(pieces))]


REQUEST = ModelRequest(messages=[UserTurn("hi")], system="be brief", session_id="s-1")

# -- the request --------------------------------------------------------------------------------


def test_the_body_is_the_history_as_input_items_stateless() -> None:
    mine = Thought(text="Plan.", signature=ENCRYPTED, source="openai-responses", item="rs_1")
    kept_none = Thought(text="Lost.", source="openai-responses", item="rs_2")
    claude = Thought(text="Claude's.", signature="EqQB")
    call = ToolCallChunk("call_1", "lookup", '{"word": "trio"}')
    request = ModelRequest(
        messages=[
            UserTurn("look it up"),
            AssistantTurn("Looking.", [call], [mine, kept_none, claude]),
            ToolTurn("call_1", "a library", is_error=False),
            UserTurn("and?"),
        ],
        system="be brief",
        tools=[LOOKUP],
        thought_level="medium",
        max_output_tokens=4000,
        session_id="s-1",
    )
    body = model(max_output_tokens=8000).body(request)
    assert list(body) == [
        "model",
        "stream",
        "store",
        "reasoning",
        "include",
        "max_output_tokens",
        "prompt_cache_key",
        "tools",
        "instructions",
        "input",
    ]
    assert body["store"] is False
    assert body["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["max_output_tokens"] == 4000  # the smaller of the request's and the adapter's
    assert body["tools"] == [
        {
            "type": "function",
            "name": "lookup",
            "description": "look a word up",
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
        }
    ]
    assert body["instructions"] == "be brief"
    # Only this wire's reasoning, and only with its encrypted content, goes back, ahead of
    # the reply's message and call.
    assert body["input"] == [
        {"role": "user", "content": "look it up"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Plan."}],
            "encrypted_content": ENCRYPTED,
        },
        {"role": "assistant", "content": "Looking."},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"word": "trio"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "a library"},
        {"role": "user", "content": "and?"},
    ]


@pytest.mark.parametrize(("level", "effort"), [("low", "low"), ("high", "high"), ("off", None)])
def test_the_thought_level_is_the_reasoning_effort(level: str, effort: str | None) -> None:
    body = model().body(ModelRequest(messages=[UserTurn("hi")], thought_level=level))
    assert body.get("reasoning", {}).get("effort") == effort
    assert ("include" in body) == (effort is not None)


def test_the_cache_key_is_a_digest_of_the_session() -> None:
    def key(session: str | None) -> object:
        return (
            model()
            .body(ModelRequest(messages=[UserTurn("hi")], session_id=session))
            .get("prompt_cache_key")
        )

    first = key("alice's session about taxes")
    assert isinstance(first, str)
    assert len(first) == 32
    assert "alice" not in first
    assert key("alice's session about taxes") == first  # stable: the cache routes by it
    assert key("another session") != first
    assert key(None) is None


def test_no_limit_anywhere_sends_none_and_the_adapters_own_caps_it() -> None:
    assert "max_output_tokens" not in model().body(REQUEST)
    assert model(max_output_tokens=900).body(REQUEST)["max_output_tokens"] == 900


def test_an_image_is_an_input_image() -> None:
    image = ImageRef(mime_type="image/png", size=3, sha256="ab" * 32)
    request = ModelRequest(
        messages=[UserTurn("see", [Text("see"), image])], blobs={"ab" * 32: b"png"}
    )
    assert model().body(request)["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "data:image/png;base64,cG5n"},
            ],
        }
    ]


# -- the stream ---------------------------------------------------------------------------------


@pytest.mark.real_clock
async def test_a_reasoning_reply_streams_its_summary_and_keeps_its_item() -> None:
    pieces = rsp(
        *rsp_created(),
        *rsp_reasoning(0, ["**Plan**\n\nLook it up.", "**Check**\n\nIt is."], ENCRYPTED),
        *rsp_message(1, ["Trio", " is a library."]),
        rsp_end(rsp_usage(1500, 300, cached=1200, reasoning=256)),
    )
    chunks, requests = await served([Served(pieces=pieces)], REQUEST)
    assert "".join(c.text for c in chunks if isinstance(c, ReasoningDelta)) == (
        "**Plan**\n\nLook it up.\n\n**Check**\n\nIt is."
    )
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Trio is a library."
    assert [c for c in chunks if isinstance(c, Thought)] == [
        Thought(
            text="**Plan**\n\nLook it up.\n\n**Check**\n\nIt is.",
            signature=ENCRYPTED,
            source="openai-responses",
            item="rs_68af1b",
        )
    ]
    assert [c for c in chunks if isinstance(c, Usage)] == [
        Usage(input_tokens=1500, output_tokens=300, cache_read_tokens=1200, reasoning_tokens=256)
    ]
    assert chunks[-1] == Finish("stop")
    (seen,) = requests
    assert seen.path == "/v1/responses"
    assert seen.headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.real_clock
async def test_reasoning_goes_back_ahead_of_its_call_through_a_turn_and_a_resume(
    tmp_path: Path,
) -> None:
    step_1 = rsp(
        *rsp_created(),
        *rsp_reasoning(0, ["Take a note."], ENCRYPTED),
        *rsp_call(1, "call_1", "note", ['{"text": ', '"x"}']),
        rsp_end(),
    )
    answer = rsp(*rsp_created(), *rsp_message(0, ["Noted."]), rsp_end())
    replies = [Served(pieces=step_1), Served(pieces=answer), Served(pieces=answer)]
    with trio.fail_after(LIMIT):
        async with sse_server(replies, tls=True) as server:
            adapter = model(server.url + "/v1")
            store = JsonlPersistence(tmp_path)
            async with open_runtime(model=adapter, tools=[NOTE], persistence=store) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
                agent.configure("thought_level", "high")
                await agent.send("take a note")
            async with open_runtime(model=adapter, tools=[NOTE], persistence=store) as rt:
                resumed = (await rt.agents.resume(agent_id="a", session_id="s")).agent
                await resumed.send("thanks")
    assert turn_ends(resumed.session.events) == [(1, COMPLETED), (2, COMPLETED), (3, COMPLETED)]
    _, second, third = (seen.body for seen in server.requests)
    reasoning = {
        "type": "reasoning",
        "id": "rs_68af1b",
        "summary": [{"type": "summary_text", "text": "Take a note."}],
        "encrypted_content": ENCRYPTED,
    }
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "note",
        "arguments": '{"text": "x"}',
    }
    result = {"type": "function_call_output", "call_id": "call_1", "output": "noted x"}
    assert second["input"][1:] == [reasoning, call, result]
    # Read back from the log after the restart, byte for byte the same items.
    assert third["input"][1:4] == [reasoning, call, result]
    assert third["prompt_cache_key"] == second["prompt_cache_key"]
    (first_message, *_) = [e for e in resumed.session.events if isinstance(e, AssistantMessage)]
    assert first_message.reasoning == "Take a note."


async def test_a_reasoning_item_without_encrypted_content_is_not_kept() -> None:
    chunks = await read(
        rsp(*rsp_created(), *rsp_reasoning(0, ["Hm."], None), *rsp_message(1, ["Ok."]), rsp_end())
    )
    assert not any(isinstance(c, Thought) for c in chunks)
    assert [c.text for c in chunks if isinstance(c, ReasoningDelta)] == ["Hm."]


# -- bad input ----------------------------------------------------------------------------------


async def test_unknown_events_and_events_without_a_name_are_read_by_their_type() -> None:
    unnamed = rsp_message(0, ["Hello"])[2]  # an output_text.delta, without its `event:` line
    chunks = await read(
        [
            *rsp(*rsp_created()),
            *rsp({"type": "response.web_search_call.in_progress", "output_index": 0}),
            *rsp({"type": "response.reasoning_summary.delta", "delta": {"text": "an object"}}),
            *rsp({"type": "response.future_kind", "delta": 5, "item": "odd"}),
            *sse(unnamed),
            *rsp(rsp_end()),
        ]
    )
    assert [c for c in chunks if isinstance(c, TextDelta)] == [TextDelta("Hello")]
    assert chunks[-1] == Finish("stop")


async def test_a_call_whose_arguments_never_close_is_passed_on_as_written() -> None:
    chunks = await read(
        rsp(*rsp_created(), *rsp_call(0, "call_1", "lookup", ['{"word": "tr']), rsp_end())
    )
    assert [c for c in chunks if isinstance(c, ToolCallChunk)] == [
        ToolCallChunk("call_1", "lookup", '{"word": "tr')  # the tool refuses it, naming it
    ]
    assert chunks[-1] == Finish("tool-calls")


async def test_an_empty_reply_finishes_stop() -> None:
    assert await read(rsp(*rsp_created(), rsp_end(rsp_usage(10, 0)))) == [
        Usage(input_tokens=10),
        Finish("stop"),
    ]


async def test_a_refusal_streams_as_text_and_finishes_refusal() -> None:
    refusal = {
        "type": "response.refusal.delta",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": "I can't help with that.",
    }
    chunks = await read(rsp(*rsp_created(), refusal, rsp_end()))
    assert [c for c in chunks if isinstance(c, TextDelta)] == [TextDelta("I can't help with that.")]
    assert chunks[-1] == Finish("refusal")


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("max_output_tokens", Finish("max-tokens")),
        ("content_filter", Finish("refusal")),
        ("something_new", Finish("error", "the response is incomplete: something_new")),
    ],
)
async def test_an_incomplete_response_says_why(reason: str, finish: Finish) -> None:
    chunks = await read(
        rsp(*rsp_created(), *rsp_message(0, ["cut sh"]), rsp_end(incomplete=reason))
    )
    assert chunks[-1] == finish


async def test_a_stream_without_its_final_event_is_truncated() -> None:
    with pytest.raises(ModelError, match="ended before the response finished") as caught:
        await read(rsp(*rsp_created(), *rsp_message(0, ["Hello"])))
    assert caught.value.code == "truncated"


async def test_a_field_of_the_wrong_type_names_the_event() -> None:
    bad = {"type": "response.output_text.delta", "delta": 5}
    with pytest.raises(
        ModelError, match=r"malformed 'response\.output_text\.delta' event"
    ) as caught:
        await read(rsp(*rsp_created(), bad))
    assert caught.value.code == "malformed"


async def test_failures_in_the_stream_name_the_provider_and_its_message() -> None:
    with pytest.raises(ModelError, match=r"response\.failed: invalid_prompt: flagged") as failed:
        await read(rsp(*rsp_created(), rsp_failed("invalid_prompt", "flagged")))
    assert not isinstance(failed.value, RetryableError)
    error = {"type": "error", "code": "server_error", "message": "busy", "param": None}
    with pytest.raises(RetryableError, match="error event: server_error: busy"):
        await read(rsp(*rsp_created(), error))


@pytest.mark.real_clock
async def test_a_server_error_event_after_text_is_not_retried() -> None:
    error = {"type": "error", "code": "server_error", "message": "busy", "param": None}
    pieces = rsp(*rsp_created(), *rsp_message(0, ["Hello"])[:3], error)
    chunks: list[StreamChunk] = []
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=pieces), Served(pieces=pieces)], tls=True) as server:
            with pytest.raises(ModelError, match="server_error: busy") as caught:
                await collect_into(chunks, model(server.url + "/v1"))
    assert caught.value.code == "server_error"
    assert chunks == [TextDelta("Hello")]
    assert len(server.requests) == 1


@pytest.mark.real_clock
async def test_an_unknown_model_and_an_overlong_prompt_end_the_step() -> None:
    unknown = Served(
        404,
        body=json.dumps(
            {
                "error": {
                    "message": "The model `gpt-9` does not exist or you do not have access to it.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "model_not_found",
                }
            }
        ).encode(),
    )
    overlong = Served(
        400,
        body=b'{"error": {"message": "Your input exceeds the context window of this model.",'
        b' "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}',
    )
    with trio.fail_after(LIMIT):
        async with sse_server([unknown, overlong], tls=True) as server:
            with pytest.raises(ModelError, match=r"HTTP 404: The model `gpt-9` does not exist"):
                await read_all(model(server.url + "/v1"))
            with pytest.raises(ContextOverflow):
                await read_all(model(server.url + "/v1"))
    assert len(server.requests) == 2


async def read_all(adapter: OpenAIResponsesModel) -> list[StreamChunk]:
    return [c async for c in adapter.stream(REQUEST)]


async def collect_into(chunks: list[StreamChunk], adapter: OpenAIResponsesModel) -> None:
    async for chunk in adapter.stream(REQUEST):
        chunks.append(chunk)


@pytest.mark.real_clock
async def test_a_cut_mid_event_ends_the_turn_with_the_text_kept() -> None:
    pieces = [*rsp(*rsp_created(), *rsp_message(0, ["Hello"])[:3]), CutOff()]
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=pieces)], tls=True) as server,
            open_runtime(model=model(server.url + "/v1")) as rt,
        ):
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            agent.send("talk")
            await agent.when_idle()
    ((_, reason),) = turn_ends(agent.session.events)
    assert isinstance(reason, Errored)
    assert reason.code == "connection"


#: Event types the reader acts on, and a few it skips.
KINDS = [
    "response.created",
    "response.output_text.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_part.added",
    "response.refusal.delta",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
    "message",
    "response.web_search_call.completed",
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["delta", "item", "response", "type", "usage", "code", "summary_index"]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), JSON | st.text(max_size=10)), max_size=8))
def test_any_stream_ends_in_a_finish_or_a_model_error(events: list[tuple[str, Any]]) -> None:
    """Whatever the server sends, the reader yields chunks and a finish, or raises a
    `ModelError` (or the retryable kind): never another exception."""

    async def main() -> None:
        pieces = [
            f"event: {kind}\ndata: {data if isinstance(data, str) else json.dumps(data)}\n\n"
            for kind, data in events
        ]
        try:
            chunks = await read([piece.encode() for piece in pieces])
        except (ModelError, RetryableError):
            return
        assert isinstance(chunks[-1], Finish)

    trio.run(main)
