"""Thinking: the ``thought_level`` setting (off / low / medium / high) asks Anthropic for
extended thinking with its budget and OpenAI for a ``reasoning_effort``; thinking blocks, with
their signatures, and redacted blocks are kept in the log and sent back as they came, through
a tool-use turn and a resume; ACP shows and sets the option. Loopback servers over TLS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from greenroom import open_runtime
from greenroom.models.scripted import ScriptedModel
from greenroom.protocol.events import AssistantMessage, ConfigSet
from greenroom.protocol.model import ReasoningDelta, Thought
from greenroom.session.persistence import JsonlPersistence
from tests.acp_peer import bridge
from tests.models.test_adapters import LIMIT, STREAMS, adapter, sse_server
from tests.models.test_pool import NOTE
from tests.sse_server import Served, sse
from tests.wire import ant_block, ant_delta, ant_end, ant_start, ant_stop_block

SIGNATURE = "EqQBCgIYAhIMsig=="
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
THINKING = {"type": "thinking", "thinking": "The user wants a note.", "signature": SIGNATURE}


def thinking_then_call() -> list[bytes]:
    return sse(
        ant_start(),
        ant_block(0, {"type": "thinking", "thinking": ""}),
        ant_delta(0, {"type": "thinking_delta", "thinking": "The user "}),
        ant_delta(0, {"type": "thinking_delta", "thinking": "wants a note."}),
        ant_delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
        ant_stop_block(0),
        ant_block(1, {"type": "tool_use", "id": "c1", "name": "note", "input": {}}),
        ant_delta(1, {"type": "input_json_delta", "partial_json": '{"text": "x"}'}),
        ant_stop_block(1),
        *ant_end("tool_use"),
    )


def redacted_then_text() -> list[bytes]:
    return sse(
        ant_start(),
        ant_block(0, {"type": "redacted_thinking", "data": REDACTED}),
        ant_stop_block(0),
        ant_block(1, {"type": "text", "text": ""}),
        ant_delta(1, {"type": "text_delta", "text": "Noted."}),
        ant_stop_block(1),
        *ant_end("end_turn"),
    )


def assistant_contents(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [m["content"] for m in body["messages"] if m["role"] == "assistant"]


@pytest.mark.real_clock
async def test_thinking_blocks_round_trip_through_tool_use_and_a_resume(tmp_path: Path) -> None:
    replies = [
        Served(pieces=thinking_then_call()),
        Served(pieces=redacted_then_text()),
        Served(pieces=STREAMS["anthropic"]["text"]),
    ]
    with trio.fail_after(LIMIT):
        async with sse_server(replies) as server:
            model = adapter("anthropic", server.url)
            async with open_runtime(
                model=model, tools=[NOTE], persistence=JsonlPersistence(tmp_path)
            ) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
                agent.configure("thought_level", "medium")
                await agent.send("take a note")
            async with open_runtime(
                model=model, tools=[NOTE], persistence=JsonlPersistence(tmp_path)
            ) as rt:
                resumed = (await rt.agents.resume(agent_id="a", session_id="s")).agent
                await resumed.send("thanks")
    first, second, third = (seen.body for seen in server.requests)
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 8000}
    assert first["max_tokens"] == 16000
    # During tool use the reply's thinking block goes back ahead of its call, signed.
    assert assistant_contents(second) == [
        [THINKING, {"type": "tool_use", "id": "c1", "name": "note", "input": {"text": "x"}}]
    ]
    # After a restart, the thought level and both blocks are read back from the log.
    assert third["thinking"] == {"type": "enabled", "budget_tokens": 8000}
    assert assistant_contents(third) == [
        [THINKING, {"type": "tool_use", "id": "c1", "name": "note", "input": {"text": "x"}}],
        [{"type": "redacted_thinking", "data": REDACTED}, {"type": "text", "text": "Noted."}],
    ]
    messages = [e for e in resumed.session.events if isinstance(e, AssistantMessage)]
    assert messages[0].thoughts == [Thought(text="The user wants a note.", signature=SIGNATURE)]
    assert messages[0].reasoning == "The user wants a note."
    assert messages[1].thoughts == [Thought(redacted=REDACTED)]


@pytest.mark.real_clock
async def test_off_asks_for_no_thinking_and_sends_no_blocks_back() -> None:
    replies = [Served(pieces=thinking_then_call()), Served(pieces=STREAMS["anthropic"]["text"])]
    with trio.fail_after(LIMIT):
        async with (
            sse_server(replies) as server,
            open_runtime(model=adapter("anthropic", server.url), tools=[NOTE]) as rt,
        ):
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            await agent.send("take a note")
    first, second = (seen.body for seen in server.requests)
    assert "thinking" not in first
    assert first["max_tokens"] == 8192
    assert assistant_contents(second) == [
        [{"type": "tool_use", "id": "c1", "name": "note", "input": {"text": "x"}}]
    ]
    # The reasoning still streamed to whoever watches.
    assert any(isinstance(getattr(e, "chunk", None), ReasoningDelta) for e in agent.session.events)


@pytest.mark.real_clock
@pytest.mark.parametrize(("level", "effort"), [("high", "high"), ("low", "low"), ("off", None)])
async def test_openai_gets_a_reasoning_effort(level: str, effort: str | None) -> None:
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=STREAMS["openai"]["text"])]) as server,
            open_runtime(model=adapter("openai", server.url)) as rt,
        ):
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            agent.configure("thought_level", level)
            await agent.send("hi")
    (seen,) = server.requests
    assert seen.body.get("reasoning_effort") == effort


async def test_an_unknown_thought_level_is_refused_naming_the_levels() -> None:
    async with open_runtime(model=ScriptedModel()) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        with pytest.raises(ValueError, match=r"unknown thought_level 'max' \(known: off, low"):
            agent.configure("thought_level", "max")
        assert not any(isinstance(e, ConfigSet) for e in agent.session.events)


async def test_acp_shows_the_option_and_sets_it() -> None:
    async with bridge(None, ScriptedModel()) as b:
        answer = await b.peer.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        session = answer["result"]["sessionId"]
        (option,) = [o for o in answer["result"]["configOptions"] if o["id"] == "thought_level"]
        assert option["category"] == "thought_level"
        assert option["currentValue"] == "off"
        assert [c["value"] for c in option["options"]] == ["off", "low", "medium", "high"]
        params = {"sessionId": session, "configId": "thought_level", "value": "high"}
        answer = await b.peer.call("session/set_config_option", params)
        (option,) = [o for o in answer["result"]["configOptions"] if o["id"] == "thought_level"]
        assert option["currentValue"] == "high"
        refused = await b.peer.call("session/set_config_option", {**params, "value": "ultra"})
        assert refused["error"]["code"] == -32602
        assert "unknown thought_level 'ultra'" in refused["error"]["message"]
