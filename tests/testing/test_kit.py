"""The test kit (`greenroom.testing`), through its public API only: `TestModel` calls each tool
with arguments valid for it and answers validly, `FunctionModel` replies as its function says,
and the opt-in pytest plugin gives a test a runtime in virtual time (run by a real pytest on
a suite written as a user would write it)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Annotated, Literal

import hypothesis
import hypothesis.strategies as st
import msgspec
import pytest

from greenroom import AgentSpec, Limits, open_runtime, tool
from greenroom.models import CallTool, Think
from greenroom.protocol.model import ModelRequest, ToolTurn
from greenroom.testing import FunctionModel, TestModel, value_for


class Address(msgspec.Struct):
    street: Annotated[str, msgspec.Meta(min_length=3, max_length=40)]
    zip_code: Annotated[int, msgspec.Meta(ge=10_000, le=99_999)]


class Review(msgspec.Struct):
    verdict: Literal["approve", "revise"]
    score: Annotated[float, msgspec.Meta(gt=0, le=1)]
    reasons: Annotated[list[str], msgspec.Meta(min_length=1, max_length=3)]


received: list[tuple[str, object]] = []


@tool
def ship(
    address: Address,
    when: datetime.date,
    order: uuid.UUID,
    count: Annotated[int, msgspec.Meta(ge=1, multiple_of=5)],
    express: bool = False,
    note: str | None = None,
) -> str:
    """Ship an order."""
    received.append(("ship", (address, when, order, count, express, note)))
    return f"shipped {count}"


@tool
def tag(labels: Annotated[list[str], msgspec.Meta(min_length=2)], weights: dict[str, float]) -> str:
    """Tag something."""
    received.append(("tag", (labels, weights)))
    return "tagged"


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


@pytest.mark.parametrize("seed", range(25))
async def test_each_tool_is_called_once_with_valid_arguments_then_the_results_answer(
    seed: int,
) -> None:
    received.clear()
    spec = AgentSpec(name="a", model=TestModel(seed=seed), tools=[ship, tag, ping])
    async with open_runtime() as rt:
        answer = await (await rt.start(spec)).agent.run("go")
    assert [call.name for call in answer.tool_calls] == ["ship", "tag", "ping"]
    assert not [call.result for call in answer.tool_calls if call.is_error]
    assert [name for name, _ in received] == ["ship", "tag"]  # decoded and run, each once
    assert json.loads(answer.text) == {
        "ship": answer.tool_calls[0].result,
        "tag": "tagged",
        "ping": "pong",
    }


async def test_the_same_seed_makes_the_same_calls_and_another_seed_others() -> None:
    async def arguments(seed: int) -> list[str]:
        spec = AgentSpec(name="a", model=TestModel(seed=seed), tools=[ship, tag])
        async with open_runtime() as rt:
            answer = await (await rt.start(spec)).agent.run("go")
        return [call.arguments for call in answer.tool_calls]

    assert await arguments(7) == await arguments(7)
    assert await arguments(7) != await arguments(8)


@pytest.mark.parametrize("seed", range(10))
async def test_a_structured_output_is_answered_with_a_valid_value(seed: int) -> None:
    spec = AgentSpec(name="a", model=TestModel(seed=seed), output=Review)
    async with open_runtime() as rt:
        answer = await (await rt.start(spec)).agent.run("review it")
    assert answer.stop_reason == "completed"
    assert isinstance(answer.output, Review)
    assert 0 < answer.output.score <= 1


async def test_given_text_or_output_and_only_the_tools_named() -> None:
    model = TestModel(call_tools=["ping"], text="all done")
    async with open_runtime() as rt:
        agent = (await rt.start(AgentSpec(name="a", model=model, tools=[ship, ping]))).agent
        answer = await agent.run("go")
        assert ([c.name for c in answer.tool_calls], answer.text) == (["ping"], "all done")
        second = await agent.run("and again")  # every turn calls them once more
        assert [c.name for c in second.tool_calls] == ["ping"]
    given = Review(verdict="revise", score=0.5, reasons=["too long"])
    spec = AgentSpec(name="b", model=TestModel(output=msgspec.to_builtins(given)), output=Review)
    async with open_runtime() as rt:
        assert (await (await rt.start(spec)).agent.run("go")).output == given


async def test_a_tool_named_but_not_offered_fails_the_turn_naming_it() -> None:
    spec = AgentSpec(name="a", model=TestModel(call_tools=["ship", "nope"]), tools=[ship])
    async with open_runtime() as rt:
        answer = await (await rt.start(spec)).agent.run("go")
    assert answer.stop_reason == "error"
    assert "call_tools names ['nope'], which the request does not offer" in str(answer.reason)
    assert "['ship']" in str(answer.reason)


async def test_usage_is_reported_so_token_limits_hold() -> None:
    spec = AgentSpec(
        name="a", model=TestModel(text="one two three"), limits=Limits(output_tokens=2)
    )
    async with open_runtime() as rt:
        answer = await (await rt.start(spec)).agent.run("count")
    assert answer.usage is not None
    assert (answer.usage.output_tokens, answer.stop_reason) == (3, "limit")


async def test_a_function_model_sees_the_request_and_replies_sync_or_async() -> None:
    seen: list[ModelRequest] = []

    def sync_reply(request: ModelRequest) -> str | list[object]:
        seen.append(request)
        if type(request.messages[-1]) is ToolTurn:
            return f"pinged: {request.messages[-1].content}"
        assert [t.name for t in request.tools] == ["ping"]
        return [Think("I should ping"), CallTool("ping")]

    async def async_reply(request: ModelRequest) -> str:
        return f"{request.system}: {request.messages[-1].content}"  # type: ignore[union-attr]

    model = FunctionModel(sync_reply)  # type: ignore[arg-type]
    async with open_runtime() as rt:
        answer = await (await rt.start(AgentSpec(name="a", model=model, tools=[ping]))).agent.run(
            "go"
        )
        assert (answer.text, [c.name for c in answer.tool_calls]) == ("pinged: pong", ["ping"])
        assert model.requests == seen
        spec = AgentSpec(name="b", model=FunctionModel(async_reply), instructions="Be brief")
        assert (await (await rt.start(spec)).agent.run("hello")).text == "Be brief: hello"


async def test_a_function_models_error_fails_the_step_with_its_message() -> None:
    def broken(request: ModelRequest) -> str:
        raise ValueError("no reply for you")

    async with open_runtime() as rt:
        answer = await (await rt.start(AgentSpec(name="a", model=FunctionModel(broken)))).agent.run(
            "go"
        )
    assert answer.stop_reason == "error"
    assert "no reply for you" in str(answer.reason)


# -- the pytest plugin, run by a real pytest on a user's suite ----------------------------------

USER_SUITE = """
import time
import pytest
import trio
from greenroom import AgentSpec
from greenroom.models import ScriptedModel, Say, Wait
from greenroom.testing import TestModel


