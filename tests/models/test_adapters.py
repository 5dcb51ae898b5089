"""The OpenAI-compatible and Anthropic adapters against a loopback server speaking each wire format
over TLS (a test CA's certificate, trusted through ``verify=``).

Real sockets, so the real clock: every test bounds itself with ``trio.fail_after``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation
from greenroom.backoff import Backoff
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.base import ModelAdapter, ModelError
from greenroom.models.http import ModelConfigError
from greenroom.models.named import model_named
from greenroom.models.openai import OpenAIChatModel
from greenroom.protocol.events import COMPLETED, Aborted, AssistantChunk, Errored, ToolResult
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    ReasoningDelta,
    Retry,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    Usage,
    UserTurn,
)
from greenroom.tools import Tool
from tests.agents_helpers import new_agent, turn_ends
from tests.sse_server import CutOff, Hold, Pause, Served, SseServer, client_tls, sse
from tests.sse_server import sse_server as tls_server
from tests.wire import (
    ant_block,
    ant_delta,
    ant_end,
    ant_start,
    ant_stop_block,
    oai,
    oai_call,
    oai_usage,
)

pytestmark = pytest.mark.real_clock

LIMIT = 10
KEY = "sk-test-SECRET-1234"
FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)

PING = ("ping", {"type": "ping"})

STREAMS: dict[str, dict[str, list[bytes]]] = {
    "openai": {
        "text": sse(
            oai({"role": "assistant", "content": ""}),
            oai({"content": "Hello"}),
            oai({"content": " world"}),
            oai(finish="stop"),
            oai_usage(9, 2),
            "[DONE]",
        ),
        "tool": sse(
            oai({"role": "assistant", "content": None}),
            oai_call(0, "", "call_Ab12", "bash"),
            *[
                oai_call(0, part)
                for part in ['{"com', 'mand": ', '"ls -la"', ', "descr', 'iption": "list"}']
            ],
            oai(finish="tool_calls"),
            "[DONE]",
        ),
        "two-tools": sse(
            oai_call(0, "", "call_A", "read"),
            oai_call(1, "", "call_B", "bash"),
            oai_call(0, '{"path": '),
            oai_call(1, '{"command": "pwd"}'),
            oai_call(0, '"a.txt"}'),
            oai(finish="tool_calls"),
            "[DONE]",
        ),
        "reasoning": sse(
            oai({"reasoning_content": "Let me think."}),
            oai({"content": "Yes."}),
            oai(finish="stop"),
            "[DONE]",
        ),
        "length": sse(oai({"content": "cut sh"}), oai(finish="length"), "[DONE]"),
        "refusal": sse(oai({"content": "I can"}), oai(finish="content_filter"), "[DONE]"),
    },
    "anthropic": {
        "text": sse(
            ant_start(9),
            ant_block(0, {"type": "text", "text": ""}),
            PING,
            ant_delta(0, {"type": "text_delta", "text": "Hello"}),
            ant_delta(0, {"type": "text_delta", "text": " world"}),
            ant_stop_block(0),
            *ant_end("end_turn", 2),
        ),
        "tool": sse(
            ant_start(),
            ant_block(0, {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {}}),
            *[
                ant_delta(0, {"type": "input_json_delta", "partial_json": part})
                for part in ["", '{"com', 'mand": ', '"ls -la"', ', "descr', 'iption": "list"}']
            ],
            ant_stop_block(0),
            *ant_end("tool_use"),
        ),
        "two-tools": sse(
            ant_start(),
            ant_block(0, {"type": "tool_use", "id": "call_A", "name": "read", "input": {}}),
            ant_delta(0, {"type": "input_json_delta", "partial_json": '{"path": "a.txt"}'}),
            ant_stop_block(0),
            ant_block(1, {"type": "tool_use", "id": "call_B", "name": "bash", "input": {}}),
            ant_delta(1, {"type": "input_json_delta", "partial_json": '{"command": "pwd"}'}),
            ant_stop_block(1),
            *ant_end("tool_use"),
        ),
        "reasoning": sse(
            ant_start(),
            ant_block(0, {"type": "thinking", "thinking": ""}),
            ant_delta(0, {"type": "thinking_delta", "thinking": "Let me think."}),
            ant_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}),
            ant_stop_block(0),
            ant_block(1, {"type": "text", "text": ""}),
            ant_delta(1, {"type": "text_delta", "text": "Yes."}),
            ant_stop_block(1),
            *ant_end("end_turn"),
        ),
        "length": sse(
            ant_start(),
            ant_block(0, {"type": "text", "text": ""}),
            ant_delta(0, {"type": "text_delta", "text": "cut sh"}),
            ant_stop_block(0),
            *ant_end("max_tokens"),
        ),
        "refusal": sse(
            ant_start(),
            ant_block(0, {"type": "text", "text": ""}),
            ant_delta(0, {"type": "text_delta", "text": "I can"}),
            ant_stop_block(0),
            *ant_end("refusal"),
        ),
    },
}

ADAPTERS = ["openai", "anthropic"]
PATH = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
#: How many pieces of each "text" stream reach the first text delta ("Hello").
TO_HELLO = {"openai": 2, "anthropic": 4}


def adapter(kind: str, url: str, **options: Any) -> OpenAIChatModel | AnthropicModel:
    """`kind`'s adapter for the loopback server at `url` (trusting the test CA)."""
    options = {"backoff": FAST, "verify": client_tls(), **options}
    if kind == "openai":
        return OpenAIChatModel(url + "/v1", KEY, "gpt-4o-mini", **options)
    return AnthropicModel(url, KEY, "claude-sonnet-4-5", **options)


