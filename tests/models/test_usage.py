"""Usage per prompt: each turn's tokens (input, output, reasoning, cache reads and writes) and
their cost summed in a ``turn/usage`` record, with the session's running total, which a resumed
session goes on from. A loopback server over TLS; the test's own price table.

Real sockets, so the real clock: every test bounds itself with ``trio.fail_after``.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import acp
import pytest
import trio

from greenroom import Price, Prices, open_runtime
from greenroom.models.usage import turn_usage
from greenroom.protocol.events import (
    COMPLETED,
    USER,
    AssistantMessage,
    MessageTrigger,
    SessionEvent,
    TurnEnd,
    TurnStart,
    TurnUsage,
)
from greenroom.protocol.model import Usage
from greenroom.session.persistence import JsonlPersistence
from tests.acp_peer import bridge
from tests.models.test_adapters import LIMIT, adapter, sse_server
from tests.models.test_pool import NOTE
from tests.sse_server import Served, sse
from tests.wire import ant_block, ant_delta, ant_end, ant_stop_block


def ant_reply(block: dict[str, Any], deltas: list[dict[str, Any]], stop: str, usage: Usage) -> Any:
    """An Anthropic stream of one block whose usage is `usage` (the input as the API splits it)."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-sonnet-4-5",
            "usage": {
                "input_tokens": usage.input_tokens
                - usage.cache_read_tokens
                - usage.cache_write_tokens,
                "cache_read_input_tokens": usage.cache_read_tokens,
                "cache_creation_input_tokens": usage.cache_write_tokens,
                "output_tokens": 1,
            },
        },
    }
    return sse(
        ("message_start", start),
        ant_block(0, block),
        *[ant_delta(0, delta) for delta in deltas],
        ant_stop_block(0),
        *ant_end(stop, usage.output_tokens),
    )


def text(usage: Usage) -> Served:
    return Served(
        pieces=ant_reply(
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": "Done."}],
            "end_turn",
            usage,
        )
    )


