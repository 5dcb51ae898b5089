"""Peers: the same one-step and one-tool-call turns in greenroom, two floors and two frameworks.

Every variant runs M turns back to back (after a few untimed warm-up turns)
and reports microseconds per turn:

* greenroom: ``agent.send("ping"); await agent.when_idle()`` on one agent of
  ``open_runtime``; the text turn with ``ScriptedModel(delay=0)`` (an echo,
  one text delta), the tool turn with a `ScriptedModel` scripted
  ``[CallTool("noop", {})], [Say("done")]`` per turn and a registered no-op
  ``Tool`` (two model calls, one tool call, per turn);
* raw Trio floor: a round trip through an echo task over two memory channels
  (two round trips for the tool turn);
* asyncio floor: the same over two ``asyncio.Queue``s (two for the tool turn);
* pydantic-ai: ``await agent.run("ping")`` of an ``Agent(FunctionModel(fn))``
  whose async ``fn`` answers text, or first a call of a registered async
  no-op tool and then text (a fresh run, so a fresh history, every turn);
* OpenAI Agents SDK: ``await Runner.run(agent, "ping")`` with a fake
  in-process ``Model`` whose ``get_response`` returns a canned
  ``ModelResponse`` (text, or first a ``function_call`` of an async no-op
  ``function_tool`` and then text); tracing is disabled through
  ``RunConfig(tracing_disabled=True)`` (with it on, the SDK does more per run).

greenroom's agent keeps its whole session: its turns append to one growing
log, while each peer run starts from an empty history, which can only favour
the peers. The peers and the asyncio floor run in ``asyncio.run``, greenroom
and the Trio floor in ``trio.run``, each variant in a fresh loop; the
variants alternate inside each repeat, with a ``gc.collect()`` before each.
The ratios are peer / greenroom per repeat, so ">= 30x" reads "greenroom's
turn costs at least 30 times less".
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import msgspec
import trio

from bench.report import Row, compare, skipped
from greenroom.actors.types import ToolInvocation
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import ToolResult
from greenroom.runtime import open_runtime
from greenroom.tools import Tool

SCENARIO = "peers"
_WARMUP = 20  # untimed turns before each timed loop
_INSTALL = "pip install -e '.[bench]'"

#: (goal) peer / greenroom, one-step text turn
_GOALS = {"pydantic-ai": 30.0, "openai-agents": 15.0}

# -- greenroom ------------------------------------------------------------------------------


class _NoArgs(msgspec.Struct):
    pass


async def _noop_tool(args: _NoArgs, call: ToolInvocation) -> str:
    return "ok"


async def _greenroom(m: int, tool: bool) -> float:
    total = m + _WARMUP
    if tool:
        model = ScriptedModel([[CallTool("noop", {})], [Say("done")]] * total, delay=0)
        tools = [Tool("noop", "Does nothing.", _NoArgs, _noop_tool)]
    else:
        model, tools = ScriptedModel(delay=0), []
    async with open_runtime(model=model, tools=tools) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        for _ in range(_WARMUP):
            agent.send("ping")
            await agent.when_idle()
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        t1 = time.perf_counter()
        events = agent.session.events
        turns = agent.session.last_turn
        results = [e for e in events if isinstance(e, ToolResult)]
    if turns != total:
        raise RuntimeError(f"greenroom: expected {total} turns, the session has {turns}")
    if tool and (len(results) != total or any(r.content != "ok" or r.is_error for r in results)):
        raise RuntimeError(f"greenroom: expected {total} ok tool results, got {results[-3:]}")
    return (t1 - t0) / m * 1e6


# -- raw Trio floor ---------------------------------------------------------------------------


async def _trio_echo(
    inbound: trio.MemoryReceiveChannel[str], outbound: trio.MemorySendChannel[str]
) -> None:
    async for message in inbound:
        await outbound.send(message)


async def _trio_floor(m: int, trips: int) -> float:
    to_echo, echo_in = trio.open_memory_channel[str](1)
    echo_out, from_echo = trio.open_memory_channel[str](1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_trio_echo, echo_in, echo_out)
        for _ in range(_WARMUP * trips):
            await to_echo.send("ping")
            await from_echo.receive()
        t0 = time.perf_counter()
        for _ in range(m):
            for _ in range(trips):
                await to_echo.send("ping")
                await from_echo.receive()
        t1 = time.perf_counter()
        nursery.cancel_scope.cancel()
    return (t1 - t0) / m * 1e6


# -- asyncio floor ----------------------------------------------------------------------------


async def _asyncio_echo(inbound: asyncio.Queue[str], outbound: asyncio.Queue[str]) -> None:
    while True:
        await outbound.put(await inbound.get())


async def _asyncio_floor(m: int, trips: int) -> float:
    to_echo: asyncio.Queue[str] = asyncio.Queue(1)
    from_echo: asyncio.Queue[str] = asyncio.Queue(1)
    echo = asyncio.create_task(_asyncio_echo(to_echo, from_echo))
    try:
        for _ in range(_WARMUP * trips):
            await to_echo.put("ping")
            await from_echo.get()
        t0 = time.perf_counter()
        for _ in range(m):
            for _ in range(trips):
                await to_echo.put("ping")
                await from_echo.get()
        t1 = time.perf_counter()
    finally:
        echo.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await echo
    return (t1 - t0) / m * 1e6


# -- timing a peer's turn ---------------------------------------------------------------------


async def _time_runs(m: int, run_once: Callable[[], Any], check: Callable[[Any], None]) -> float:
    for _ in range(_WARMUP):
        check(await run_once())
    t0 = time.perf_counter()
    for _ in range(m):
        result = await run_once()
    t1 = time.perf_counter()
    check(result)
    return (t1 - t0) / m * 1e6


# -- pydantic-ai ------------------------------------------------------------------------------


def _pydantic_ai(m: int, tool: bool) -> float:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    calls = 0

    async def text(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("pong")])

    async def call_then_text(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("noop", {})])

    agent = Agent(FunctionModel(call_then_text if tool else text))

    if tool:

        @agent.tool_plain
        async def noop() -> str:
            """Does nothing."""
            nonlocal calls
            calls += 1
            return "ok"

    expected = "done" if tool else "pong"

    def check(result: Any) -> None:
        if result.output != expected:
            raise RuntimeError(f"pydantic-ai: output {result.output!r}, expected {expected!r}")

    us = asyncio.run(_time_runs(m, lambda: agent.run("ping"), check))
    if tool and calls != m + _WARMUP:
        raise RuntimeError(f"pydantic-ai: the tool ran {calls} times, expected {m + _WARMUP}")
    return us


# -- OpenAI Agents SDK ------------------------------------------------------------------------


def _openai_agents(m: int, tool: bool) -> float:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    calls = 0

    class FakeModel(Model):
        """Answers every request in-process with a canned response; no I/O."""

        def __init__(self, call_tool: bool) -> None:
            self._call_tool = call_tool
            self._ids = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            items = kwargs.get("input", args[1] if len(args) > 1 else "")
            answered = not isinstance(items, str) and any(
                isinstance(item, dict) and item.get("type") == "function_call_output"
                for item in items
            )
            self._ids += 1
            output: list[Any]
            if self._call_tool and not answered:
                output = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        id=f"fc_{self._ids}",
                        call_id=f"call_{self._ids}",
                        name="noop",
                        arguments="{}",
                        status="completed",
                    )
                ]
            else:
                text = "done" if self._call_tool else "pong"
                output = [
                    ResponseOutputMessage(
                        type="message",
                        id=f"msg_{self._ids}",
                        role="assistant",
                        status="completed",
                        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the bench does not stream")

    @function_tool
    async def noop() -> str:
        """Does nothing."""
        nonlocal calls
        calls += 1
        return "ok"

    agent = Agent(name="bench", model=FakeModel(tool), tools=[noop] if tool else [])
    config = RunConfig(tracing_disabled=True)
    expected = "done" if tool else "pong"

    def check(result: Any) -> None:
        if result.final_output != expected:
            raise RuntimeError(f"openai-agents: output {result.final_output!r}")

    us = asyncio.run(_time_runs(m, lambda: Runner.run(agent, "ping", run_config=config), check))
    if tool and calls != m + _WARMUP:
        raise RuntimeError(f"openai-agents: the tool ran {calls} times, expected {m + _WARMUP}")
    return us


# -- the scenario ---------------------------------------------------------------------------

#: Each peer: its distribution (to check it is installed), what it is called in the report.
_PEERS: dict[str, tuple[str, str, Callable[[int, bool], float]]] = {
    "pydantic-ai": ("pydantic_ai", "pydantic-ai Agent.run, FunctionModel", _pydantic_ai),
    "openai-agents": ("agents", "OpenAI Agents SDK Runner.run, fake Model", _openai_agents),
}


def _run_asyncio(fn: Callable[[int, int], Coroutine[Any, Any, float]], m: int, trips: int) -> float:
    return asyncio.run(fn(m, trips))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run(repeats: int, quick: bool) -> list[Row]:
    m_fast = 300 if quick else 2_000  # turns of greenroom and the floors
    m_peer = 100 if quick else 500  # turns of each peer (each costs far more)

    shapes = {"text": False, "tool": True}
    peers = {name: spec for name, spec in _PEERS.items() if _installed(spec[0])}

    values: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for shape, tool in shapes.items():
            trips = 2 if tool else 1
            variants: list[tuple[str, Callable[[], float]]] = [
                ("greenroom", partial(trio.run, _greenroom, m_fast, tool)),
                ("trio", partial(trio.run, _trio_floor, m_fast, trips)),
                ("asyncio", partial(_run_asyncio, _asyncio_floor, m_fast, trips)),
            ]
            for name, (_, _, measure) in peers.items():
                variants.append((name, partial(measure, m_peer, tool)))
            for name, variant in variants:
                gc.collect()
                values.setdefault((name, shape), []).append(variant())

    rows: list[Row] = []
    titles = {"text": "one-step text turn", "tool": "one-tool-call turn"}
    for shape, title in titles.items():
        ours = values[("greenroom", shape)]
        trips_text = "1 round trip" if shape == "text" else "2 round trips"
        rows.append(
            compare(
                SCENARIO,
                f"{title}: greenroom (M={m_fast})",
                "us",
                ours,
                baseline=f"raw Trio memory channels, {trips_text}",
                raw=values[("trio", shape)],
            )
        )
        rows.append(
            compare(
                SCENARIO,
                f"{title}: greenroom (M={m_fast})",
                "us",
                ours,
                baseline=f"asyncio.Queue, {trips_text}",
                raw=values[("asyncio", shape)],
            )
        )
        for name, (module, label, _) in _PEERS.items():
            goal = _GOALS[name] if shape == "text" else None
            metric = f"{title}: {label} (M={m_peer})"
            if name not in peers:
                rows.append(
                    skipped(
                        SCENARIO,
                        metric,
                        "us",
                        f"{name} is not installed (no module {module!r}); {_INSTALL}",
                        baseline="greenroom",
                        min_ratio=goal,
                    )
                )
                continue
            rows.append(
                compare(
                    SCENARIO,
                    metric,
                    "us",
                    values[(name, shape)],
                    baseline="greenroom",
                    raw=ours,
                    min_ratio=goal,
                    note=None
                    if goal is None
                    else f"ratio = {name} / greenroom per repeat; the goal is greenroom"
                    f" at least {goal:g}x lower",
                )
            )
    return rows