def sse_server(replies: Sequence[Served]) -> AbstractAsyncContextManager[SseServer]:
    """The loopback server, over TLS."""
    return tls_server(replies, tls=True)


REQUEST = ModelRequest(messages=[UserTurn("hi")], system="be brief")


async def collect(model: ModelAdapter, request: ModelRequest = REQUEST) -> list[StreamChunk]:
    return [chunk async for chunk in model.stream(request)]


def of(kind: type[Any], chunks: list[StreamChunk]) -> list[Any]:
    return [c for c in chunks if isinstance(c, kind)]


async def one_stream(kind: str, stream: str) -> list[StreamChunk]:
    """The chunks `kind`'s adapter makes of the canned stream `stream`, served once."""
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=STREAMS[kind][stream])]) as server:
            return await collect(adapter(kind, server.url))


# -- the wire formats --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_plain_text_and_usage(kind: str) -> None:
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=STREAMS[kind]["text"])]) as server:
            chunks = await collect(adapter(kind, server.url))
    assert "".join(c.text for c in of(TextDelta, chunks)) == "Hello world"
    assert of(Usage, chunks) == [Usage(9, 2)]
    assert chunks[-1] == Finish("stop")
    (seen,) = server.requests
    if kind == "openai":
        assert seen.path == "/v1/chat/completions"
        assert seen.headers["authorization"] == f"Bearer {KEY}"
        assert seen.body["messages"] == [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ]
        assert seen.body["stream"] is True
    else:
        assert seen.path == "/v1/messages"
        assert seen.headers["x-api-key"] == KEY
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.body["system"] == [
            {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
        ]
        assert seen.body["messages"] == [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            }
        ]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_tool_call_split_into_many_fragments(kind: str) -> None:
    chunks = await one_stream(kind, "tool")
    (call,) = of(ToolCallChunk, chunks)
    assert call.name == "bash"
    assert json.loads(call.arguments) == {"command": "ls -la", "description": "list"}
    assert call.call_id in ("call_Ab12", "toolu_01")
    assert chunks[-1] == Finish("tool-calls")


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_two_parallel_tool_calls(kind: str) -> None:
    chunks = await one_stream(kind, "two-tools")
    assert [(c.call_id, c.name, json.loads(c.arguments)) for c in of(ToolCallChunk, chunks)] == [
        ("call_A", "read", {"path": "a.txt"}),
        ("call_B", "bash", {"command": "pwd"}),
    ]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_reasoning_and_length_finish(kind: str) -> None:
    with trio.fail_after(LIMIT):
        async with sse_server(
            [Served(pieces=STREAMS[kind]["reasoning"]), Served(pieces=STREAMS[kind]["length"])]
        ) as server:
            thought = await collect(adapter(kind, server.url))
            cut = await collect(adapter(kind, server.url))
    assert [c.text for c in of(ReasoningDelta, thought)] == ["Let me think."]
    assert "".join(c.text for c in of(TextDelta, thought)) == "Yes."
    assert cut[-1] == Finish("max-tokens")


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_provider_refusal_finishes_refusal(kind: str) -> None:
    chunks = await one_stream(kind, "refusal")
    assert "".join(c.text for c in of(TextDelta, chunks)) == "I can"
    assert chunks[-1] == Finish("refusal")


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_429_with_retry_after_then_success(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    limited = Served(429, headers={"Retry-After": "0"}, body=b'{"error":{"message":"slow down"}}')
    with trio.fail_after(LIMIT), caplog.at_level(logging.WARNING, logger="greenroom.models"):
        async with sse_server([limited, Served(pieces=STREAMS[kind]["text"])]) as server:
            chunks = await collect(adapter(kind, server.url))
    assert chunks[-1] == Finish("stop")
    (retry,) = of(Retry, chunks)
    assert (retry.attempt, retry.wait, retry.code) == (1, 0.0, "http-429")
    assert retry.error == f"{server.url}{PATH[kind]} answered HTTP 429: slow down"
    assert len(server.requests) == 2
    assert "answered HTTP 429: slow down; retry 1 in 0.00 s" in caplog.text
    assert KEY not in caplog.text


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_500_twice_then_success(kind: str) -> None:
    broken = Served(500, body=b'{"error":{"message":"overloaded"}}')
    with trio.fail_after(LIMIT):
        async with sse_server([broken, broken, Served(pieces=STREAMS[kind]["text"])]) as server:
            chunks = await collect(adapter(kind, server.url))
    assert "".join(c.text for c in of(TextDelta, chunks)) == "Hello world"
    assert len(server.requests) == 3


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_401_is_a_configuration_error_without_retry_or_key(kind: str) -> None:
    denied = Served(401, body=b'{"error":{"message":"invalid x-api-key"}}')
    with trio.fail_after(LIMIT):
        async with sse_server([denied, denied]) as server:
            with pytest.raises(ModelConfigError) as caught:
                await collect(adapter(kind, server.url))
    assert server.url in str(caught.value)
    assert "refused the credentials (HTTP 401): invalid x-api-key" in str(caught.value)
    assert KEY not in str(caught.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_non_json_error_body_is_named(kind: str) -> None:
    gateway = Served(400, body=b"<html>Bad Gateway</html>")
    with trio.fail_after(LIMIT):
        async with sse_server([gateway]) as server:
            with pytest.raises(ModelError, match=r"HTTP 400: non-JSON body '<html>Bad Gateway"):
                await collect(adapter(kind, server.url))


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_stream_cut_mid_event_is_an_error(kind: str) -> None:
    pieces = [*STREAMS[kind]["text"][:3], CutOff()]
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=pieces)]) as server:
            model = adapter(kind, server.url)
            with pytest.raises(ModelError) as caught:
                await collect(model)
    assert caught.value.code == "connection"


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_malformed_event_is_an_error_naming_it(kind: str) -> None:
    pieces = [*STREAMS[kind]["text"][:2], b"event: content_block_delta\ndata: {not json\n\n"]
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=pieces)]) as server:
            with pytest.raises(ModelError, match="malformed 'content_block_delta' event"):
                await collect(adapter(kind, server.url))