def note(usage: Usage) -> Served:
    block = {"type": "tool_use", "id": "c1", "name": "note", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": '{"text": "x"}'}
    return Served(pieces=ant_reply(block, [delta], "tool_use", usage))


#: The test's prices for the adapter's model (USD per million tokens).
PRICES = Prices(
    {
        "claude-sonnet-4-5": Price(
            input=Decimal("3"),
            cached_input=Decimal("0.30"),
            cache_write=Decimal("3.75"),
            output=Decimal("15"),
            reasoning=Decimal("15"),
            as_of=datetime.date(2026, 1, 1),
            source="the tests",
        )
    }
)
# Each step's cost by hand: 100 x 3 + 1,100 x 3.75 + 30 x 15 = 4,875 per million.
STEP_1 = Usage(1200, 30, cache_write_tokens=1100, cost=Decimal("0.004875"))
# 50 x 3 + 1,100 x 0.30 + 150 x 3.75 + 12 x 15 = 150 + 330 + 562.5 + 180 = 1,222.5
STEP_2 = Usage(1300, 12, cache_read_tokens=1100, cache_write_tokens=150, cost=Decimal("0.0012225"))
# 50 x 3 + 1,250 x 0.30 + 100 x 3.75 + 9 x 15 = 150 + 375 + 375 + 135 = 1,035
TURN_2 = Usage(1400, 9, cache_read_tokens=1250, cache_write_tokens=100, cost=Decimal("0.001035"))


def records(events: Any) -> list[TurnUsage]:
    return [e for e in events if isinstance(e, TurnUsage)]


@pytest.mark.real_clock
async def test_each_turn_sums_its_steps_and_the_session_goes_on_after_a_restart(
    tmp_path: Path,
) -> None:
    replies = [note(STEP_1), text(STEP_2), text(TURN_2), text(TURN_2)]
    with trio.fail_after(LIMIT):
        async with sse_server(replies) as server:
            model = adapter("anthropic", server.url)
            store = JsonlPersistence(tmp_path)
            async with open_runtime(
                model=model, tools=[NOTE], persistence=store, prices=PRICES
            ) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
                first = await agent.send("take a note")
                second = await agent.send("again")
            async with open_runtime(
                model=model, tools=[NOTE], persistence=store, prices=PRICES
            ) as rt:
                resumed = (await rt.agents.resume(agent_id="a", session_id="s")).agent
                await resumed.send("once more")
    turn_1 = STEP_1 + STEP_2
    assert turn_1 == Usage(
        2500, 42, cache_read_tokens=1100, cache_write_tokens=1250, cost=Decimal("0.0060975")
    )
    assert [(r.turn, r.usage, r.session) for r in records(resumed.session.events)] == [
        (1, turn_1, turn_1),
        (2, TURN_2, turn_1 + TURN_2),
        (3, TURN_2, turn_1 + TURN_2 + TURN_2),
    ]
    # The prompt's answer reports the same sum.
    assert first.usage == turn_1
    assert second.usage == TURN_2
    # The record closes its turn: right before turn/end.
    events = resumed.session.events
    for record in records(events):
        assert isinstance(events[record.seq + 1], TurnEnd)


def test_a_turn_without_usage_has_no_record_and_the_total_skips_it() -> None:
    one = Usage(10, 2, reasoning_tokens=1)
    events: list[SessionEvent] = [
        TurnStart(seq=0, turn=1, trigger=MessageTrigger(USER)),
        AssistantMessage(seq=1, turn=1, step=1, content="a", usage=one),
        TurnUsage(seq=2, turn=1, usage=one, session=one),
        TurnEnd(seq=3, turn=1, reason=COMPLETED),
        TurnStart(seq=4, turn=2, trigger=MessageTrigger(USER)),
        AssistantMessage(seq=5, turn=2, step=1, content="b"),
    ]
    assert turn_usage(events, 4, 2) is None
    events.append(AssistantMessage(seq=6, turn=2, step=2, content="c", usage=one))
    record = turn_usage(events, 4, 2)
    assert record is not None
    assert (record.usage, record.session) == (one, Usage(20, 4, reasoning_tokens=2))


@pytest.mark.real_clock
async def test_acp_reports_the_turns_usage_with_its_cache_figures() -> None:
    with trio.fail_after(LIMIT):
        async with (
            sse_server([note(STEP_1), text(STEP_2)]) as server,
            bridge(None, adapter("anthropic", server.url), prices=PRICES) as b,
        ):
            b.runtime.tools.register(NOTE)
            session = await b.peer.new_session()
            prompt = [{"type": "text", "text": "take a note"}]
            answer = await b.peer.call("session/prompt", {"sessionId": session, "prompt": prompt})
    result = answer["result"]
    assert result["usage"] == {
        "totalTokens": 2542,
        "inputTokens": 2500,
        "outputTokens": 42,
        "cachedReadTokens": 1100,
        "cachedWriteTokens": 1250,
    }
    assert acp.schema.PromptResponse.model_validate(result).usage is not None
    # The context in use after each step: its whole input (cached included) and its output;
    # once the turn is summed, the session's cost so far, in the schema's shape.
    updates = [u for u in b.peer.updates(session) if u["sessionUpdate"] == "usage_update"]
    assert [(u["used"], u.get("cost")) for u in updates] == [
        (1230, None),
        (1312, None),
        (1312, {"amount": 0.0060975, "currency": "USD"}),
    ]
    shown = acp.schema.SessionNotification.model_validate(
        {"sessionId": session, "update": updates[-1]}
    ).update
    assert isinstance(shown, acp.schema.UsageUpdate)
    assert shown.cost is not None  # a cost the schema refused would be salvaged as None
    assert (shown.cost.amount, shown.cost.currency) == (0.0060975, "USD")
