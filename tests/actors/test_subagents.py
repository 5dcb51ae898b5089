"""Sub-agents: children whose lives nest in their parent's, pinned under the autojump clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from greenroom import Runtime, open_runtime
from greenroom.actors.life import AgentHandle
from greenroom.actors.types import Agent, PermissionRequest, SpawnLimits, SpawnRefused
from greenroom.models import CallTool, Fail, Hang, Say, ScriptedModel, Wait
from greenroom.models.scripted import Action
from greenroom.protocol.events import (
    COMPLETED,
    DISPOSED,
    Aborted,
    PermissionDecision,
    SessionEvent,
    ToolResult,
    TurnEnd,
    UserMessage,
)
from greenroom.protocol.model import ModelRequest, StreamChunk, UserTurn
from greenroom.session import SESSION_EVENT, Session
from greenroom.session.persistence import JsonlPersistence
from greenroom.supervisor import Supervisor
from greenroom.tools import Tool
from greenroom.tools.subagents import task_plugin
from tests.persistence_helpers import Delegating, DelegatingLog


class Routed:
    """One scripted model per agent, chosen by how the session's first prompt begins."""

    def __init__(self, scripts: dict[str, list[Sequence[Action]]]) -> None:
        self.models = {key: ScriptedModel(value, delay=0) for key, value in scripts.items()}

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        first = next(m.content for m in request.messages if isinstance(m, UserTurn))
        key = next(key for key in self.models if first.startswith(key))
        return self.models[key].stream(request)


def task(prompt: str, **more: str) -> CallTool:
    return CallTool("task", {"prompt": prompt, **more})


class Blocked(msgspec.Struct):
    pass


async def _block(_args: Blocked, _invocation: object) -> str:
    await trio.sleep_forever()
    return "unreachable"


BLOCK = Tool("block", "Block until cancelled.", Blocked, _block)  # type: ignore[arg-type]


def record(rt: Runtime) -> list[tuple[str, SessionEvent]]:
    seen: list[tuple[str, SessionEvent]] = []
    rt.hooks.on(SESSION_EVENT, lambda session, event: seen.append((session.id, event)))
    return seen


def children_of(rt: Runtime, parent: Agent) -> list[Agent]:
    return [a for a in rt.agents.list() if a.session.header.parent_session == parent.session.id]


def ends(session: Session) -> list[TurnEnd]:
    return [e for e in session.events if isinstance(e, TurnEnd)]


def results(session: Session) -> list[ToolResult]:
    return [e for e in session.events if isinstance(e, ToolResult)]


async def started(rt: Runtime, parent: Agent, count: int = 1) -> list[Agent]:
    while len(found := children_of(rt, parent)) < count or any(
        c.status != "running" for c in found
    ):
        await trio.sleep(0.01)
    return found


async def test_a_task_call_returns_the_childs_answer_from_a_session_naming_its_parent(
    tmp_path: Path,
) -> None:
    model = Routed(
        {
            "parent": [[task("child: add 2 and 2", description="adding")], [Say("it is 4")]],
            "child:": [[Say("4")]],
        }
    )
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=model, persistence=store) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        seen = record(rt)
        parent = await rt.agents.create(agent_id="p", session_id="p", cwd=str(tmp_path))
        parent.agent.send("parent: what is 2 + 2?")
        await parent.agent.when_idle()
        (result,) = results(parent.agent.session)
        assert (result.content, result.is_error) == ("4", False)
        assert ends(parent.agent.session)[-1].reason == COMPLETED
        (child_id,) = {sid for sid, _ in seen} - {"p"}
        # The child is gone with its call; its session stays, naming its parent.
        assert rt.agents.list() == [parent.agent]
        header, events = await store.load(child_id)
        assert header.parent_session == "p"
        assert header.cwd == str(tmp_path)
        assert [e.reason for e in events if isinstance(e, TurnEnd)] == [COMPLETED]
        # Resumable like any session.
        again = await rt.agents.resume(agent_id="again", session_id=child_id)
        assert again.agent.session.last_turn == 1
        await again.dispose()


class Edit(msgspec.Struct):
    path: str


