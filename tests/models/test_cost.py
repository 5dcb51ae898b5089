"""What each turn costs: a price table injected by the test (never the shipped figures),
each step priced exactly in `Decimal`, summed per turn and per session in ``turn/usage``
(rebuilt from the log on resume), unknown for a model with no price, cost limits beside the
token limits, the price file's bad input, and ``sessions show``."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from greenroom import AgentOptions, Limits, Price, Prices, open_runtime, tool
from greenroom.cli import main, sessions_root
from greenroom.models import CallTool, PriceFileError, Say, ScriptedModel, Tokens, shipped_prices
from greenroom.protocol.events import LimitReached, SessionEvent, StepStart, ToolResult, TurnEnd
from greenroom.protocol.events import TurnUsage as Record
from greenroom.protocol.model import NO_USAGE, Usage
from greenroom.session.persistence import JsonlPersistence

MODEL = "test-model"
#: The test's own figures (USD per million tokens): reasoning apart from output, to see it
#: priced as such.
PRICE = Price(
    input=Decimal("3"),
    cached_input=Decimal("0.30"),
    cache_write=Decimal("3.75"),
    output=Decimal("15"),
    reasoning=Decimal("20"),
    as_of=datetime.date(2026, 1, 1),
    source="the tests",
)
TABLE = Prices({MODEL: PRICE})
PRICED = AgentOptions(model=MODEL)


@tool
def note(text: str) -> str:
    """Write a note down.

    Args:
        text: The note.
    """
    return "noted"


def records(events: list[SessionEvent]) -> list[Record]:
    return [e for e in events if isinstance(e, Record)]


def of(events: list[SessionEvent], kind: type) -> list[SessionEvent]:
    return [e for e in events if isinstance(e, kind)]


# -- the figures, by hand -------------------------------------------------------------------

# Turn 1, step 1: 2,000 in (1,500 written to the cache), 300 out (100 of them thinking):
#   500 x 3 + 1,500 x 3.75 + 200 x 15 + 100 x 20 = 1,500 + 5,625 + 3,000 + 2,000 = 12,125
STEP_1 = Tokens(input=2000, output=300, cache_write=1500, reasoning=100)
COST_1 = Decimal("0.012125")
# Step 2: 2,600 in (1,500 read from the cache, 400 written), 50 out:
#   700 x 3 + 1,500 x 0.30 + 400 x 3.75 + 50 x 15 = 2,100 + 450 + 1,500 + 750 = 4,800
STEP_2 = Tokens(input=2600, output=50, cache_read=1500, cache_write=400)
COST_2 = Decimal("0.0048")
# Turns 2 and 3, one step each: 3,000 in (2,500 read), 120 out (80 thinking):
#   500 x 3 + 2,500 x 0.30 + 40 x 15 + 80 x 20 = 1,500 + 750 + 600 + 1,600 = 4,450
LATER = Tokens(input=3000, output=120, cache_read=2500, reasoning=80)
COST_LATER = Decimal("0.00445")


def test_a_price_prices_each_kind_of_token_at_its_own_figure() -> None:
    usage = Usage(2600, 50, cache_read_tokens=1500, cache_write_tokens=400)
    assert PRICE.cost(usage) == COST_2
    thinking = Usage(3000, 120, cache_read_tokens=2500, reasoning_tokens=80)
    assert PRICE.cost(thinking) == COST_LATER
    # A count a provider reports past its whole is all of it, not a negative rest.
    assert (
        PRICE.cost(Usage(100, 10, cache_read_tokens=150, reasoning_tokens=20))
        == (150 * Decimal("0.30") + 20 * Decimal("20")) / 1_000_000
    )


def test_a_row_prices_its_model_and_the_names_that_go_on_from_it() -> None:
    row = {"as_of": datetime.date(2026, 1, 1), "source": "s"}
    figures = {f: Decimal(1) for f in ("input", "cached_input", "cache_write", "output")}
    table = Prices(
        {
            name: Price(**figures, reasoning=Decimal(n), **row)  # type: ignore[arg-type]
            for n, name in enumerate(["gpt-4o", "gpt-4o-mini", "gpt-5", "o1"], start=1)
        }
    )

    def reasoning(model: str) -> Decimal | None:
        found = table.find(model)
        return None if found is None else found.reasoning

    assert reasoning("gpt-4o") == 1
    assert reasoning("gpt-4o-2024-08-06") == 1
    assert reasoning("gpt-4o-mini-2024-07-18") == 2  # the longest row wins
    assert reasoning("gpt-5@vertex") == 3
    assert reasoning("o1:latest") == 4
    assert reasoning("gpt-5.4") is None  # a dot goes on with the name: another model
    assert reasoning("gpt-4oo") is None
    assert reasoning("o10") is None
    assert reasoning("xgpt-4o") is None
    assert table.priced(Usage(1000), "gpt-5.4") == Usage(1000)  # unknown: no cost, not 0


def test_a_tables_rows_go_over_anothers() -> None:
    cheaper = msgspec.structs.replace(PRICE, input=Decimal("1"))
    merged = TABLE | Prices({MODEL: cheaper, "other": PRICE})
    assert merged.find(MODEL) == cheaper
    assert merged.find("other") == PRICE
    assert TABLE.find("other") is None  # made anew: neither is changed


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("input", Decimal("-0.01")),
        ("output", Decimal("NaN")),
        ("reasoning", Decimal("Infinity")),
        ("cached_input", 0.5),
        ("cache_write", 1),
    ],
)
def test_a_price_that_is_not_a_finite_decimal_of_zero_or_more_is_refused(
    field: str, value: object
) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a finite Decimal >= 0"):
        msgspec.structs.replace(PRICE, **{field: value})
    with pytest.raises(ValueError, match="source must say"):
        msgspec.structs.replace(PRICE, source=" ")


def test_the_shipped_table_names_when_and_where_each_row_was_read() -> None:
    shipped = shipped_prices()
    assert shipped is shipped_prices()  # read once
    assert shipped.rows
    for name, price in shipped.rows.items():
        assert price.source.startswith("https://"), name
        assert price.as_of.year >= 2025, name


# -- a session --------------------------------------------------------------------------------


async def test_each_turn_and_the_session_cost_what_the_hand_sums_say_and_survive_a_resume(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [
            [Say("looking"), STEP_1, CallTool("note", {"text": "x"})],
            [Say("done"), STEP_2],
            [Say("again"), LATER],
            [Say("once more"), LATER],
        ]
    )
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=model, persistence=store, tools=[note], prices=TABLE) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", options=PRICED)
        first = await handle.agent.run("take a note")
        second = await handle.agent.run("again")
        await handle.dispose()
        resumed = await rt.agents.resume(agent_id="b", session_id="s", options=PRICED)
        third = await resumed.agent.run("once more")
        events = list(resumed.agent.session.events)
    turn_1 = COST_1 + COST_2
    assert turn_1 == Decimal("0.016925")
    assert [(r.usage.cost, r.session.cost) for r in records(events)] == [
        (turn_1, turn_1),
        (COST_LATER, turn_1 + COST_LATER),
        (COST_LATER, turn_1 + 2 * COST_LATER),  # the resumed life went on from the log
    ]
    assert records(events)[-1].session.cost == Decimal("0.025825")
    assert (first.usage, second.usage, third.usage) == tuple(r.usage for r in records(events))
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.reasoning_tokens) == (4600, 100)
    # The log keeps each figure exact, as a decimal string.
    logged = [
        json.loads(line)
        for line in (tmp_path / "s.jsonl").read_text().splitlines()
        if '"turn/usage"' in line
    ]
    assert [r["session"]["cost"] for r in logged] == ["0.016925", "0.021375", "0.025825"]


async def test_a_model_with_no_price_costs_unknown_never_zero(tmp_path: Path) -> None:
    steps = [[Say("a"), Tokens(1000, 100)], [Say("b"), Tokens(1000, 100)]]
    store = JsonlPersistence(tmp_path)
    unpriced = AgentOptions(model="mystery-1")
    async with open_runtime(model=ScriptedModel(steps), persistence=store, prices=TABLE) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", options=unpriced)
        answer = await handle.agent.run("go")
        await handle.dispose()
        resumed = await rt.agents.resume(agent_id="b", session_id="s", options=PRICED)
        priced = await resumed.agent.run("go on")
        events = list(resumed.agent.session.events)
    assert answer.usage == Usage(1000, 100)
    assert answer.usage is not None
    assert answer.usage.cost is None
    # The priced turn has its cost; the session's stays unknown: a sum with an unknown part.
    assert priced.usage is not None
    assert priced.usage.cost == Decimal("0.0045")
    assert [(r.usage.cost, r.session.cost) for r in records(events)] == [
        (None, None),
        (Decimal("0.0045"), None),
    ]
    logged = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    first = next(r for r in logged if r.get("type") == "turn/usage")
    assert "cost" not in first["usage"]
    assert "cost" not in first["session"]


def test_a_sum_is_unknown_when_a_part_is() -> None:
    known = Usage(10, cost=Decimal("0.5"))
    assert (NO_USAGE + known).cost == Decimal("0.5")
    assert (known + Usage(10)).cost is None
    assert (Usage(10) + known).cost is None


# -- cost limits ------------------------------------------------------------------------------

# Each step: 1,000 in, 100 out: 1,000 x 3 + 100 x 15 = 4,500 per million: $0.0045.
SPEND = [[Say("a"), Tokens(1000, 100), CallTool("note", {"text": str(n)})] for n in range(6)]


async def test_a_cost_limit_ends_the_turn_after_the_step_that_crosses_it() -> None:
    async with open_runtime(model=ScriptedModel(SPEND), tools=[note], prices=TABLE) as rt:
        options = AgentOptions(model=MODEL, limits=Limits(cost_usd=Decimal("0.008")))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        answer = await handle.agent.run("spend")
        events = list(handle.agent.session.events)
    assert answer.stop_reason == "limit"
    assert answer.reason == "cost_usd limit reached: 0.0090 of 0.008"
    assert len(of(events, StepStart)) == 2  # $0.0045 after one step, $0.009 after two
    assert len(of(events, ToolResult)) == 2  # the crossing step's call ran: it was its step's
    end = of(events, TurnEnd)[-1]
    assert isinstance(end, TurnEnd)
    assert end.reason == LimitReached(
        limit="cost_usd", allowed=Decimal("0.008"), reached=Decimal("0.009")
    )


async def test_a_session_cost_limit_counts_the_log_and_survives_a_resume(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    limits = AgentOptions(model=MODEL, limits=Limits(session_cost_usd=Decimal("0.012")))
    model = ScriptedModel(SPEND)
    async with open_runtime(model=model, persistence=store, tools=[note], prices=TABLE) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", options=limits)
        first = await handle.agent.run("two steps", limits=Limits(requests=2))
        await handle.dispose()
        again = await rt.agents.resume(agent_id="b", session_id="s", options=limits)
        second = await again.agent.run("what is left")
        events = list(again.agent.session.events)
    assert first.reason == "requests limit reached: 2 of 2"
    # $0.009 spent before the resume: the resumed session's first step crosses $0.012.
    assert second.reason == "session_cost_usd limit reached: 0.0135 of 0.012"
    assert len(of(events, StepStart)) == 3
    assert records(events)[-1].session.cost == Decimal("0.0135")


async def test_a_cost_limit_over_a_model_with_no_price_stops_after_its_first_step() -> None:
    async with open_runtime(model=ScriptedModel(SPEND), tools=[note], prices=TABLE) as rt:
        options = AgentOptions(model="mystery-1", limits=Limits(cost_usd=Decimal("5")))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        answer = await handle.agent.run("spend")
        events = list(handle.agent.session.events)
    assert answer.stop_reason == "limit"
    assert answer.reason == "cost_usd limit (5) reached: the cost is unknown (no price)"
    assert len(of(events, StepStart)) == 1
    end = of(events, TurnEnd)[-1]
    assert isinstance(end, TurnEnd)
    assert end.reason == LimitReached(limit="cost_usd", allowed=Decimal("5"), reached=None)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cost_usd", Decimal(0)),
        ("cost_usd", Decimal("-1")),
        ("session_cost_usd", 0.5),
        ("session_cost_usd", Decimal("NaN")),
    ],
)
def test_cost_limits_that_are_not_positive_decimals_are_refused_naming_the_field(
    field: str, value: object
) -> None:
    with pytest.raises(ValueError, match=f"Limits.{field} must be a positive Decimal"):
        Limits(**{field: value})  # type: ignore[arg-type]


def test_the_stricter_cost_limit_wins() -> None:
    mine = Limits(cost_usd=Decimal("1"), session_cost_usd=Decimal("10"))
    assert mine.stricter(Limits(cost_usd=Decimal("0.5"))) == Limits(
        cost_usd=Decimal("0.5"), session_cost_usd=Decimal("10")
    )


def test_a_limits_figures_keep_their_kind_in_the_log() -> None:
    for reached in (
        LimitReached(limit="requests", allowed=3, reached=3),
        LimitReached(limit="cost_usd", allowed=Decimal("0.50"), reached=Decimal("0.5025")),
        LimitReached(limit="cost_usd", allowed=Decimal("0.50"), reached=None),
    ):
        again = msgspec.json.decode(msgspec.json.encode(reached), type=LimitReached)
        assert again == reached
        assert type(again.allowed) is type(reached.allowed)


# -- the price file ---------------------------------------------------------------------------

GOOD = """
["my-model"]
input = 0.10
cached_input = 0.01
cache_write = 0.125
output = 0.40
reasoning = 0.40
as_of = 2026-11-30
source = "our contract"
"""


def test_a_price_file_is_read_exactly(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(GOOD)
    table = Prices.read(path)
    price = table.find("my-model-2")
    assert price is not None
    assert (price.input, price.cache_write, price.as_of) == (
        Decimal("0.10"),
        Decimal("0.125"),
        datetime.date(2026, 11, 30),
    )
    # 1,000,000 tokens of each kind: the figures' sum, exactly (no binary float in between).
    million = Usage(3_000_000, 2_000_000, 1_000_000, 1_000_000, 1_000_000)
    assert price.cost(million) == Decimal("1.035")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (GOOD.replace("input = 0.10", "input = -0.10"), "row 'my-model': input must be"),
        (GOOD.replace("output = 0.40", "output = 'lots'"), "row 'my-model': Invalid decimal"),
        (GOOD.replace("reasoning = 0.40\n", ""), "row 'my-model': .*`reasoning`"),
        (GOOD + "extra = 1\n", "row 'my-model': .*unknown field `extra`"),
        (GOOD.replace("2026-11-30", '"last week"'), "row 'my-model': Invalid RFC3339 encoded date"),
        (GOOD.replace('"our contract"', '""'), "row 'my-model': source must say"),
        ('"gpt-4o" = 2.5\n', "row 'gpt-4o' must be a table of prices"),
        (GOOD.replace('["my-model"]', '[""]'), "a row must be named by a model"),
        ('["my-model"\ninput = 1\n', "is not TOML"),
        ("\udcff", "is not TOML"),
    ],
)
def test_a_bad_price_file_is_refused_naming_the_row(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "prices.toml"
    path.write_bytes(text.encode(errors="surrogateescape"))
    with pytest.raises(PriceFileError, match=says) as refused:
        Prices.read(path)
    assert str(path) in str(refused.value)


def test_a_missing_price_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PriceFileError, match=r"nowhere\.toml'.*No such file"):
        Prices.read(tmp_path / "nowhere.toml")


@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_no_price_file_fails_but_as_a_price_file_error(data: bytes) -> None:
    refused = None
    try:
        Prices.parse(data, "fuzz.toml")
    except PriceFileError as exc:
        refused = str(exc)
    assert refused is None or "fuzz.toml" in refused


def test_the_command_line_refuses_a_bad_price_file_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(GOOD.replace("input = 0.10", "input = -1"))
    with pytest.raises(SystemExit) as exited:
        main(["acp", "--state-dir", str(tmp_path), "--prices", str(path)])
    assert exited.value.code == 2
    assert "row 'my-model': input must be a finite Decimal >= 0" in capsys.readouterr().err


# -- sessions show ----------------------------------------------------------------------------


async def _record(state: Path) -> None:
    model = ScriptedModel([[Say("looking"), STEP_1], [Say("more"), LATER]])
    store = JsonlPersistence(sessions_root(state))
    async with open_runtime(model=model, persistence=store, prices=TABLE) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="costly", options=PRICED)
        await handle.agent.run("what does it cost?")
        await handle.agent.run("and now?")
        await handle.dispose()


def test_sessions_show_prints_each_turns_cost_and_the_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(_record, tmp_path)  # real clock: a virtual one outruns fsyncs
    assert main(["sessions", "--state-dir", str(tmp_path), "show", "costly"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "usage:" in line]
    assert lines == [
        "  usage: 2,000 tokens in (1,500 written to the cache), 300 out (100 thinking);"
        " cost $0.012125, the session's $0.012125",
        "  usage: 3,000 tokens in (2,500 cached), 120 out (80 thinking);"
        " cost $0.00445, the session's $0.016575",
    ]
