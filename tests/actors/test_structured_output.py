"""Structured output: the final answer validates as the type asked for, or the prompt says why."""

from __future__ import annotations

import msgspec
import trio

from greenroom import open_runtime
from greenroom.actors.events import AGENT_TURN_CONTINUATION
from greenroom.actors.types import Agent
from greenroom.models import CallTool, End, Hang, Say, ScriptedModel
from greenroom.protocol.events import ContextMessage, Errored, PluginSource, ToolResult, TurnEnd
from greenroom.protocol.model import ToolTurn, UserTurn
from greenroom.tools import Tool
from tests.agents_helpers import user_messages_by_turn


class City(msgspec.Struct):
    name: str
    population: int


class Weather(msgspec.Struct):
    city: City
    sky: str


class _Look(msgspec.Struct):
    city: str


async def _look(args: _Look, _invocation: object) -> str:
    await trio.lowlevel.checkpoint()
    return f"{args.city}: sunny"


LOOK = Tool("look", "Look at the sky over a city.", _Look, _look)

VALID = {"name": "Lyon", "population": 522000}


async def test_a_valid_final_answer_is_the_typed_output() -> None:
    model = ScriptedModel([[Say("here it is"), CallTool("final_answer", VALID)]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=City)
        events = list(agent.session.events)
    assert answer.stop_reason == "completed"
    assert answer.output == City("Lyon", 522000)
    assert answer.tool_calls == ()  # the output's call is the output, not a call of the answer
    assert answer.text == "here it is"
    (request,) = model.requests  # a valid answer ends the turn: no second step
    offered = {tool.name: tool for tool in request.tools}
    assert request.output is not None
    assert offered["final_answer"] == request.output
    assert request.output.parameters["properties"] == {
        "name": {"type": "string"},
        "population": {"type": "integer"},
    }
    assert request.output.parameters["required"] == ["name", "population"]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [r.is_error for r in results] == [False]  # the history holds the call's result


async def test_a_nested_type_is_offered_with_its_definitions() -> None:
    answer = {"city": VALID, "sky": "clear"}
    model = ScriptedModel([[CallTool("final_answer", answer)]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        result = await agent.run("weather?", output=Weather)
    assert result.output == Weather(City("Lyon", 522000), "clear")
    schema = model.requests[0].tools[-1].parameters
    assert schema["type"] == "object"
    assert schema["properties"]["city"] == {"$ref": "#/$defs/City"}
    assert "City" in schema["$defs"]


async def test_invalid_then_valid_gives_the_model_the_error_and_one_more_step() -> None:
    model = ScriptedModel(
        [
            [CallTool("final_answer", {"name": "Lyon", "population": "many"})],
            [CallTool("final_answer", VALID)],
        ],
        delay=0,
    )
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=City)
    assert answer.stop_reason == "completed"
    assert answer.output == City("Lyon", 522000)
    told = model.requests[1].messages[-1]
    assert isinstance(told, ToolTurn)
    assert told.is_error
    assert "Expected `int`, got `str` - at `$.population`" in told.content


async def test_invalid_twice_settles_error_naming_the_field() -> None:
    model = ScriptedModel(
        [
            [CallTool("final_answer", {"name": "Lyon"})],
            [CallTool("final_answer", {"name": "Lyon", "population": "many"})],
            [Say("never asked")],
        ],
        delay=0,
    )
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=City)
        events = list(agent.session.events)
    assert answer.stop_reason == "error"
    assert answer.output is None
    assert answer.reason is not None
    assert "did not validate as City" in answer.reason
    assert "at `$.population`" in answer.reason
    assert len(model.requests) == 2  # one more step, then no more
    end = events[-1]
    assert isinstance(end, TurnEnd)
    assert isinstance(end.reason, Errored)
    assert end.reason.code == "invalid-output"
    assert end.reason.step == 2


async def test_a_text_answer_that_validates_is_the_output() -> None:
    fenced = '```json\n{"name": "Lyon", "population": 522000}\n```'
    model = ScriptedModel([[Say(fenced)]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=City)
    assert answer.output == City("Lyon", 522000)
    assert answer.text == fenced


async def test_an_invalid_text_answer_is_told_in_the_history_then_retried() -> None:
    model = ScriptedModel([[Say("Lyon, I think")], [CallTool("final_answer", VALID)]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=City)
        events = list(agent.session.events)
    assert answer.output == City("Lyon", 522000)
    (notice,) = [e for e in events if isinstance(e, ContextMessage)]
    assert notice.source == PluginSource("output")
    assert "not JSON of a City" in notice.content
    told = model.requests[1].messages[-1]
    assert isinstance(told, UserTurn)
    assert "final_answer" in told.content


async def test_tools_run_before_the_final_answer() -> None:
    model = ScriptedModel(
        [[CallTool("look", {"city": "Lyon"})], [CallTool("final_answer", VALID)]], delay=0
    )
    async with open_runtime(model=model, tools=[LOOK]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=City)
    assert answer.output == City("Lyon", 522000)
    assert [(c.name, c.result) for c in answer.tool_calls] == [("look", "Lyon: sunny")]
    assert [t.name for t in model.requests[0].tools] == ["look", "final_answer"]


async def test_a_turn_stopped_before_any_answer_is_an_error() -> None:
    model = ScriptedModel([[CallTool("look", {"city": "Lyon"})]], delay=0)
    async with open_runtime(model=model, tools=[LOOK]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent

        async def stop(go_on: bool, agent_: Agent, turn: int) -> bool:
            return False

        rt.hooks.on(AGENT_TURN_CONTINUATION, stop)
        answer = await agent.run("which city?", output=City)
    assert answer.stop_reason == "error"
    assert answer.reason == "the turn ended without a final answer (City)"


async def test_max_tokens_is_no_attempt() -> None:
    model = ScriptedModel([[Say('{"name": "Ly'), End("max-tokens")]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=City)
    assert answer.stop_reason == "max-tokens"
    assert answer.output is None


async def test_prompts_asking_for_different_outputs_never_share_a_turn() -> None:
    model = ScriptedModel(
        [
            [CallTool("final_answer", VALID)],
            [CallTool("final_answer", {"city": VALID, "sky": "grey"})],
            [Say("plain")],
        ],
        delay=0,
    )
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        one, two = agent.send("a city", output=City), agent.send("same type", output=City)
        three = agent.send("the weather", output=Weather)
        four = agent.send("plain text")
        answers = [await p for p in (one, two, three, four)]
        events = list(agent.session.events)
    assert user_messages_by_turn(events) == {
        1: ["a city", "same type"],
        2: ["the weather"],
        3: ["plain text"],
    }
    assert answers[0] is answers[1]
    assert answers[2].output == Weather(City("Lyon", 522000), "grey")
    assert answers[3].output is None
    assert answers[3].text == "plain"
    assert model.requests[2].output is None
    assert "final_answer" not in [t.name for t in model.requests[2].tools]


async def test_a_cancel_aborts_an_output_turn() -> None:
    async with open_runtime(model=ScriptedModel([[Hang()]])) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        prompt = agent.send("which city?", output=City)
        await trio.sleep(1)
        agent.cancel("no need")
        answer = await prompt
    assert (answer.stop_reason, answer.reason, answer.output) == ("aborted", "no need", None)
