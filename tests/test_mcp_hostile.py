"""Hostile MCP servers and hostile specs: nothing may crash, hang, leak or lie."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.models.scripted import CallTool, Say, ScriptedModel
from greenroom.protocol.events import Completed
from greenroom.protocol.mcp import McpStdioServer
from greenroom.tools.mcp import tool_name
from tests.test_mcp import alive, ends, pids, results, served, until, watch

pytestmark = pytest.mark.real_clock

LIMIT = 30.0


def hostile(name: str, *flags: str, record: Path | None = None, **changes: object) -> McpStdioServer:
    spec = served(name, "hostile", *flags, record=record)
    return msgspec.structs.replace(spec, **changes) if changes else spec


async def test_dispose_exits_cleanly(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h")])
            await handle.dispose()
            print(list(rt.supervisor.exits))
            assert [e.outcome for e in rt.supervisor.exits] == ["normal"]


async def test_silent(tmp_path: Path) -> None:
    record = tmp_path / "r"
    spec = msgspec.structs.replace(served("quiet", "silent", record=record), start_timeout=1.0)
    with trio.fail_after(LIMIT):
        async with open_runtime() as rt:
            statuses = watch(rt)
            t0 = time.monotonic()
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[spec])
            print("create took", time.monotonic() - t0, statuses)
            t0 = time.monotonic()
            await handle.dispose()
            print("dispose took", time.monotonic() - t0, statuses)
            print([ (p, alive(p)) for p in pids(record)])


async def test_die_mid_call(tmp_path: Path) -> None:
    record = tmp_path / "r"
    model = ScriptedModel([[CallTool(tool_name("h", "die"))], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)])
            handle.agent.send("die")
            await handle.agent.when_idle()
            print(results(handle.agent), ends(handle.agent))
            await until(lambda: statuses[-1].state == "ready" and len(statuses) > 1, "back")
            print(statuses, pids(record))


async def test_garble(tmp_path: Path) -> None:
    record = tmp_path / "r"
    model = ScriptedModel([[CallTool(tool_name("h", "garble"))], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h", "garbage", record=record)])
            print(statuses)
            handle.agent.send("garble")
            with trio.move_on_after(8):
                await handle.agent.when_idle()
            print(results(handle.agent), ends(handle.agent))
            await trio.sleep(2)
            print(statuses, pids(record))


async def test_flood(tmp_path: Path) -> None:
    record = tmp_path / "r"
    model = ScriptedModel([[CallTool(tool_name("h", "flood"), {"n": 20000})], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)])
            t0 = time.monotonic()
            handle.agent.send("flood")
            await handle.agent.when_idle()
            print("took", time.monotonic() - t0, results(handle.agent)[-1].content[:100])
            await trio.sleep(2)
            print(len(statuses), statuses[-3:])


async def test_shrink(tmp_path: Path) -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "shrink"))], [Say("ok")], [Say("again")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h")])
            handle.agent.send("shrink")
            await handle.agent.when_idle()
            await until(lambda: statuses[-1].tools == 7, "shrunk")
            handle.agent.send("again")
            await handle.agent.when_idle()
            print([t.name for t in model.requests[-1].tools])


async def test_names(tmp_path: Path) -> None:
    model = ScriptedModel([[Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h", "names")])
            handle.agent.send("x")
            await handle.agent.when_idle()
            print(statuses, [t.name for t in model.requests[-1].tools])


@pytest.mark.parametrize("mb", [1, 10, 40])
async def test_giant(tmp_path: Path, mb: int) -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "giant"), {"mb": mb})], [Say("ok")]])
    with trio.fail_after(LIMIT * 4):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h")])
            t0 = time.monotonic()
            handle.agent.send("giant")
            await handle.agent.when_idle()
            print("mb", mb, "took", time.monotonic() - t0, len(results(handle.agent)[-1].content))


async def test_endless_relist(tmp_path: Path) -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "flood"), {"n": 1})], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h", "endless", start_timeout=2.0)])
            handle.agent.send("x")
            await handle.agent.when_idle()
            await trio.sleep(5)
            print(statuses)


async def test_relist_hangs(tmp_path: Path) -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "shrink"))], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            statuses = watch(rt)
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h", "relist-hangs", start_timeout=2.0)])
            handle.agent.send("x")
            await handle.agent.when_idle()
            await trio.sleep(5)
            print(statuses)


async def test_spawn_child(tmp_path: Path) -> None:
    record = tmp_path / "r"
    model = ScriptedModel([[CallTool(tool_name("h", "spawn"))], [Say("ok")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s", mcp_servers=[hostile("h", record=record)])
            handle.agent.send("x")
            await handle.agent.when_idle()
            t0 = time.monotonic()
            await handle.dispose()
            print("dispose", time.monotonic() - t0, record.read_text())
            child = int(record.read_text().split("child ")[1].split()[0])
            print("child alive", alive(child))
            if alive(child):
                os.kill(child, signal.SIGKILL)