async def _edit(args: Edit, _invocation: object) -> str:
    return f"edited {args.path}"


EDIT = Tool("edit", "Edit a file.", Edit, _edit, kind="edit")  # type: ignore[arg-type]


class Asked:
    """A permissions policy that answers from a list and remembers what it was asked."""

    def __init__(self, *answers: PermissionDecision) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str]] = []

    async def decide(self, request: PermissionRequest) -> PermissionDecision:
        await trio.lowlevel.checkpoint()
        self.asked.append((request.session_id, request.tool))
        return self.answers.pop(0)


async def test_a_child_runs_under_its_familys_mode_and_remembered_answers() -> None:
    model = Routed(
        {
            "parent": [[CallTool("edit", {"path": "a"})], [task("child: edit b")], [Say("ok")]],
            "other": [[task("kid: edit c")], [Say("ok")]],
            "child:": [[CallTool("edit", {"path": "b"})], [Say("done")]],
            "kid:": [[CallTool("edit", {"path": "c"})], [Say("done")]],
        }
    )
    policy = Asked("allow_always")
    async with open_runtime(model=model, permissions=policy, tools=[EDIT]) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        seen = record(rt)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        parent.agent.send("parent: edit a, then have a child edit b")
        await parent.agent.when_idle()
        # The parent's "always" covers its child's call: asked once, on the parent's own.
        assert policy.asked == [("p", "edit")]
        assert [r.content for r in results(parent.agent.session)] == ["edited a", "done"]
        assert _child_results(seen, "p", "q") == [("edited b", None)]
        other = await rt.agents.create(agent_id="q", session_id="q")
        other.agent.configure("mode", "read-only")
        other.agent.send("other: have a child edit c")
        await other.agent.when_idle()
        # The child of a read-only session is read-only too: refused, nobody asked.
        assert policy.asked == [("p", "edit")]
        assert _child_results(seen, "p", "q")[1][1] == "read-only"


def _child_results(
    seen: list[tuple[str, SessionEvent]], *parents: str
) -> list[tuple[str, str | None]]:
    return [
        (e.content, e.error.code if e.error else None)
        for sid, e in seen
        if sid not in parents and isinstance(e, ToolResult)
    ]


async def test_several_task_calls_of_one_step_run_at_once() -> None:
    model = Routed(
        {
            "parent": [[task("one: wait"), task("two: wait"), task("three: wait")], [Say("done")]],
            "one:": [[Wait(10), Say("1")]],
            "two:": [[Wait(10), Say("2")]],
            "three:": [[Wait(10), Say("3")]],
        }
    )
    async with open_runtime(model=model) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        before = trio.current_time()
        parent.agent.send("parent: fan out")
        await parent.agent.when_idle()
        assert trio.current_time() - before < 15  # not 30: the three waits overlapped
        # Each result is logged as its call ends.
        assert sorted(r.content for r in results(parent.agent.session)) == ["1", "2", "3"]


@pytest.mark.parametrize("window", ["child-queued", "child-mid-model", "child-mid-tool"])
async def test_the_parents_cancel_stops_every_childs_work(window: str) -> None:
    scripts: dict[str, list[Sequence[Action]]] = {
        "parent": [[task("child: work")], [Say("never")]],
        "child:": [[Hang()]] if window == "child-mid-model" else [[CallTool("block")]],
    }
    model = Routed(scripts)
    async with open_runtime(model=model, tools=[BLOCK]) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        seen = record(rt)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        parent.agent.send("parent: go")
        (child,) = await started(rt, parent.agent)
        if window == "child-queued":
            child.send("child: queued behind the block")
        await trio.sleep(1)
        parent.agent.cancel("stop")
        cut = len(seen)
        await parent.agent.when_idle()
        after = [e for sid, e in seen[cut:] if sid == child.session.id]
        # After the cancel the child only closes: its turn ends aborted, nothing new runs.
        assert [type(e).__name__ for e in after][-1] == "TurnEnd"
        assert not any(isinstance(e, UserMessage) for e in after)
        assert ends(child.session)[-1].reason == Aborted("stop")
        assert ends(parent.agent.session)[-1].reason == Aborted("stop")
        (result,) = results(parent.agent.session)
        assert result.error is not None
        assert result.error.code == "aborted"
        # The child's turn/end came before its parent's.
        order = [sid for sid, e in seen if isinstance(e, TurnEnd)]
        assert order == [child.session.id, "p"]
        assert "queued behind" not in str(child.session.events)


