"""DeepSeek and the servers that copy it: cache hits counted as cached input, the thinking switch,
``reasoning_content`` sent back with the calls it led to; the ``deepseek:`` shorthand and its
endpoint; and, for every adapter, a thought of another wire format never sent to it (a session
that changed models). tests.bindings' DeepSeek fixtures, after DeepSeek's API docs."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from greenroom import open_runtime
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.base import ContextOverflow, context_window_of
from greenroom.models.deepseek import DeepSeekModel
from greenroom.models.gemini import GeminiModel
from greenroom.models.http import HttpModel
from greenroom.models.named import model_named
from greenroom.models.openai import OpenAIChatModel
from greenroom.models.responses import OpenAIResponsesModel
from greenroom.protocol.events import COMPLETED
from greenroom.protocol.model import (
    AssistantTurn,
    ModelRequest,
    Thought,
    ToolCallChunk,
    ToolTurn,
    Usage,
    UserTurn,
)
from tests.agents_helpers import turn_ends
from tests.bindings import FAST, KEY, DeepSeek
from tests.models.test_pool import NOTE
from tests.sse_server import Served, client_tls, sse, sse_server
from tests.wire import oai, oai_call

LIMIT = 10


def model(url: str = "https://api.example.com", **options: Any) -> DeepSeekModel:
    return DeepSeekModel(
        url, KEY, "deepseek-v4-flash", backoff=FAST, verify=client_tls(), **options
    )


@pytest.mark.real_clock
async def test_cache_hits_count_as_cached_input_for_any_server_that_reports_them() -> None:
    usage = Usage(input_tokens=1200, output_tokens=40, cache_read_tokens=1000, reasoning_tokens=12)
    pieces = DeepSeek().text("Hi.", usage)
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=pieces), Served(pieces=pieces)], tls=True) as server:
            copied = OpenAIChatModel(server.url, KEY, "a-copy", verify=client_tls())
            for adapter in (model(server.url), copied):
                chunks = [c async for c in adapter.stream(ModelRequest(messages=[UserTurn("a")]))]
                assert [c for c in chunks if isinstance(c, Usage)] == [usage]
    assert server.requests[0].path == "/chat/completions"


@pytest.mark.parametrize(
    ("level", "thinking", "effort"),
    [("off", "disabled", None), (None, "disabled", None), ("high", "enabled", "high")],
)
def test_the_thought_level_switches_thinking(
    level: str | None, thinking: str, effort: str | None
) -> None:
    request = ModelRequest(messages=[UserTurn("hi")], thought_level=level, tools=[])
    body = model().body(request)
    assert body["thinking"] == {"type": thinking}
    assert body.get("reasoning_effort") == effort
    assert list(body)[-1] == "messages"


def test_reasoning_goes_back_on_its_own_message_only() -> None:
    call = ToolCallChunk("call_1", "note", '{"text": "x"}')
    mine = Thought(text="I should note it.", source="deepseek")
    request = ModelRequest(
        messages=[
            UserTurn("a"),
            AssistantTurn("", [call], [mine, Thought(text="Claude's", signature="EqQB")]),
            ToolTurn("call_1", "noted x"),
            AssistantTurn("Done.", []),
        ],
        thought_level="high",
    )
    replies = [m for m in model().body(request)["messages"] if m["role"] == "assistant"]
    assert replies[0]["reasoning_content"] == "I should note it."
    assert "reasoning_content" not in replies[1]


@pytest.mark.real_clock
async def test_a_thinking_tool_call_sends_its_reasoning_back() -> None:
    """DeepSeek answers 400 when a call's reasoning does not come back with it."""
    thinking_call = sse(
        oai({"role": "assistant", "content": None, "reasoning_content": "I should "}),
        oai({"reasoning_content": "note it."}),
        oai_call(0, "", "call_1", "note"),
        oai_call(0, '{"text": "x"}'),
        oai(finish="tool_calls"),
        "[DONE]",
    )
    answer = sse(oai({"content": "Noted."}), oai(finish="stop"), "[DONE]")
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=thinking_call), Served(pieces=answer)], tls=True) as server,
            open_runtime(model=model(server.url), tools=[NOTE]) as rt,
        ):
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            agent.configure("thought_level", "medium")
            await agent.send("take a note")
    assert turn_ends(agent.session.events)[-1] == (2, COMPLETED)
    first, second = (seen.body for seen in server.requests)
    assert first["thinking"] == {"type": "enabled"}
    assert first["reasoning_effort"] == "medium"
    (reply,) = [m for m in second["messages"] if m["role"] == "assistant"]
    assert reply["reasoning_content"] == "I should note it."
    assert reply["tool_calls"][0]["id"] == "call_1"


