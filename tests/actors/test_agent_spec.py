"""An agent as a value: `AgentSpec` and `rt.start`, through the public API."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from greenroom import AgentSpec, Limits, open_runtime, tool
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import ConfigSet, TurnStart
from greenroom.session.persistence import JsonlPersistence


@tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text.
    """
    return len(text.split())


@tool
def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: What to say.
    """
    return text.upper()


class Review(msgspec.Struct):
    verdict: str


async def test_two_agents_each_see_only_their_own_tools() -> None:
    coder_model, critic_model = ScriptedModel(), ScriptedModel()
    coder = AgentSpec(name="coder", model=coder_model, tools=[word_count])
    critic = AgentSpec(name="critic", model=critic_model, tools=[shout])
    async with open_runtime() as rt:
        a = await rt.start(coder, "c")
        b = await rt.start(critic, "k")
        await a.agent.run("hi")
        await b.agent.run("hi")
    assert [t.name for t in coder_model.requests[-1].tools] == ["word_count"]
    assert [t.name for t in critic_model.requests[-1].tools] == ["shout"]


async def test_a_spec_runs_its_own_tool_and_a_named_runtime_tool() -> None:
    model = ScriptedModel(
        [[CallTool("word_count", {"text": "a b c"}), CallTool("shout", {"text": "x"})], [Say("ok")]]
    )
    spec = AgentSpec(name="a", model=model, tools=[word_count, "shout"])
    async with open_runtime(tools=[shout]) as rt:
        handle = await rt.start(spec)
        answer = await handle.agent.run("count and shout")
    assert [(c.name, c.result) for c in answer.tool_calls] == [("word_count", "3"), ("shout", "X")]
    assert {t.name for t in model.requests[0].tools} == {"word_count", "shout"}


async def test_start_twice_on_one_stored_session_creates_then_resumes(tmp_path: Path) -> None:
    spec = AgentSpec(name="coder", instructions="Be brief.")
    store = JsonlPersistence(tmp_path)
    async with open_runtime(persistence=store) as rt:
        first = await rt.start(spec, "s1")
        assert (first.id, first.session_id, first.spec) == ("coder:s1", "s1", spec)
        await first.agent.run("one")
        await first.dispose()
        again = await rt.start(spec, "s1")
        answer = await again.agent.run("two")
        events = list(again.agent.session.events)
    assert answer.turn == 3  # turn 1 logged the instructions, turn 2 the first prompt
    settings = [e for e in events if isinstance(e, ConfigSet)]
    assert [(s.key, s.value) for s in settings] == [("instructions", "Be brief.")]  # once
    assert sum(isinstance(e, TurnStart) for e in events) == 3


async def test_instructions_are_the_system_prompt_and_a_function_is_called_at_each_start(
    tmp_path: Path,
) -> None:
    model = ScriptedModel()
    calls: list[str] = []

    async def today() -> str:
        calls.append("called")
        return f"Day {len(calls)}."

    spec = AgentSpec(name="a", model=model, instructions=today)
    async with open_runtime(persistence=JsonlPersistence(tmp_path)) as rt:
        handle = await rt.start(spec, "s")
        await handle.agent.run("hi")
        assert model.requests[-1].system == "Day 1."
        await handle.dispose()
        handle = await rt.start(spec, "s")
        await handle.agent.run("hi again")
    assert model.requests[-1].system == "Day 2."
    assert calls == ["called", "called"]


async def test_a_specs_output_and_limits_hold_for_its_runs() -> None:
    model = ScriptedModel([[CallTool("final_answer", {"verdict": "approve"})]])
    spec = AgentSpec(name="critic", model=model, output=Review, limits=Limits(requests=4))
    async with open_runtime() as rt:
        handle = await rt.start(spec)
        answer = await handle.agent.run("review this")
    assert answer.output == Review(verdict="approve")


async def test_a_model_string_is_made_once_and_reused() -> None:
    spec = AgentSpec(name="a", model="scripted:0")
    async with open_runtime() as rt:
        first = await rt.start(spec)
        second = await rt.start(spec)
        assert (await first.agent.run("x y")).text == "x y"
        assert first.agent.model == second.agent.model == "scripted:0"


async def test_a_cwd_is_relative_to_the_runtimes_workdir(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    async with open_runtime(workdir=str(tmp_path)) as rt:
        here = await rt.start(AgentSpec(name="a"))
        there = await rt.start(AgentSpec(name="b"), cwd="project")
    assert here.agent.session.header.cwd == str(tmp_path)
    assert there.agent.session.header.cwd == str(tmp_path / "project")


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"name": ""}, ValueError, "AgentSpec.name must be non-empty"),
        ({"name": "a", "model": 3}, TypeError, "model must be a model string or an adapter"),
        ({"name": "a", "tools": [3]}, TypeError, r"tools\[0\] must be a Tool"),
        ({"name": "a", "tools": "bash"}, TypeError, "tools must be a list"),
        ({"name": "a", "output": int}, TypeError, "output:"),
        ({"name": "a", "limits": {"requests": 1}}, TypeError, "limits must be Limits"),
        ({"name": "a", "guards": [print]}, TypeError, r"guards\[0\] must be a Guard"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(
    fields: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        AgentSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        (AgentSpec(name="a", model="nope:x"), ValueError, "unknown model kind 'nope'"),
        (AgentSpec(name="a", tools=["missing"]), ValueError, "the runtime has no tool 'missing'"),
        (AgentSpec(name="a", tools=[print]), TypeError, r"tools\[0\]"),
    ],
)
async def test_what_only_the_runtime_can_check_is_refused_at_start(
    spec: AgentSpec, error: type[Exception], match: str
) -> None:
    async with open_runtime() as rt:
        with pytest.raises(error, match=match):
            await rt.start(spec)
        assert rt.agents.list() == []


async def test_start_refuses_what_is_not_a_spec_and_a_bad_cwd() -> None:
    async with open_runtime() as rt:
        with pytest.raises(TypeError, match="start\\(\\) takes an AgentSpec"):
            await rt.start("coder")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="cwd must be a path"):
            await rt.start(AgentSpec(name="a"), cwd=3)  # type: ignore[arg-type]


async def test_open_runtime_takes_a_store_url_and_a_bad_one_is_named(tmp_path: Path) -> None:
    from greenroom.session.persistence.urls import StoreError

    url = f"sqlite:{tmp_path / 'state.db'}"
    async with open_runtime(store=url) as rt:
        handle = await rt.start(AgentSpec(name="a"), "s")
        await handle.agent.run("kept")
    async with open_runtime(store=url) as rt:
        again = await rt.start(AgentSpec(name="a"), "s")
        assert [e.text for e in again.agent.history()] == ["kept", "kept"]
    with pytest.raises(StoreError, match=r"open_runtime\(store=\.\.\.\) nope: not a store URL"):
        async with open_runtime(store="nope"):
            pass
    with pytest.raises(ValueError, match="either persistence= or store="):
        async with open_runtime(store=url, persistence=JsonlPersistence(tmp_path)):
            pass


async def test_a_parent_spawns_a_spec_and_the_task_tool_starts_only_the_specs_it_was_given() -> (
    None
):
    from greenroom.actors.events import SUBAGENT_STARTED
    from greenroom.tools.subagents import task_tool

    researcher_model = ScriptedModel([[Say("found it")]])
    researcher = AgentSpec(name="researcher", model=researcher_model, instructions="Dig.")
    lead_model = ScriptedModel(
        [
            [CallTool("task", {"prompt": "look it up", "agent": "researcher"})],
            [CallTool("task", {"prompt": "write it", "agent": "writer"})],
            [Say("done")],
        ]
    )
    lead = AgentSpec(name="lead", model=lead_model, tools=[task_tool([researcher])])
    started: list[tuple[str, str]] = []
    async with open_runtime() as rt:
        rt.hooks.on(SUBAGENT_STARTED, lambda parent, call, child: started.append((call, child.id)))
        handle = await rt.start(lead, "L")
        answer = await handle.agent.run("research and write")
        child = await handle.spawn(researcher, session_id="R2")
        assert (child.id, child.spec) == ("researcher:R2", researcher)
        assert child.agent.session.header.parent_session == "L"
    results = [(c.name, c.result, c.is_error) for c in answer.tool_calls]
    assert results[0] == ("task", "found it", False)
    assert results[1][2] is True
    assert "agent must be one of researcher, not 'writer'" in results[1][1]
    assert researcher_model.requests[0].system == "Dig."
    assert len(started) == 1
    assert started[0][1].startswith("researcher:")
