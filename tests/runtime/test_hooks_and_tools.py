"""Hooks (scoped listeners, contained errors) and the tool seam the loop calls."""

from __future__ import annotations

import logging

import msgspec
import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation, ToolOutcome
from greenroom.hooks import EmitHook, Hooks, WaterfallHook
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import COMPLETED, Aborted, ToolResult
from greenroom.protocol.model import ToolTurn
from greenroom.supervisor import Scope
from greenroom.tools import TOOLS_EXECUTE, Tool, ToolRegistry
from tests.agents_helpers import new_agent, turn_ends

PING: EmitHook[[int]] = EmitHook("test/ping")
DOUBLE: WaterfallHook[int, []] = WaterfallHook("test/double")


async def test_a_scoped_listener_is_removed_when_its_scope_closes() -> None:
    hooks = Hooks()
    seen: list[int] = []
    async with Scope() as scope:
        hooks.on(PING, seen.append, scope=scope)
        hooks.emit(PING, 1)
    hooks.emit(PING, 2)
    assert seen == [1]
    assert PING not in hooks.listened


def test_a_raising_listener_is_contained_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    hooks = Hooks()
    seen: list[int] = []

    def bad(value: int) -> None:
        raise ValueError("broken listener")

    hooks.on(PING, bad)
    hooks.on(PING, seen.append)
    with caplog.at_level(logging.ERROR, logger="greenroom.hooks"):
        hooks.emit(PING, 7)
    assert seen == [7]
    assert "test/ping" in caplog.text
    assert "broken listener" in caplog.text


async def test_waterfall_handlers_run_in_order() -> None:
    hooks = Hooks()

    async def double(value: int) -> int:
        return value * 2

    async def plus_one(value: int) -> int:
        return value + 1

    hooks.intercept(DOUBLE, double)
    remove = hooks.intercept(DOUBLE, plus_one)
    assert await hooks.waterfall(DOUBLE, 5) == 11
    remove()
    remove()  # idempotent
    assert await hooks.waterfall(DOUBLE, 5) == 10


class EchoArgs(msgspec.Struct):
    text: str
    times: int = 1


async def _echo(args: EchoArgs, call: ToolInvocation) -> str:
    return args.text * args.times


async def _explode(args: EchoArgs, call: ToolInvocation) -> str:
    raise OSError("disk on fire")


def _call(name: str, arguments: str) -> ToolInvocation:
    return ToolInvocation(call_id="c1", name=name, arguments=arguments, agent=None)


async def test_tool_arguments_are_validated_against_the_struct() -> None:
    tools = ToolRegistry(Hooks())
    tools.register(Tool("echo", "repeat text", EchoArgs, _echo))
    assert await tools.execute(_call("echo", '{"text": "ab", "times": 2}')) == ToolOutcome("abab")
    missing = await tools.execute(_call("echo", "{}"))
    assert missing.is_error
    assert "invalid arguments for echo" in missing.content
    assert "`text`" in missing.content
    wrong = await tools.execute(_call("echo", '{"text": "a", "times": "x"}'))
    assert "$.times" in wrong.content
    garbage = await tools.execute(_call("echo", "{not json"))
    assert "not a JSON object" in garbage.content
    unknown = await tools.execute(_call("nope", "{}"))
    assert unknown.content == "unknown tool 'nope' (known tools: echo)"
    assert unknown.error is not None
    assert unknown.error.code == "unknown-tool"


async def test_a_raising_tool_or_a_refusing_hook_is_an_error_result() -> None:
    hooks = Hooks()
    tools = ToolRegistry(hooks)
    tools.register(Tool("explode", "fails", EchoArgs, _explode))
    outcome = await tools.execute(_call("explode", '{"text": "x"}'))
    assert outcome.is_error
    assert outcome.content == "explode failed: OSError: disk on fire"

    async def refuse(call: ToolInvocation) -> ToolInvocation:
        raise PermissionError("not on a Sunday")

    hooks.intercept(TOOLS_EXECUTE, refuse)
    refused = await tools.execute(_call("explode", '{"text": "x"}'))
    assert refused.content == "tool call 'explode' was refused: not on a Sunday"


def test_tool_schemas_describe_the_arguments() -> None:
    tools = ToolRegistry(Hooks())
    tools.register(Tool("echo", "repeat text", EchoArgs, _echo))
    (schema,) = tools.schemas()
    assert schema.name == "echo"
    assert schema.parameters["required"] == ["text"]
    assert set(schema.parameters["properties"]) == {"text", "times"}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a tool named 'echo' is already registered"):
        tools.register(Tool("echo", "again", EchoArgs, _echo))


async def test_a_full_turn_round_trips_a_tool_call() -> None:
    model = ScriptedModel([[CallTool("echo", {"text": "hi", "times": 3})], [Say("done")]])
    async with open_runtime(model=model, tools=[Tool("echo", "repeat", EchoArgs, _echo)]) as rt:
        agent = await new_agent(rt)
        agent.send("use the tool")
        await agent.when_idle()
        results = [e for e in agent.session.events if isinstance(e, ToolResult)]
        assert [(r.call_id, r.content, r.is_error) for r in results] == [
            ("call-1", "hihihi", False)
        ]
        assert turn_ends(agent.session.events) == [(1, COMPLETED)]
        assert model.requests[0].tools[0].name == "echo"
        assert model.requests[1].messages[-1] == ToolTurn("call-1", "hihihi")


async def test_cancel_reaches_a_running_tool_through_the_turn_scope() -> None:
    entered = trio.Event()
    reasons: list[str | None] = []

    async def slow(args: EchoArgs, call: ToolInvocation) -> str:
        entered.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled as cancel:
            reasons.append(cancel.reason)
            raise
        return "unreachable"

    model = ScriptedModel([[CallTool("slow", {"text": "x"})]])
    async with open_runtime(model=model, tools=[Tool("slow", "waits", EchoArgs, slow)]) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await entered.wait()
        agent.cancel("user pressed stop")
        await agent.when_idle()
        assert reasons == ["user pressed stop"]
        assert turn_ends(agent.session.events) == [(1, Aborted("user pressed stop"))]