# -- through the agent -----------------------------------------------------------------------------


class Command(msgspec.Struct):
    command: str


async def _run(args: Command, call: ToolInvocation) -> str:
    return f"ran {args.command}"


def _answer(kind: str) -> list[bytes]:
    if kind == "openai":
        return sse(oai({"content": "All listed."}), oai(finish="stop"), "[DONE]")
    return sse(
        ant_start(),
        ant_block(0, {"type": "text", "text": ""}),
        ant_delta(0, {"type": "text_delta", "text": "All listed."}),
        ant_stop_block(0),
        *ant_end("end_turn"),
    )


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_full_turn_with_a_tool_call_round_trips(kind: str) -> None:
    tool = Tool("bash", "run a command", Command, _run)
    with trio.fail_after(LIMIT):
        async with (
            sse_server(
                [Served(pieces=STREAMS[kind]["tool"]), Served(pieces=_answer(kind))]
            ) as server,
            open_runtime(model=adapter(kind, server.url), tools=[tool]) as rt,
        ):
            agent = await new_agent(rt)
            agent.send("list the files")
            await agent.when_idle()
    assert turn_ends(agent.session.events) == [(1, COMPLETED)]
    results = [e.content for e in agent.session.events if isinstance(e, ToolResult)]
    assert results == ["ran ls -la"]
    first, second = (seen.body for seen in server.requests)
    if kind == "openai":
        assert first["tools"][0]["function"]["name"] == "bash"
        assert second["messages"][-2]["tool_calls"][0]["id"] == "call_Ab12"
        assert second["messages"][-1] == {
            "role": "tool",
            "tool_call_id": "call_Ab12",
            "content": "ran ls -la",
        }
    else:
        assert first["tools"][0]["input_schema"]["required"] == ["command"]
        assert second["messages"][-2]["content"] == [
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": "bash",
                "input": {"command": "ls -la", "description": "list"},
            }
        ]
        assert second["messages"][-1] == {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": "ran ls -la",
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_cancel_mid_stream_closes_the_connection(kind: str) -> None:
    pieces = [*STREAMS[kind]["text"][: TO_HELLO[kind]], Pause(0.05), Hold()]
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=pieces)]) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            agent = await new_agent(rt)
            agent.send("talk")
            while not any(isinstance(e, AssistantChunk) for e in agent.session.events):
                await trio.sleep(0.01)
            agent.cancel("stop")
            await agent.when_idle()
            await server.client_left.wait()
    assert turn_ends(agent.session.events) == [(1, Aborted("stop"))]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_dropped_connection_keeps_the_partial_text(kind: str) -> None:
    pieces = [*STREAMS[kind]["text"][: TO_HELLO[kind]], CutOff()]
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=pieces)]) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            agent = await new_agent(rt)
            agent.send("talk")
            await agent.when_idle()
    ((_, reason),) = turn_ends(agent.session.events)
    assert isinstance(reason, Errored)
    assert "RemoteProtocolError" in reason.message or "ReadError" in reason.message
    partial = [e.chunk for e in agent.session.events if isinstance(e, AssistantChunk)]
    assert "Hello" in "".join(c.text for c in partial if isinstance(c, TextDelta))


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [OpenAIChatModel, AnthropicModel])
def test_a_base_url_without_scheme_is_refused(make: Callable[..., ModelAdapter]) -> None:
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        make("api.example.com/v1", KEY, "m")