async def test_a_childs_own_cancel_is_an_error_result_and_the_parent_goes_on() -> None:
    model = Routed({"parent": [[task("child: hang")], [Say("carried on")]], "child:": [[Hang()]]})
    async with open_runtime(model=model) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        parent.agent.send("parent: go")
        (child,) = await started(rt, parent.agent)
        child.cancel("child only")
        await parent.agent.when_idle()
        (result,) = results(parent.agent.session)
        assert result.is_error
        assert "cancelled: child only" in result.content
        assert ends(parent.agent.session)[-1].reason == COMPLETED


async def test_a_failing_child_is_an_error_result_and_the_parent_goes_on() -> None:
    model = Routed({"parent": [[task("child: fail")], [Say("noted")]], "child:": [[Fail("boom")]]})
    async with open_runtime(model=model) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        parent.agent.send("parent: go")
        await parent.agent.when_idle()
        (result,) = results(parent.agent.session)
        assert result.is_error
        assert "the sub-agent failed: boom" in result.content
        assert ends(parent.agent.session)[-1].reason == COMPLETED


async def test_past_the_breadth_limit_a_task_call_is_a_tool_error() -> None:
    model = Routed(
        {
            "parent": [[task("x: wait"), task("x: wait"), task("x: wait")], [Say("done")]],
            "x:": [[Wait(5), Say("x")] for _ in range(3)],
        }
    )
    limits = SpawnLimits(max_children=2)
    async with open_runtime(model=model, spawn_limits=limits) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        parent.agent.send("parent: go")
        await parent.agent.when_idle()
        refused = [r for r in results(parent.agent.session) if r.is_error]
        answered = [r.content for r in results(parent.agent.session) if not r.is_error]
        assert answered == ["x", "x"]
        (c,) = refused
        assert c.error is not None
        assert c.error.code == "spawn-refused"
        assert "2 live children" in c.content
        assert ends(parent.agent.session)[-1].reason == COMPLETED


async def test_past_the_depth_limit_a_task_call_is_a_tool_error() -> None:
    model = Routed(
        {
            "parent": [[task("a: nest")], [Say("done")]],
            "a:": [[task("deeper: no")], [Say("a done")]],
        }
    )
    async with open_runtime(model=model, spawn_limits=SpawnLimits(max_depth=1)) as rt:  # type: ignore[arg-type]
        await rt.plug("tool-task", task_plugin)
        parent = await rt.agents.create(agent_id="p", session_id="p")
        parent.agent.send("parent: go")
        await parent.agent.when_idle()
        (a,) = results(parent.agent.session)
        assert a.content == "a done"
        # a's own task call was refused for depth, as a result a's model read.
        refusal = str(model.models["a:"].requests[-1].messages[-1])
        assert "children may nest at most 1 deep" in refusal


async def test_spawn_past_a_limit_raises_and_a_disposing_parent_spawns_nothing() -> None:
    async with open_runtime(spawn_limits=SpawnLimits(max_children=1)) as rt:
        parent = await rt.agents.create(agent_id="p", session_id="p")
        child = await parent.spawn(agent_id="c", session_id="c")
        assert child.agent.session.header.parent_session == "p"
        with pytest.raises(SpawnRefused, match="1 live children"):
            await parent.spawn(agent_id="d", session_id="d")
        await child.dispose()
        grandchild_free = await parent.spawn(agent_id="e", session_id="e")
        await parent.dispose()
        assert grandchild_free.agent.status == "disposed"
        with pytest.raises(SpawnRefused, match="being disposed"):
            await parent.spawn(agent_id="f", session_id="f")