@pytest.mark.real_clock
async def test_an_overlong_prompt_is_a_context_overflow() -> None:
    overlong = Served(
        400,
        body=b'{"error": {"message": "This model\'s maximum context length is 131072 tokens.'
        b' However, you requested 140000 tokens.", "type": "invalid_request_error",'
        b' "param": null, "code": "invalid_request_error"}}',
    )
    with trio.fail_after(LIMIT):
        async with sse_server([overlong], tls=True) as server:
            with pytest.raises(ContextOverflow):
                async for _ in model(server.url).stream(ModelRequest(messages=[UserTurn("a")])):
                    pass


def test_the_environment_names_deepseeks_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEEPSEEK_BASE_URL", raising=False)
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    adapter = DeepSeekModel(model="deepseek-v4-pro")
    assert adapter.url_of(ModelRequest(messages=[])) == "https://api.deepseek.com/chat/completions"
    assert adapter.context_window == 1_000_000
    monkeypatch.delenv("DEEPSEEK_API_KEY")
    with pytest.raises(ValueError, match="DEEPSEEK_API_KEY"):
        DeepSeekModel(model="deepseek-chat")
    with pytest.raises(TypeError, match="DeepSeekModel: name the model"):
        DeepSeekModel(api_key=KEY)


def test_the_families_context_windows() -> None:
    assert context_window_of("deepseek-chat") == 128_000
    assert context_window_of("deepseek-reasoner") == 128_000
    assert context_window_of("deepseek-v4-flash") == 1_000_000


ENVIRON = {f"{kind}_API_KEY": KEY for kind in ("OPENAI", "ANTHROPIC", "GEMINI", "DEEPSEEK")}


@pytest.mark.parametrize(
    ("spec", "made"),
    [
        ("openai:gpt-4o", OpenAIChatModel),
        ("openai-responses:gpt-5", OpenAIResponsesModel),
        ("anthropic:claude-sonnet-4-5", AnthropicModel),
        ("gemini:gemini-2.5-pro", GeminiModel),
        ("deepseek:deepseek-v4-flash", DeepSeekModel),
    ],
)
def test_each_kind_of_model_spec_builds_its_adapter(spec: str, made: type[HttpModel]) -> None:
    adapter = model_named(spec, ENVIRON, context_window=64_000)
    assert type(adapter) is made
    assert isinstance(adapter, HttpModel)
    assert adapter.context_window == 64_000


@pytest.mark.parametrize(
    ("spec", "environ", "message"),
    [
        ("mistral:large", {}, "unknown model kind 'mistral' .known: scripted, openai, openai-res"),
        ("gemini:gemini-2.5-pro", {"OPENAI_API_KEY": "x"}, "needs GEMINI_API_KEY"),
        ("deepseek:", {"DEEPSEEK_API_KEY": "x"}, "name the model, as in deepseek:MODEL"),
        ("openai-responses:gpt-5", {"ANTHROPIC_API_KEY": "x"}, "needs OPENAI_API_KEY"),
        ("gemini:m", {"GEMINI_API_KEY": "x", "GEMINI_BASE_URL": "ftp://x"}, "http://"),
    ],
)
def test_new_model_specs_fail_clearly_at_start(
    spec: str, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        model_named(spec, environ)


THOUGHTS = [
    Thought(text="Claude's", signature="EqQB"),
    Thought(text="OpenAI's", signature="gAAAA", source="openai-responses", item="rs_1"),
    Thought(signature="CiQB", source="gemini"),
    Thought(text="DeepSeek's", source="deepseek"),
]
OWN = {
    AnthropicModel: "EqQB",
    OpenAIResponsesModel: "gAAAA",
    GeminiModel: "CiQB",
    DeepSeekModel: "DeepSeek's",
}


@pytest.mark.parametrize("made", list(OWN))
def test_an_adapter_sends_back_only_the_thoughts_of_its_own_wire(made: type[HttpModel]) -> None:
    """A session that changed models holds thoughts another provider would refuse."""
    adapter = made("https://api.example.com", KEY, "m")
    request = ModelRequest(
        messages=[UserTurn("a"), AssistantTurn("b", [], THOUGHTS), UserTurn("c")],
        thought_level="high",
    )
    sent = str(adapter.body(request))
    assert [mark for mark in ("EqQB", "gAAAA", "CiQB", "DeepSeek's") if mark in sent] == [OWN[made]]