@pytest.mark.parametrize("make", [OpenAIChatModel, AnthropicModel])
def test_the_key_never_shows_in_the_adapter_repr(make: Callable[..., ModelAdapter]) -> None:
    assert KEY not in repr(make("https://api.example.com", KEY, "m"))


@pytest.mark.parametrize(
    ("spec", "environ", "message"),
    [
        ("mistral:large", {}, "unknown model kind 'mistral'"),
        ("openai:gpt-4o", {}, "needs OPENAI_API_KEY"),
        ("anthropic:claude", {"OPENAI_API_KEY": "x"}, "needs ANTHROPIC_API_KEY"),
        ("openai:", {"OPENAI_API_KEY": "x"}, "name the model"),
        ("openai:m", {"OPENAI_API_KEY": "x", "OPENAI_BASE_URL": "localhost:8000"}, "http://"),
        ("scripted:soon", {}, "the delay must be seconds"),
    ],
)
def test_model_specs_fail_clearly_at_start(
    spec: str, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        model_named(spec, environ)


def test_model_specs_build_the_adapters() -> None:
    environ = {"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY}
    assert isinstance(model_named("openai:gpt-4o", environ), OpenAIChatModel)
    assert isinstance(model_named("anthropic:claude-sonnet-4-5", environ), AnthropicModel)
