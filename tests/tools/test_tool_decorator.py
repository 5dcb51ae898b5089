"""`@tool`: typed functions as tools, their schema read off the signature and the docstring,
and every way a function or a registration is refused."""

from __future__ import annotations

import threading
from typing import Annotated, Any, Literal

import msgspec
import pytest
import trio

from greenroom import open_runtime, tool
from greenroom.actors.types import PermissionRequest, ToolInvocation, ToolOutcome, ToolView
from greenroom.hooks import Hooks
from greenroom.models.scripted import CallTool, Say, ScriptedModel
from greenroom.protocol.events import COMPLETED, Aborted, PermissionDecision, ToolResult
from greenroom.tools import Tool, ToolRegistry
from greenroom.tools.plugins import PluginContext
from greenroom.tools.typed import as_tool
from tests.agents_helpers import new_agent, turn_ends


class Point(msgspec.Struct):
    x: int
    y: int


@tool
async def weather(
    city: Annotated[str, "The city, as its people spell it"],
    unit: Literal["C", "F"] = "C",
    days: int = 1,
) -> str:
    """Today's weather in a city.

    Args:
        unit: Celsius or Fahrenheit.
        days: How many days
            ahead to look.
    """
    return f"{city}: 21 {unit} for {days} day(s)"


@tool
def distance(a: Point, b: Point, *, manhattan: bool = False) -> dict[str, int]:
    """The distance between two points.

    Parameters
    ----------
    a : Point
        The first point.
    b : Point
        The second point.
    manhattan : bool
        Sum of the sides instead of the longest side.

    Returns
    -------
    dict
        The distance.
    """
    dx, dy = abs(a.x - b.x), abs(a.y - b.y)
    return {"distance": dx + dy if manhattan else max(dx, dy)}


def schema_of(candidate: object) -> dict[str, Any]:
    registry = ToolRegistry(Hooks())
    registry.register(as_tool(candidate))
    (schema,) = registry.schemas()
    return {"name": schema.name, "description": schema.description, **schema.parameters}


def test_the_schema_comes_from_the_signature_and_a_google_docstring() -> None:
    schema = schema_of(weather)
    assert schema["name"] == "weather"
    assert schema["description"] == "Today's weather in a city."
    assert schema["required"] == ["city"]
    properties = schema["properties"]
    assert properties["city"] == {
        "type": "string",
        "description": "The city, as its people spell it",
    }
    assert properties["unit"] == {
        "enum": ["C", "F"],
        "default": "C",
        "description": "Celsius or Fahrenheit.",
    }
    assert properties["days"] == {
        "type": "integer",
        "default": 1,
        "description": "How many days ahead to look.",
    }


def test_the_schema_comes_from_a_numpy_docstring_and_struct_arguments() -> None:
    schema = schema_of(distance)
    assert schema["description"] == "The distance between two points."
    assert schema["required"] == ["a", "b"]
    assert schema["properties"]["a"]["description"] == "The first point."
    assert schema["properties"]["manhattan"] == {
        "type": "boolean",
        "default": False,
        "description": "Sum of the sides instead of the longest side.",
    }
    assert schema["$defs"]["Point"]["required"] == ["x", "y"]


def test_a_decorated_function_is_still_the_function() -> None:
    assert distance(Point(0, 0), Point(3, 4)) == {"distance": 4}
    assert distance(Point(0, 0), Point(3, 4), manhattan=True) == {"distance": 7}


async def test_a_turn_calls_decorated_functions_sync_and_async() -> None:
    model = ScriptedModel(
        [
            [
                CallTool("weather", {"city": "Lyon", "days": 2}),
                CallTool("distance", {"a": {"x": 0, "y": 0}, "b": {"x": 3, "y": 4}}),
                CallTool("weather", {"town": "Lyon"}),
            ],
            [Say("done")],
        ]
    )
    async with open_runtime(model=model, tools=[weather, distance]) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await agent.when_idle()
        results = [e for e in agent.session.events if isinstance(e, ToolResult)]
    assert [(r.content, r.is_error) for r in results[:2]] == [
        ("Lyon: 21 C for 2 day(s)", False),
        ('{"distance":4}', False),
    ]
    assert results[2].is_error
    assert "invalid arguments for weather" in results[2].content
    assert "town" in results[2].content
    assert turn_ends(agent.session.events) == [(1, COMPLETED)]


async def test_a_sync_tool_runs_on_the_trio_thread_a_threaded_one_off_it() -> None:
    seen: dict[str, threading.Thread] = {}

    @tool
    def here() -> str:
        """Where am I."""
        seen["here"] = threading.current_thread()
        return "here"

    @tool(thread=True)
    def there() -> str:
        """Where am I."""
        seen["there"] = threading.current_thread()
        return "there"

    registry = ToolRegistry(Hooks())
    registry.register(as_tool(here))
    registry.register(as_tool(there))
    for name in ("here", "there"):
        call = ToolInvocation(call_id="c", name=name, arguments="{}", agent=None)
        assert await registry.execute(call) == ToolOutcome(name)
    assert seen["here"] is threading.current_thread()
    assert seen["there"] is not threading.current_thread()


async def test_a_cancel_ends_a_threaded_tool_at_once() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    @tool(thread=True)
    def blocking() -> str:
        """Blocks until released."""
        started.set()
        release.wait(10)
        finished.set()
        return "late"

    model = ScriptedModel([[CallTool("blocking")]])
    try:
        async with open_runtime(model=model, tools=[blocking]) as rt:
            agent = await new_agent(rt)
            agent.send("go")
            await trio.to_thread.run_sync(started.wait, 30)
            agent.cancel("stop")
            await agent.when_idle()
            assert turn_ends(agent.session.events) == [(1, Aborted("stop"))]
            (result,) = [e for e in agent.session.events if isinstance(e, ToolResult)]
            assert result.is_error
            assert "aborted" in result.content
            assert not finished.is_set()  # the turn did not wait for the thread
    finally:
        release.set()


