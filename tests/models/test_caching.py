"""Prompt caching: Anthropic's cache_control breakpoints, request bytes that stay a prefix of the
next request's (step to step, turn to turn, across a restart), and cache usage read from both
formats. Loopback servers over TLS.

Real sockets, so the real clock: every test bounds itself with ``trio.fail_after``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.actors.types import AgentOptions
from greenroom.protocol.model import Usage
from greenroom.session.persistence import JsonlPersistence
from tests.models.test_adapters import (
    ADAPTERS,
    LIMIT,
    _answer,
    adapter,
    collect,
    of,
    sse_server,
)
from tests.models.test_pool import NOTE, tool_call
from tests.sse_server import Seen, Served, sse
from tests.wire import ant_block, ant_delta, ant_end, ant_stop_block, oai, oai_usage

pytestmark = pytest.mark.real_clock

MARK = b'"cache_control":{"type":"ephemeral"}}'
OPTIONS = AgentOptions(system_prompt="You are terse.")


def two_turns(kind: str) -> list[Served]:
    """Turn 1: two tool calls, then an answer; turn 2: an answer."""
    return [
        Served(pieces=tool_call(kind, 1)),
        Served(pieces=tool_call(kind, 2)),
        Served(pieces=_answer(kind)),
        Served(pieces=_answer(kind)),
    ]


async def run_turns(kind: str, prompts: list[str], replies: list[Served]) -> list[Seen]:
    with trio.fail_after(LIMIT):
        async with (
            sse_server(replies) as server,
            open_runtime(model=adapter(kind, server.url), tools=[NOTE]) as rt,
        ):
            agent = (await rt.agents.create(agent_id="a", session_id="s", options=OPTIONS)).agent
            for prompt in prompts:
                agent.send(prompt)
                await agent.when_idle()
    return server.requests


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where a request's cache_control markers are, as paths."""
    found = [f"tools[{i}]" for i, t in enumerate(body.get("tools", ())) if "cache_control" in t]
    found += [f"system[{i}]" for i, b in enumerate(body.get("system", ())) if "cache_control" in b]
    for m, message in enumerate(body["messages"]):
        for b, block in enumerate(message["content"]):
            if "cache_control" in block:
                found.append(f"messages[{m}][{b}]")
    return found


async def test_the_breakpoints_are_tools_system_and_the_last_two_requests_ends() -> None:
    requests = await run_turns("anthropic", ["take notes", "and now?"], two_turns("anthropic"))
    assert [breakpoints(seen.body) for seen in requests] == [
        ["tools[0]", "system[0]", "messages[0][0]"],
        ["tools[0]", "system[0]", "messages[0][0]", "messages[2][0]"],
        ["tools[0]", "system[0]", "messages[2][0]", "messages[4][0]"],
        ["tools[0]", "system[0]", "messages[4][0]", "messages[6][0]"],
    ]
    # The cache's order: tools, then system, then the messages, also in the bytes.
    assert list(requests[0].body) == [
        "model",
        "max_tokens",
        "stream",
        "tools",
        "system",
        "messages",
    ]


def cached_part(kind: str, raw: bytes) -> bytes:
    """The bytes of a request that the next one must begin with: all of it but the closing
    brackets of its last block (Anthropic) or message list (OpenAI). Anthropic's markers are
    left out: they move on each step (the cache is keyed on the content, not on them)."""
    if kind == "openai":
        assert raw.endswith(b"}]}")
        return raw[:-2]
    content = raw.replace(b"," + MARK[:-1], b"")
    assert content.endswith(b"}]}]}")
    return content[:-4]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_each_request_begins_with_the_previous_ones_bytes(kind: str) -> None:
    """Step to step and turn to turn."""
    requests = await run_turns(kind, ["take notes", "and now?"], two_turns(kind))
    assert len(requests) == 4
    for before, after in itertools.pairwise(requests):
        prefix = cached_part(kind, before.raw)
        assert cached_part(kind, after.raw).startswith(prefix)
    if kind == "anthropic":  # and the marker that ended one request is still there in the next
        for before, after in itertools.pairwise(requests):
            end = before.raw.rindex(MARK) + len(MARK)
            marked = after.raw.find(before.raw[end - 200 : end])
            assert marked > 0


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_the_prefix_holds_across_a_restart(kind: str, tmp_path: Path) -> None:
    replies = [Served(pieces=tool_call(kind, 1)), Served(pieces=_answer(kind))]
    with trio.fail_after(LIMIT):
        async with sse_server([*replies, Served(pieces=_answer(kind))]) as server:
            model = adapter(kind, server.url)
            async with open_runtime(
                model=model, tools=[NOTE], persistence=JsonlPersistence(tmp_path)
            ) as rt:
                handle = await rt.agents.create(agent_id="a", session_id="s", options=OPTIONS)
                handle.agent.send("take a note")
                await handle.agent.when_idle()
            async with open_runtime(
                model=model, tools=[NOTE], persistence=JsonlPersistence(tmp_path)
            ) as rt:
                handle = await rt.agents.resume(agent_id="a", session_id="s", options=OPTIONS)
                handle.agent.send("and now?")
                await handle.agent.when_idle()
    before, after = server.requests[1], server.requests[2]
    assert cached_part(kind, after.raw).startswith(cached_part(kind, before.raw))
    assert "and now?" in json.dumps(after.body["messages"][-1])


async def test_anthropic_cache_reads_and_writes_are_in_the_usage() -> None:
    start = (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_01",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-sonnet-4-5",
                "usage": {
                    "input_tokens": 5,
                    "cache_creation_input_tokens": 20,
                    "cache_read_input_tokens": 100,
                    "output_tokens": 1,
                },
            },
        },
    )
    pieces = sse(
        start,
        ant_block(0, {"type": "text", "text": ""}),
        ant_delta(0, {"type": "text_delta", "text": "Hi"}),
        ant_stop_block(0),
        *ant_end("end_turn", 7),
    )
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=pieces)]) as server:
            chunks = await collect(adapter("anthropic", server.url))
    # The input counts the whole prompt: the uncached part, and what was read and written.
    assert of(Usage, chunks) == [
        Usage(input_tokens=125, output_tokens=7, cache_read_tokens=100, cache_write_tokens=20)
    ]


async def test_openai_cached_and_reasoning_tokens_are_in_the_usage() -> None:
    usage = oai_usage(130, 9)
    usage["usage"]["prompt_tokens_details"] = {"cached_tokens": 128, "audio_tokens": 0}
    usage["usage"]["completion_tokens_details"] = {"reasoning_tokens": 3}
    pieces = sse(oai({"content": "Hi"}), oai(finish="stop"), usage, "[DONE]")
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=pieces)]) as server:
            chunks = await collect(adapter("openai", server.url))
    assert of(Usage, chunks) == [
        Usage(input_tokens=130, output_tokens=9, cache_read_tokens=128, reasoning_tokens=3)
    ]


def test_a_usage_record_without_cache_figures_reads_as_before() -> None:
    """An older log's usage (two counts) still decodes; zero counts are left out when written."""
    old = msgspec.json.decode(b'{"kind":"usage","input_tokens":9,"output_tokens":2}', type=Usage)
    assert old == Usage(9, 2)
    assert json.loads(msgspec.json.encode(Usage(9, 2))) == {
        "kind": "usage",
        "input_tokens": 9,
        "output_tokens": 2,
    }
