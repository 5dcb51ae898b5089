"""MCP: one tool call of a stdio server through a whole turn, against the same call made raw.

* ours: a session given the published ``mcp-server-time`` as its server; each
  turn is a scripted model that calls ``mcp__time__get_current_time`` and then
  answers (two steps, the call logged, gated and run through the registry),
  in microseconds per turn;
* raw: the same call, ``ClientSession.call_tool("get_current_time", ...)``,
  on the SDK's own stdio client to a second process of the same server, in
  microseconds per call.

Both run in one ``trio.run`` per repeat, alternating which goes first, after
a warm-up of each; the servers are started before the clocks run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from bench.report import Row, compare
from greenroom import open_runtime
from greenroom.models.scripted import CallTool, Say, ScriptedModel
from greenroom.protocol.mcp import McpStdioServer

SCENARIO = "mcp"
_SERVER = str(Path(sys.executable).with_name("mcp-server-time"))
_ARGUMENTS = {"timezone": "Europe/Paris"}
_WARM = 20


async def _ours(turns: int) -> float:
    scripts = [
        script
        for _ in range(turns + _WARM)
        for script in ([CallTool("mcp__time__get_current_time", _ARGUMENTS)], [Say("ok")])
    ]
    model = ScriptedModel(scripts, delay=0)
    async with open_runtime(model=model) as rt:
        handle = await rt.agents.create(
            agent_id="bench",
            session_id="bench",
            mcp_servers=[McpStdioServer(name="time", command=_SERVER)],
        )
        agent = handle.agent
        for _ in range(_WARM):
            agent.send("time?")
            await agent.when_idle()
        t0 = time.perf_counter()
        for _ in range(turns):
            agent.send("time?")
            await agent.when_idle()
        took = time.perf_counter() - t0
        await handle.dispose()
    return took / turns * 1e6


async def _raw(calls: int) -> float:
    async with (
        stdio_client(StdioServerParameters(command=_SERVER)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for _ in range(_WARM):
            await session.call_tool("get_current_time", _ARGUMENTS)
        t0 = time.perf_counter()
        for _ in range(calls):
            await session.call_tool("get_current_time", _ARGUMENTS)
        took = time.perf_counter() - t0
    return took / calls * 1e6


def run(repeats: int, quick: bool) -> list[Row]:
    n = 100 if quick else 500
    ours: list[float] = []
    raw: list[float] = []
    for repeat in range(repeats):

        async def both(first: int = repeat % 2) -> tuple[float, float]:
            if first:
                return await _ours(n), await _raw(n)
            raw_us = await _raw(n)
            return await _ours(n), raw_us

        ours_us, raw_us = trio.run(both)
        ours.append(ours_us)
        raw.append(raw_us)
    return [
        compare(
            SCENARIO,
            "one MCP tool call through a turn (stdio mcp-server-time)",
            "us",
            ours,
            baseline="the same call on the SDK's ClientSession",
            raw=raw,
            max_ratio=1.5,
            note="a turn is two scripted model steps around the call",
        )
    ]