async def test_kind_and_view_are_the_tools() -> None:
    asked: list[PermissionRequest] = []

    class Refuse:
        async def decide(self, request: PermissionRequest) -> PermissionDecision:
            asked.append(request)
            await trio.lowlevel.checkpoint()
            return "reject_once"

    def shown(args: Any) -> ToolView:
        return ToolView(title=f"remove {args.path}")

    ran: list[str] = []

    @tool(kind="delete", view=shown, name="rm")
    def remove(path: str) -> str:
        """Remove a file."""
        ran.append(path)
        return "removed"

    registry = ToolRegistry(Hooks(), Refuse())
    registry.register(as_tool(remove))
    assert registry.describe("rm", '{"path": "a.txt"}') == ToolView(
        kind="delete", title="remove a.txt"
    )
    call = ToolInvocation(call_id="c", name="rm", arguments='{"path": "a.txt"}', agent=None)
    outcome = await registry.execute(call)
    assert outcome.is_error
    assert "refused" in outcome.content
    assert [(r.tool, r.kind, r.title) for r in asked] == [("rm", "delete", "remove a.txt")]
    assert ran == []


async def test_a_tool_can_take_its_invocation() -> None:
    @tool
    async def whoami(call: ToolInvocation, greeting: str = "hi") -> ToolOutcome:
        """Who calls."""
        await trio.lowlevel.checkpoint()
        agent = call.agent.id if call.agent is not None else "nobody"
        return ToolOutcome(f"{greeting} {agent} ({call.call_id})", is_error=True)

    assert list(schema_of(whoami)["properties"]) == ["greeting"]
    model = ScriptedModel([[CallTool("whoami", {"greeting": "hello"})], [Say("ok")]])
    async with open_runtime(model=model, tools=[whoami]) as rt:
        agent = await new_agent(rt, agent_id="ada")
        agent.send("go")
        await agent.when_idle()
        (result,) = [e for e in agent.session.events if isinstance(e, ToolResult)]
    assert (result.content, result.is_error) == ("hello ada (call-1)", True)


# -- refused at decoration ---------------------------------------------------------------------


class NotJson:
    pass


def no_annotation(city) -> str:  # type: ignore[no-untyped-def]
    return str(city)


def unsupported(city: str, where: NotJson) -> str:
    return city


def star_args(*cities: str) -> str:
    return ""


def star_kwargs(**cities: str) -> str:
    return ""


def bad_default(cities: list[str] = ["Lyon"]) -> str:  # noqa: B006
    return ""


def unresolved(city: Missing) -> str:  # type: ignore[name-defined]  # noqa: F821
    return ""


async def async_function() -> str:
    return ""


class Holder:
    def method(self, city: str) -> str:
        return city


@pytest.mark.parametrize(
    ("function", "options", "message"),
    [
        (no_annotation, {}, "parameter 'city' has no annotation"),
        (unsupported, {}, "parameter 'where': .*NotJson.* is not a JSON type"),
        (star_args, {}, r"parameter 'cities': \*args and \*\*kwargs"),
        (star_kwargs, {}, r"parameter 'cities': \*args and \*\*kwargs"),
        (bad_default, {}, "bad_default"),
        (unresolved, {}, "unresolved: its annotations do not resolve.*Missing"),
        (async_function, {"thread": True}, "an async function needs no thread"),
        (Holder.method, {}, "parameter 'self': a method cannot be a tool"),
        (star_args, {"kind": "destroy"}, "kind 'destroy' is not one of read, edit"),
        (star_args, {"name": "two words"}, "the name 'two words' must be"),
    ],
)
def test_a_function_that_cannot_be_a_tool_is_refused_at_decoration(
    function: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        tool(**options)(function)


# -- refused at registration -------------------------------------------------------------------


def plain_function(city: str) -> str:
    return city


def a_plugin(ctx: PluginContext) -> None:
    pass


@pytest.mark.parametrize(
    ("candidate", "message"),
    [
        (plain_function, "plain_function is not a tool .a plain function: decorate it"),
        (a_plugin, "a_plugin is not a tool .*a plugin goes to Runtime.plug"),
        (Point, "Point is not a tool: a tool is a greenroom.tools.Tool"),
        (42, "int is not a tool"),
    ],
)
async def test_open_runtime_refuses_what_is_not_a_tool(candidate: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        async with open_runtime(tools=[candidate]):  # type: ignore[list-item]
            pytest.fail("the runtime opened")


async def test_a_plugin_registers_decorated_functions_and_is_refused_plain_ones() -> None:
    refused: list[str] = []

    def plugin(ctx: PluginContext) -> None:
        ctx.register_tool(weather)
        try:
            ctx.register_tool(plain_function)
        except TypeError as exc:
            refused.append(str(exc))

    async with open_runtime() as rt:
        await rt.plug("weather", plugin)
        assert [s.name for s in rt.tools.schemas()] == ["weather"]
        await rt.plugins.stop_child("weather")
        assert rt.tools.schemas() == []
    assert len(refused) == 1
    assert "decorate it with @greenroom.tool" in refused[0]


def test_a_tool_object_is_taken_as_it_is() -> None:
    made = as_tool(weather)
    assert isinstance(made, Tool)
    assert as_tool(made) is made