async def test_a_runtime_in_virtual_time(greenroom_runtime, greenroom_requests, greenroom_store):
    handle = await greenroom_runtime.start(AgentSpec(name="a"), "s")
    started = time.monotonic()
    await trio.sleep(1800)  # half a virtual hour
    answer = await handle.agent.run("hello")
    assert time.monotonic() - started < 5
    assert answer.text == "success (no tool calls)"  # the default model: a TestModel
    assert [r.messages[-1].content for r in greenroom_requests] == ["hello"]
    assert [s.header.id for s in await greenroom_store.list()] == ["s"]


class TestOverride:
    @pytest.fixture
    def greenroom_model(self):
        return ScriptedModel([[Say("slow"), Wait(600)]])

    async def test_the_model_is_the_tests_own(self, greenroom_runtime):
        handle = await greenroom_runtime.start(AgentSpec(name="a"))
        assert (await handle.agent.run("go")).text == "slow"


async def test_a_deadlock_fails_at_once(greenroom_runtime):
    await trio.Event().wait()
"""


def run_pytest(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_plugin_gives_a_user_suite_its_fixtures_in_virtual_time(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["greenroom.testing.plugin"]\n')
    (tmp_path / "test_agent.py").write_text(textwrap.dedent(USER_SUITE))
    done = run_pytest(tmp_path)
    assert "1 failed, 2 passed" in done.stdout, done.stdout + done.stderr
    assert "test_a_deadlock_fails_at_once" in done.stdout
    assert "still running after 3600 virtual seconds: a deadlock?" in done.stdout


def test_the_plugin_is_never_loaded_by_itself(tmp_path: Path) -> None:
    (tmp_path / "test_agent.py").write_text(textwrap.dedent(USER_SUITE))
    done = run_pytest(tmp_path)
    assert "fixture 'greenroom_runtime' not found" in done.stdout, done.stdout + done.stderr


# -- value_for against msgspec itself, on types hypothesis makes ----------------------------------

_LEAVES = st.sampled_from(
    [
        int,
        float,
        bool,
        str,
        datetime.date,  # (a datetime's schema is a plain string: msgspec says no format)
        uuid.UUID,
        Literal["a", "b", 0],
        Annotated[int, msgspec.Meta(ge=-5, le=5)],
        Annotated[int, msgspec.Meta(gt=100, multiple_of=7)],
        Annotated[float, msgspec.Meta(gt=0, lt=1)],
        Annotated[str, msgspec.Meta(min_length=10, max_length=12)],
        Annotated[str, msgspec.Meta(max_length=0)],
    ]
)


def _types(leaf: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    def wrap(inner: object) -> st.SearchStrategy[object]:
        return st.sampled_from(
            [
                list[inner],  # type: ignore[valid-type]
                Annotated[list[inner], msgspec.Meta(min_length=2, max_length=4)],  # type: ignore[valid-type]
                dict[str, inner],  # type: ignore[valid-type]
                inner | None,  # type: ignore[operator]
                msgspec.defstruct("Nested", [("x", inner), ("y", inner, None)]),
            ]
        )

    return st.recursive(leaf, lambda children: children.flatmap(wrap), max_leaves=4)


@hypothesis.given(kind=_types(_LEAVES), seed=st.integers(0, 2**32))
def test_a_value_made_for_a_types_schema_is_one_msgspec_accepts(kind: object, seed: int) -> None:
    args = msgspec.defstruct("Args", [("value", kind)])
    (schema,), defs = msgspec.json.schema_components([args], ref_template="#/$defs/{name}")
    top = {**defs.pop("Args", schema), "$defs": defs}
    value = value_for(top, seed)
    msgspec.json.decode(json.dumps(value), type=args)  # raises if it is not valid
    assert value_for(top, seed) == value  # and the same seed makes the same value
