"""Retries that wait and tell: what is tried again, what never is, the wait budget, a cancel during
a wait; each retry a ``model/retry`` event in the log. Loopback servers over TLS.

Real sockets, so the real clock: every test bounds itself with ``trio.fail_after``.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import pytest
import trio

from greenroom import Agent, open_runtime
from greenroom.backoff import Backoff
from greenroom.models.base import ModelError
from greenroom.models.http import ModelConfigError
from greenroom.protocol.events import (
    COMPLETED,
    Aborted,
    AssistantChunk,
    AssistantMessage,
    Errored,
    ModelRetry,
)
from greenroom.protocol.model import Retry, StreamChunk, TextDelta
from tests.acp_peer import bridge
from tests.agents_helpers import new_agent, turn_ends
from tests.models.test_adapters import (
    ADAPTERS,
    LIMIT,
    PATH,
    REQUEST,
    STREAMS,
    TO_HELLO,
    adapter,
    collect,
    of,
    sse_server,
)
from tests.sse_server import CutOff, Served, sse
from tests.wire import ant_start, oai

pytestmark = pytest.mark.real_clock

OVERLOADED = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'


def overloaded_event(kind: str) -> list[bytes]:
    """A 200 stream that fails with ``overloaded_error`` before any token."""
    error = {"type": "overloaded_error", "message": "Overloaded"}
    if kind == "openai":  # as a gateway forwards it
        return sse(oai({"role": "assistant", "content": ""}), {"error": error})
    return sse(ant_start(), ("error", {"type": "error", "error": error}))


async def one_turn(kind: str, replies: list[Served], **options: Any) -> tuple[Agent, list[Any]]:
    """Run one turn against `replies`; the agent and the requests the server saw."""
    with trio.fail_after(LIMIT):
        async with (
            sse_server(replies) as server,
            open_runtime(model=adapter(kind, server.url, **options)) as rt,
        ):
            agent = await new_agent(rt)
            agent.send("hi")
            await agent.when_idle()
    return agent, server.requests


def retries(agent: Agent) -> list[ModelRetry]:
    return [e for e in agent.session.events if isinstance(e, ModelRetry)]


def reply_text(agent: Agent) -> str:
    return "".join(e.content for e in agent.session.events if isinstance(e, AssistantMessage))


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_529_then_200_is_retried_and_logged(kind: str) -> None:
    agent, requests = await one_turn(
        kind, [Served(529, body=OVERLOADED), Served(pieces=STREAMS[kind]["text"])]
    )
    assert turn_ends(agent.session.events) == [(1, COMPLETED)]
    assert reply_text(agent) == "Hello world"
    (retry,) = retries(agent)
    assert (retry.turn, retry.step, retry.attempt, retry.code) == (1, 1, 1, "http-529")
    assert retry.error.endswith(f"{PATH[kind]} answered HTTP 529: Overloaded")
    assert retry.wait == pytest.approx(0.01)  # the backoff's first delay (no jitter)
    assert len(requests) == 2
    assert requests[0].raw == requests[1].raw  # the same bytes again


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_mid_stream_overloaded_error_then_200_is_retried_and_logged(kind: str) -> None:
    agent, requests = await one_turn(
        kind, [Served(pieces=overloaded_event(kind)), Served(pieces=STREAMS[kind]["text"])]
    )
    assert turn_ends(agent.session.events) == [(1, COMPLETED)]
    assert reply_text(agent) == "Hello world"
    (retry,) = retries(agent)
    assert (retry.attempt, retry.code) == (1, "overloaded_error")
    assert "error event: overloaded_error: Overloaded" in retry.error
    assert len(requests) == 2


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_connection_closed_before_the_response_is_retried(kind: str) -> None:
    agent, requests = await one_turn(kind, [Served(status=0), Served(pieces=STREAMS[kind]["text"])])
    assert turn_ends(agent.session.events) == [(1, COMPLETED)]
    (retry,) = retries(agent)
    assert retry.code == "connection"
    assert "RemoteProtocolError" in retry.error
    assert len(requests) == 2


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_stream_cut_after_tokens_is_not_retried(kind: str) -> None:
    cut = [*STREAMS[kind]["text"][: TO_HELLO[kind]], CutOff()]
    agent, requests = await one_turn(
        kind, [Served(pieces=cut), Served(pieces=STREAMS[kind]["text"])]
    )
    ((_, reason),) = turn_ends(agent.session.events)
    assert isinstance(reason, Errored)
    assert reason.code == "connection"
    chunks = [e.chunk for e in agent.session.events if isinstance(e, AssistantChunk)]
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Hello"
    assert retries(agent) == []
    assert len(requests) == 1


@pytest.mark.parametrize("kind", ["anthropic"])
async def test_an_overloaded_error_after_tokens_is_not_retried(kind: str) -> None:
    error = ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    pieces = [*STREAMS[kind]["text"][: TO_HELLO[kind]], *sse(error)]
    agent, requests = await one_turn(
        kind, [Served(pieces=pieces), Served(pieces=STREAMS[kind]["text"])]
    )
    ((_, reason),) = turn_ends(agent.session.events)
    assert isinstance(reason, Errored)
    assert reason.code == "overloaded_error"
    assert retries(agent) == []
    assert len(requests) == 1


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_401_is_never_retried(kind: str) -> None:
    denied = Served(401, body=b'{"error":{"message":"invalid x-api-key"}}')
    agent, requests = await one_turn(kind, [denied, Served(pieces=STREAMS[kind]["text"])])
    ((_, reason),) = turn_ends(agent.session.events)
    assert isinstance(reason, Errored)
    assert reason.code == "unauthorized"
    assert retries(agent) == []
    assert len(requests) == 1


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_a_cancel_during_a_backoff_wait_ends_the_turn_at_once(kind: str) -> None:
    """The server asks for 30 s; the cancel lands during the wait and the turn ends at once."""
    slow = Served(429, headers={"Retry-After": "30"}, body=b'{"error":{"message":"slow down"}}')
    with trio.fail_after(LIMIT):
        async with (
            sse_server([slow, Served(pieces=STREAMS[kind]["text"])]) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            agent = await new_agent(rt)
            agent.send("hi")
            while not retries(agent):
                await trio.sleep(0.01)
            agent.cancel("stop")
            await agent.when_idle()
    assert turn_ends(agent.session.events) == [(1, Aborted("stop"))]
    (retry,) = retries(agent)
    assert retry.wait == 30.0
    assert len(server.requests) == 1


# -- the adapter alone -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 501, 502, 503, 504, 529])
async def test_these_statuses_are_retried(status: int) -> None:
    with trio.fail_after(LIMIT):
        async with sse_server(
            [Served(status, body=b"{}"), Served(pieces=STREAMS["anthropic"]["text"])]
        ) as server:
            chunks = await collect(adapter("anthropic", server.url))
    assert [c.code for c in of(Retry, chunks)] == [f"http-{status}"]
    assert "".join(c.text for c in of(TextDelta, chunks)) == "Hello world"


@pytest.mark.parametrize("status", [400, 404, 413, 422, 505])
async def test_other_statuses_are_not_retried(status: int) -> None:
    with trio.fail_after(LIMIT):
        async with sse_server(
            [Served(status, body=b"{}"), Served(pieces=STREAMS["anthropic"]["text"])]
        ) as server:
            with pytest.raises(ModelError) as caught:
                await collect(adapter("anthropic", server.url))
    assert caught.value.code == f"http-{status}"
    assert not isinstance(caught.value, ModelConfigError)
    assert len(server.requests) == 1


async def test_retry_after_ms_is_read() -> None:
    busy = Served(429, headers={"retry-after-ms": "20", "Retry-After": "9"}, body=b"{}")
    with trio.fail_after(LIMIT):
        async with sse_server([busy, Served(pieces=STREAMS["openai"]["text"])]) as server:
            chunks = await collect(adapter("openai", server.url))
    assert [c.wait for c in of(Retry, chunks)] == [0.02]


async def test_a_wait_past_the_budget_gives_up_at_once() -> None:
    """Retry-After 120 s against the default 60 s budget: no wait, an error saying why."""
    busy = Served(429, headers={"Retry-After": "120"}, body=b'{"error":{"message":"quota"}}')
    with trio.fail_after(LIMIT):
        async with sse_server([busy, Served(pieces=STREAMS["anthropic"]["text"])]) as server:
            with pytest.raises(ModelError) as caught:
                await collect(adapter("anthropic", server.url))
    message = str(caught.value)
    assert "answered HTTP 429: quota; gave up after 1 attempts" in message
    assert "the next wait of 120.0 s would pass the 60 s budget" in message
    assert caught.value.code == "http-429"
    assert len(server.requests) == 1


async def test_retries_stop_when_the_budget_is_spent() -> None:
    """Waits 0.01 + 0.02 fit a 0.05 s budget; the third (0.04) would not."""
    steady = Backoff(initial=0.01, maximum=1.0, multiplier=2.0, jitter=0)
    with trio.fail_after(LIMIT):
        async with sse_server([Served(503, body=b"{}")] * 5) as server:
            model = adapter("openai", server.url, backoff=steady, retry_budget=0.05)
            seen: list[StreamChunk] = []

            async def drain() -> None:
                async for chunk in model.stream(REQUEST):
                    seen.append(chunk)

            with pytest.raises(ModelError, match="gave up after 3 attempts"):
                await drain()
    assert [(r.attempt, r.wait) for r in of(Retry, seen)] == [(1, 0.01), (2, 0.02)]
    assert len(server.requests) == 3


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="retry_budget must be seconds >= 0"):
        adapter("openai", "https://api.example.com", retry_budget=-1)


async def test_a_retry_shows_in_the_editor_as_a_notice_of_its_own() -> None:
    kind = "anthropic"
    replies = [Served(529, body=OVERLOADED), Served(pieces=STREAMS[kind]["text"])]
    with trio.fail_after(LIMIT):
        async with sse_server(replies) as server, bridge(None, adapter(kind, server.url)) as b:
            session = await b.peer.new_session()
            prompt = [{"type": "text", "text": "hi"}]
            answer = await b.peer.call("session/prompt", {"sessionId": session, "prompt": prompt})
    assert answer["result"]["stopReason"] == "end_turn"
    chunks = [
        (u["messageId"], u["content"]["text"])
        for u in b.peer.updates(session)
        if u["sessionUpdate"] == "agent_message_chunk"
    ]
    notice = (
        f"Retrying the model in 0.0 s: {server.url}/v1/messages answered HTTP 529: Overloaded\n"
    )
    assert chunks == [
        (f"{session}/1/1/retry-1", notice),
        (f"{session}/1/1", "Hello"),
        (f"{session}/1/1", " world"),
    ]


async def test_the_embedder_sees_a_retry_among_the_prompts_events() -> None:
    kind = "openai"
    replies = [Served(529, body=OVERLOADED), Served(pieces=STREAMS[kind]["text"])]
    with trio.fail_after(LIMIT):
        async with (
            sse_server(replies) as server,
            open_runtime(model=adapter(kind, server.url)) as rt,
        ):
            agent = await new_agent(rt)
            prompt = agent.send("hi")
            seen = [event async for event in prompt.events()]
    kinds = [type(e).__name__ for e in seen]
    assert kinds[0] == "ModelRetry"
    assert kinds[-1] == "TurnEnd"
    (retry,) = [e for e in seen if isinstance(e, ModelRetry)]
    assert retry.code == "http-529"


async def test_a_retry_after_date_is_read() -> None:
    """An HTTP date an hour ahead: a wait of about 3,600 s, past the budget, so no wait."""
    when = email.utils.formatdate(time.time() + 3600, usegmt=True)
    busy = Served(503, headers={"Retry-After": when}, body=b"{}")
    with trio.fail_after(LIMIT):
        async with sse_server([busy, Served(pieces=STREAMS["openai"]["text"])]) as server:
            with pytest.raises(ModelError, match=r"the next wait of 3[56]\d\d\.\d s would pass"):
                await collect(adapter("openai", server.url))


async def test_a_server_asking_for_no_wait_is_asked_10_times_at_most() -> None:
    now = Served(429, headers={"Retry-After": "0"}, body=b'{"error":{"message":"busy"}}')
    with trio.fail_after(LIMIT):
        async with sse_server([now] * 12) as server:
            with pytest.raises(ModelError, match="busy; gave up after 10 attempts"):
                await collect(adapter("anthropic", server.url))
    assert len(server.requests) == 10
