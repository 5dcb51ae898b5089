"""The plan: the ``todo`` tool replaces the agent's plan whole, each change a ``plan/set``.

Runtime tests in virtual time; the ACP ones drive ``greenroom acp`` (the echo
model's ``todo:`` prompt) with the official SDK client, whose schema models
parse every frame, live and on ``session/load`` in a second process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import acp
from acp import schema

from greenroom import open_runtime
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import PlanEntry, PlanSet, ToolResult
from greenroom.session.persistence import JsonlPersistence
from greenroom.tools.subagents import task_plugin
from greenroom.tools.todo import TODO_NOTE, todo_plugin
from tests.acp_editor import Editor
from tests.actors.test_subagents import Routed
from tests.agents_helpers import new_agent

LIMIT = 30.0

PLAN = [
    {"content": "read the code", "priority": "high", "status": "completed"},
    {"content": "write the test", "priority": "medium", "status": "in_progress"},
    {"content": "ship it", "priority": "low", "status": "pending"},
]


def todo(entries: list[dict[str, str]], call_id: str) -> CallTool:
    return CallTool("todo", {"entries": entries}, call_id=call_id)


def plans(events: Any) -> list[list[PlanEntry]]:
    return [e.entries for e in events if isinstance(e, PlanSet)]


async def test_each_call_replaces_the_plan_whole_and_logs_it(tmp_path: Path) -> None:
    model = ScriptedModel([[todo(PLAN, "t1")], [todo(PLAN[:1], "t2")], [Say("planned")]], delay=0)
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=model, persistence=store) as rt:
        await rt.plug("tool-todo", todo_plugin)
        agent = await new_agent(rt)
        answer = await agent.run("plan it")
        assert answer.text == "planned"
        # The model was told of the tool in the system prompt of the requests offering it.
        assert all(TODO_NOTE in (r.system or "") for r in model.requests)
    first, second = plans(agent.session.events)
    assert [(e.content, e.priority, e.status) for e in first] == [
        (p["content"], p["priority"], p["status"]) for p in PLAN
    ]
    assert [e.content for e in second] == ["read the code"]  # replaced, not merged
    set_ = next(e for e in agent.session.events if isinstance(e, PlanSet))
    assert (set_.turn, set_.call_id) == (1, "t1")
    result = next(e for e in agent.session.events if isinstance(e, ToolResult))
    assert "[x] read the code" in result.content
    assert "[~] write the test" in result.content
    # Durable: the stored log holds both plans.
    _header, stored = await store.load("s")
    assert plans(stored) == [first, second]


async def test_a_plan_with_a_bad_entry_is_refused_naming_it_and_nothing_is_logged() -> None:
    bad_status = [{"content": "x", "priority": "high", "status": "done"}]
    empty = [{"content": "  ", "priority": "high", "status": "pending"}]
    no_priority = [{"content": "x", "status": "pending"}]
    model = ScriptedModel(
        [
            [todo(bad_status, "b1")],
            [todo(empty, "b2")],
            [todo(no_priority, "b3")],
            [todo([PLAN[0]] * 101, "b4")],
            [Say("gave up")],
        ],
        delay=0,
    )
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-todo", todo_plugin)
        agent = await new_agent(rt)
        await agent.run("plan it")
    results = {e.call_id: e for e in agent.session.events if isinstance(e, ToolResult)}
    assert all(r.is_error for r in results.values())
    assert "status" in results["b1"].content
    assert "done" in results["b1"].content
    assert "entries[0].content is empty" in results["b2"].content
    assert "priority" in results["b3"].content
    assert "at most 100" in results["b4"].content
    assert plans(agent.session.events) == []


async def test_without_the_plugin_the_model_is_told_nothing() -> None:
    model = ScriptedModel([[Say("hi")]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        await agent.run("hello")
    assert TODO_NOTE not in (model.requests[0].system or "")


async def test_a_sub_agents_plan_stays_in_its_own_session(tmp_path: Path) -> None:
    model = Routed(
        {
            "parent": [
                [todo(PLAN[:1], "p1")],
                [CallTool("task", {"prompt": "child: do it"})],
                [Say("done")],
            ],
            "child:": [[todo(PLAN[1:], "c1")], [Say("did it")]],
        }
    )
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=model, persistence=store) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        await rt.plug("tool-todo", todo_plugin)
        parent = await new_agent(rt, "p", "p")
        await parent.run("parent: go")
        children = [s for s in await store.list() if s.header.parent_session == "p"]
    assert [[e.content for e in plan] for plan in plans(parent.session.events)] == [
        ["read the code"]
    ]
    (child,) = children
    _header, child_events = await store.load(child.header.id)
    assert [[e.content for e in plan] for plan in plans(child_events)] == [
        ["write the test", "ship it"]
    ]


# -- over ACP, with the official SDK client ------------------------------------------------------


async def _acp(home: Path, work: Path, editor: Editor, body: Any) -> int:
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    async with acp.spawn_agent_process(
        editor, *command, env={"GREENROOM_HOME": str(home)}, cwd=work
    ) as (conn, process):
        await conn.initialize(protocol_version=1, client_capabilities=schema.ClientCapabilities())
        await body(conn)
    return await asyncio.wait_for(process.wait(), 10)


def test_acp_sends_each_plan_live_and_replays_them_on_load(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    live, loaded = Editor(), Editor()
    session = ""

    async def plan(conn: Any) -> None:
        nonlocal session
        session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        for entries in (PLAN, PLAN[2:]):
            prompt = [acp.text_block(f"todo: {json.dumps(entries)}")]
            answer = await conn.prompt(session_id=session, prompt=prompt)
            assert answer.stop_reason == "end_turn"

    async def load(conn: Any) -> None:
        await conn.load_session(cwd=str(work), session_id=session, mcp_servers=[])

    async def both() -> None:
        assert await _acp(home, work, live, plan) == 0
        assert await _acp(home, work, loaded, load) == 0

    asyncio.run(asyncio.wait_for(both(), LIMIT))
    expected = [
        [(p["content"], p["priority"], p["status"]) for p in PLAN],
        [("ship it", "low", "pending")],
    ]
    assert live.plans() == expected
    assert loaded.plans() == expected


async def test_the_note_follows_each_tool_list_a_request_offers() -> None:
    # The answer is kept per tool list: a session whose tools change (a new list) is told
    # of todo exactly when the new list offers it, and an older list keeps its own answer.
    from greenroom.protocol.model import ModelRequest, ToolSchema
    from greenroom.tools.todo import _Offered

    offered = _Offered()
    with_todo = [ToolSchema("bash", "", {}), ToolSchema("todo", "", {})]
    without = [ToolSchema("bash", "", {})]
    for tools, told in [(with_todo, True), (without, False), (with_todo, True), (without, False)]:
        request = ModelRequest(messages=[], system="be brief", tools=tools)
        shown = await offered.tell_the_model(request)
        assert (shown.system == f"be brief\n\n{TODO_NOTE}") is told
        assert (shown is request) is not told
