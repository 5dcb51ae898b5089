"""One pooled connection per model adapter, held by the runtime: the loopback server (over TLS)
counts the connections its clients open.

Real sockets, so the real clock: every test bounds itself with ``trio.fail_after``.
"""

from __future__ import annotations

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation
from greenroom.protocol.events import COMPLETED, Aborted, AssistantChunk
from greenroom.tools import Tool
from tests.agents_helpers import new_agent, turn_ends
from tests.models.test_adapters import (
    ADAPTERS,
    LIMIT,
    STREAMS,
    TO_HELLO,
    _answer,
    adapter,
    collect,
    sse_server,
)
from tests.sse_server import Hold, Pause, Served, sse
from tests.wire import ant_block, ant_delta, ant_end, ant_start, ant_stop_block, oai, oai_call

pytestmark = pytest.mark.real_clock


class Note(msgspec.Struct):
    text: str


async def _note(args: Note, call: ToolInvocation) -> str:
    return f"noted {args.text}"


NOTE = Tool("note", "take a note", Note, _note)


def tool_call(kind: str, step: int) -> list[bytes]:
    """A reply that calls ``note`` (call id ``c<step>``)."""
    arguments = f'{{"text": "step {step}"}}'
    if kind == "openai":
        return sse(
            oai_call(0, "", f"c{step}", "note"),
            oai_call(0, arguments),
            oai(finish="tool_calls"),
            "[DONE]",
        )
    return sse(
        ant_start(),
        ant_block(0, {"type": "tool_use", "id": f"c{step}", "name": "note", "input": {}}),
        ant_delta(0, {"type": "input_json_delta", "partial_json": arguments}),
        ant_stop_block(0),
        *ant_end("tool_use"),
    )


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_20_step_turn_opens_one_connection(kind: str) -> None:
    replies = [Served(pieces=tool_call(kind, step)) for step in range(1, 20)]
    with trio.fail_after(LIMIT * 3):
        async with sse_server([*replies, Served(pieces=_answer(kind))]) as server:
            async with open_runtime(model=adapter(kind, server.url), tools=[NOTE]) as rt:
                agent = await new_agent(rt)
                agent.send("take 19 notes")
                await agent.when_idle()
                assert not server.client_left.is_set()  # idle in the pool, not closed
            await server.client_left.wait()  # the runtime's close closed it
    assert turn_ends(agent.session.events) == [(1, COMPLETED)]
    assert len(server.requests) == 20
    assert server.connections == 1


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_10_turns_of_two_sessions_open_one_connection(kind: str) -> None:
    replies = [Served(pieces=STREAMS[kind]["text"]) for _ in range(10)]
    with trio.fail_after(LIMIT * 3):
        async with (
            sse_server(replies) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            first = await new_agent(rt, "a", "s1")
            second = await new_agent(rt, "b", "s2")
            for turn in range(5):
                for agent in (first, second):
                    agent.send(f"turn {turn}")
                    await agent.when_idle()
    assert [reason for _, reason in turn_ends(first.session.events)] == [COMPLETED] * 5
    assert [reason for _, reason in turn_ends(second.session.events)] == [COMPLETED] * 5
    assert len(server.requests) == 10
    assert server.connections == 1


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_cancelled_streams_connection_is_not_reused(kind: str) -> None:
    held = [*STREAMS[kind]["text"][: TO_HELLO[kind]], Pause(0.05), Hold()]
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=held), Served(pieces=STREAMS[kind]["text"])]) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            agent = await new_agent(rt)
            agent.send("talk")
            while not any(isinstance(e, AssistantChunk) for e in agent.session.events):
                await trio.sleep(0.01)
            agent.cancel("stop")
            await agent.when_idle()
            await server.client_left.wait()  # the half-read response's connection closed
            agent.send("again")
            await agent.when_idle()
    assert turn_ends(agent.session.events) == [(1, Aborted("stop")), (2, COMPLETED)]
    assert [seen.connection for seen in server.requests] == [1, 2]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_an_adapter_outside_a_runtime_opens_a_connection_per_call(kind: str) -> None:
    """Nobody holds the pool: each call's client (and connection) ends with the call."""
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=STREAMS[kind]["text"])] * 2) as server:
            model = adapter(kind, server.url)
            await collect(model)
            await server.client_left.wait()
            await collect(model)
    assert server.connections == 2


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_pool_shared_by_two_runtimes_closes_with_the_last(kind: str) -> None:
    replies = [Served(pieces=STREAMS[kind]["text"])] * 2
    with trio.fail_after(LIMIT):
        async with sse_server(replies) as server:
            model = adapter(kind, server.url)
            async with open_runtime(model=model) as outer:
                async with open_runtime(model=model) as inner:
                    agent = await new_agent(inner)
                    agent.send("hi")
                    await agent.when_idle()
                agent = await new_agent(outer)
                agent.send("hi")
                await agent.when_idle()
                assert not server.client_left.is_set()
            await server.client_left.wait()
    assert server.connections == 1


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_connection_the_server_closed_while_idle_is_replaced(kind: str) -> None:
    """The server ends the kept-alive connection after the first reply: the next turn opens
    another and succeeds (a reuse that loses the race with the server's close is a transport
    error before the response, retried)."""
    replies = [
        Served(pieces=STREAMS[kind]["text"], close=True),
        Served(pieces=STREAMS[kind]["text"]),
    ]
    with trio.fail_after(LIMIT):
        async with (
            sse_server(replies) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            agent = await new_agent(rt)
            await agent.send("one")
            answer = await agent.send("two")
    assert answer.text == "Hello world"
    assert turn_ends(agent.session.events) == [(1, COMPLETED), (2, COMPLETED)]
    assert [seen.connection for seen in server.requests] == [1, 2]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_body_left_open_after_the_reply_ends_the_step_and_its_connection(
    kind: str,
) -> None:
    """The reply's last event came but the body never ends: the step ends a moment later
    (the drain's bound), whole, and the connection is not reused."""
    held = [*STREAMS[kind]["text"], Hold()]
    with trio.fail_after(LIMIT):
        async with (
            sse_server([Served(pieces=held), Served(pieces=STREAMS[kind]["text"])]) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            agent = await new_agent(rt)
            first = await agent.send("one")
            second = await agent.send("two")
    assert (first.text, second.text) == ("Hello world", "Hello world")
    assert [seen.connection for seen in server.requests] == [1, 2]