async def _busy_family(rt: Runtime, owner: Supervisor | None = None) -> tuple[AgentHandle, Agent]:
    parent = await rt.agents.create(agent_id="p", session_id="p", owner=owner)
    child = await parent.spawn(agent_id="c", session_id="c")
    grandchild = await child.spawn(agent_id="g", session_id="g")
    for handle, word in ((parent, "parent"), (child, "child:"), (grandchild, "grand")):
        handle.agent.send(f"{word} hang")
    await trio.sleep(1)
    return parent, grandchild.agent


@pytest.mark.parametrize("how", ["handle", "owner"])
async def test_disposing_a_parent_disposes_its_children_first(tmp_path: Path, how: str) -> None:
    model = Routed({"parent": [[Hang()]], "child:": [[Hang()]], "grand": [[Hang()]]})
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=model, persistence=store) as rt:  # type: ignore[arg-type]
        seen = record(rt)
        if how == "handle":
            parent, _ = await _busy_family(rt)
            await parent.dispose()
        else:
            async with Supervisor(name="team") as team:
                await _busy_family(rt, owner=team)
        order = [sid for sid, e in seen if isinstance(e, TurnEnd)]
        assert order == ["g", "c", "p"]
        assert rt.agents.list() == []
        for sid in ("g", "c", "p"):
            _, events = await store.load(sid)
            assert [e.reason for e in events if isinstance(e, TurnEnd)] == [DISPOSED]


async def test_fork_copies_a_prefix_and_leaves_the_original_alone(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        original = await rt.agents.create(agent_id="o", session_id="o", cwd=str(tmp_path))
        for word in ("one", "two", "three"):
            original.agent.send(word)
            await original.agent.when_idle()
        before = (tmp_path / "o.jsonl").read_bytes()
        header = await rt.agents.fork("o", "f", at_turn=2)
        assert (header.forked_from, header.cwd) == ("o", str(tmp_path))
        fork = await rt.agents.resume(agent_id="f", session_id="f")
        prefix = [e for e in original.agent.session.events if e.seq < _first_of_turn(original, 3)]
        assert _plain(fork.agent.session.events) == _plain(prefix)
        fork.agent.send("four")
        await fork.agent.when_idle()
        assert (tmp_path / "o.jsonl").read_bytes() == before
        assert original.agent.session.last_turn == 3
        assert fork.agent.session.last_turn == 3
        with pytest.raises(ValueError, match="cannot fork it at turn 9"):
            await rt.agents.fork("o", "g", at_turn=9)
        whole = await rt.agents.fork("o", "w")
        _, events = await store.load("w")
        assert _plain(events) == _plain(original.agent.session.events)
        assert whole.forked_from == "o"


@pytest.mark.parametrize("how", ["flush fails", "cancelled"])
async def test_a_fork_that_fails_part_way_leaves_no_partial_copy(tmp_path: Path, how: str) -> None:
    store = JsonlPersistence(tmp_path)
    copying = trio.Event()

    class Bent(DelegatingLog):
        async def flush(self) -> None:
            copying.set()
            if how == "flush fails":
                raise OSError(28, "No space left on device")
            await trio.sleep_forever()

    persistence = Delegating(store)
    async with open_runtime(model=ScriptedModel(delay=0), persistence=persistence) as rt:
        original = await rt.agents.create(agent_id="o", session_id="o")
        original.agent.send("one")
        await original.agent.when_idle()
        persistence.log_type = Bent
        if how == "flush fails":
            with pytest.raises(OSError, match="No space left"):
                await rt.agents.fork("o", "f")
        else:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rt.agents.fork, "o", "f")
                await copying.wait()
                nursery.cancel_scope.cancel()
        persistence.log_type = DelegatingLog
        assert [s.header.id for s in await store.list()] == ["o"]
        again = await rt.agents.fork("o", "f")  # the id is free again
        assert again.forked_from == "o"


def _first_of_turn(handle: AgentHandle, turn: int) -> int:
    from greenroom.protocol.events import TurnStart

    return next(
        e.seq for e in handle.agent.session.events if isinstance(e, TurnStart) and e.turn == turn
    )


def _plain(events: Sequence[SessionEvent]) -> list[Any]:
    return [msgspec.to_builtins(e) for e in events]
