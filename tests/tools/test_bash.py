"""Background bash with owner tokens, on real processes.

Every test here waits on real subprocesses, so it runs on the real clock and
bounds itself with ``trio.fail_after``.
"""

from __future__ import annotations

import os
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from greenroom import Agent, AgentOptions, open_runtime
from greenroom.actors.types import ToolInvocation, ToolOutcome
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import (
    COMPLETED,
    DISPOSED,
    Aborted,
    ContextMessage,
    PluginSource,
    ToolResult,
)
from greenroom.protocol.model import ToolTurn
from greenroom.runtime import Runtime
from greenroom.tools.bash import BashExecRequest
from greenroom.tools.bash.tools import bash_plugin
from tests.agents_helpers import new_agent, turn_ends

pytestmark = pytest.mark.real_clock

LIMIT = 20  # seconds, per test


class _Header:
    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.cwd: str | None = None
        self.additional_directories: list[str] = []


class _Session:
    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.header = _Header(session_id)
        self.config: dict[str, str] = {}  # the default mode: the runtime's policy decides
        self.permissions: dict[str, bool] = {}
        self.parent = None  # a top-level session: its own settings govern
        self.events: list[object] = []
        self.decisions: dict[str, object] = {}  # none open: the runtime's AllowAll asks no one

    def append(self, event: object) -> None:
        self.events.append(event)


class FakeAgent:
    """Only what the bash tools read of a caller: its session token (and its settings)."""

    def __init__(self, session_id: str) -> None:
        self.session = _Session(session_id)
        self.options = AgentOptions()  # no policy of its own: the runtime's


@asynccontextmanager
async def bash_runtime(tmp_path: Path, **kwargs: Any) -> AsyncIterator[Runtime]:
    async with open_runtime(workdir=str(tmp_path), **kwargs) as rt:
        await rt.plug("tool-bash", bash_plugin)
        yield rt


async def call(rt: Runtime, agent: object, name: str, **arguments: object) -> ToolOutcome:
    import json

    invocation = ToolInvocation("c", name, json.dumps(arguments), cast(Agent | None, agent))
    return await rt.tools.execute(invocation)


async def started_task(rt: Runtime, agent: object, command: str) -> str:
    outcome = await call(
        rt, agent, "bash", command=command, description="background", run_in_background=True
    )
    assert not outcome.is_error, outcome.content
    assert outcome.content.startswith("started background task bash-")
    return outcome.content.rsplit(" ", 1)[1]


def live_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are not zombies.

    An orphaned zombie belongs to whatever init reaps orphans (on some
    container inits, never); it holds no resources but a pid, so it is not
    counted here.
    """
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


async def group_of(pidfile: Path) -> int:
    """The process group a command wrote to `pidfile` (``echo $$ > FILE``), once it has."""
    while not pidfile.exists() or not pidfile.read_text().strip():
        await trio.sleep(0.02)
    return int(pidfile.read_text())


async def assert_group_gone(pgid: int) -> None:
    """SIGKILL lands asynchronously: give the kernel a moment, then insist."""
    with trio.move_on_after(1):
        while live_members(pgid):
            await trio.sleep(0.01)
    assert live_members(pgid) == []


# -- ownership --------------------------------------------------------------------------


async def test_another_sessions_token_is_rejected_and_the_same_token_accepted(
    tmp_path: Path,
) -> None:
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            task = await started_task(rt, FakeAgent("sess-a"), "echo hello; sleep 30")
            assert rt.bash.owner_of(task) == "sess-a"
            for tool in ("bash_output", "bash_kill"):
                refused = await call(rt, FakeAgent("sess-b"), tool, task_id=task)
                assert refused.is_error
                assert refused.content == f"task {task} belongs to another session"
            # No agent at all: locked out of an owned task.
            assert (await call(rt, None, "bash_output", task_id=task)).content == (
                f"task {task} belongs to another session"
            )
            # A different object carrying the same token: ownership is by token.
            same = FakeAgent("sess-a")
            read = await call(rt, same, "bash_output", task_id=task)
            assert not read.is_error
            assert read.content.endswith("[status: running]")
            killed = await call(rt, same, "bash_kill", task_id=task)
            assert killed.content == f"killed background task {task}"


async def test_an_unowned_task_is_open_and_the_owner_reads_after_completion(
    tmp_path: Path,
) -> None:
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            unowned = await started_task(rt, None, "echo open")
            owned = await started_task(rt, FakeAgent("sess-a"), "echo mine; echo oops >&2")
            await rt.bash.wait(unowned)
            await rt.bash.wait(owned)
            anyone = await call(rt, FakeAgent("sess-z"), "bash_output", task_id=unowned)
            assert anyone.content == "open\n[status: completed, exit code: 0]"
            mine = await call(rt, FakeAgent("sess-a"), "bash_output", task_id=owned)
            assert mine.content == "mine\n[stderr]\noops\n[status: completed, exit code: 0]"
            again = await call(rt, FakeAgent("sess-a"), "bash_output", task_id=owned)
            assert again.content == "(no new output)\n[status: completed, exit code: 0]"
            late = await call(rt, FakeAgent("sess-a"), "bash_kill", task_id=owned)
            assert late.content == f"task {owned} had already finished"


async def test_ownership_survives_a_reload_of_the_tool_plugin(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            task = await started_task(rt, FakeAgent("sess-a"), "sleep 30")
            await rt.reload("tool-bash")
            assert rt.bash.get(task) is not None
            assert rt.bash.get(task).status == "running"  # type: ignore[union-attr]
            assert rt.bash.owner_of(task) == "sess-a"
            refused = await call(rt, FakeAgent("sess-b"), "bash_kill", task_id=task)
            assert refused.content == f"task {task} belongs to another session"
            assert sorted(s.name for s in rt.tools.schemas()) == [
                "bash",
                "bash_kill",
                "bash_output",
            ]
            assert (await call(rt, FakeAgent("sess-a"), "bash_kill", task_id=task)).content == (
                f"killed background task {task}"
            )


# -- completion notices ---------------------------------------------------------------------


async def test_a_completion_notice_reaches_the_owner_found_through_the_registry(
    tmp_path: Path,
) -> None:
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path, model=ScriptedModel(delay=0)) as rt:
            owner = await new_agent(rt, agent_id="a", session_id="sess-a")
            gone = await rt.agents.create(agent_id="b", session_id="sess-b")
            mine = await started_task(rt, owner, "sleep 0.2; echo finished")
            orphan = await started_task(rt, gone.agent, "sleep 0.2")
            await gone.dispose()
            assert rt.bash.get(orphan) is None  # ended with its session, no notice
            await rt.bash.wait(mine)
            notices = [e for e in owner.session.events if isinstance(e, ContextMessage)]
            assert [n.content for n in notices] == [
                f"background bash task {mine} finished [status: completed, exit code: 0]."
                " Read its output with bash_output."
            ]
            assert notices[0].source == PluginSource("tool-bash")
            assert not any(isinstance(e, ContextMessage) for e in gone.agent.session.events)


# -- foreground ------------------------------------------------------------------------------


async def test_foreground_timeout_and_non_zero_exit_are_results(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            slow = await call(
                rt, None, "bash", command="echo start; sleep 10", description="d", timeout_ms=300
            )
            assert not slow.is_error
            assert slow.content == "start\n[timed out after 300 ms]\n[killed by signal: SIGTERM]"
            failed = await call(rt, None, "bash", command="echo no >&2; exit 3", description="d")
            assert not failed.is_error
            assert failed.content == "[stderr]\nno\n[exit code: 3]"
            where = await call(rt, None, "bash", command="pwd", description="d")
            assert where.content == f"{tmp_path}\n[exit code: 0]"


async def test_the_environment_is_scrubbed_of_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-nope")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-nope")
    monkeypatch.setenv("HARMLESS", "yes")
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            env = await call(rt, None, "bash", command="env", description="d")
    assert "sk-nope" not in env.content
    assert "ghp-nope" not in env.content
    assert "HARMLESS=yes" in env.content
    assert "NO_COLOR=1" in env.content
    assert "TERM=dumb" in env.content


async def test_cancel_mid_command_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pgid"
    command = f"echo $$ > {pidfile}; sleep 30 & sleep 30; wait"
    model = ScriptedModel([[CallTool("bash", {"command": command, "description": "wait"})]])
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path, model=model) as rt:
            agent = await new_agent(rt)
            agent.send("run it")
            pgid = await group_of(pidfile)
            agent.cancel("stop that")
            await agent.when_idle()
            await assert_group_gone(pgid)
            assert turn_ends(agent.session.events) == [(1, Aborted("stop that"))]
            results = [e for e in agent.session.events if isinstance(e, ToolResult)]
            assert [(r.content, r.is_error) for r in results] == [("aborted: stop that", True)]


async def test_a_flood_keeps_memory_bounded_and_the_spill_file_complete(tmp_path: Path) -> None:
    size = 50_000_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with trio.fail_after(40):
        async with bash_runtime(tmp_path) as rt:
            spec = rt.bash.resolve(
                BashExecRequest(command=f"head -c {size} /dev/zero | tr '\\0' 'a'; echo end >&2")
            )
            result = await rt.bash.run(spec)
            assert result.exit_code == 0
            assert result.stdout.truncated
            assert len(result.stdout.text) == 64_000
            assert result.stdout.spill_path is not None
            assert os.path.getsize(result.stdout.spill_path) == size
            assert oct(os.stat(result.stdout.spill_path).st_mode & 0o777) == "0o600"
            assert (
                oct(os.stat(os.path.dirname(result.stdout.spill_path)).st_mode & 0o777) == "0o700"
            )
            assert result.stderr.text == "end\n"
            assert not result.stderr.truncated
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 30_000


async def test_two_hundred_concurrent_tasks_lose_no_output(tmp_path: Path) -> None:
    with trio.fail_after(40):
        async with bash_runtime(tmp_path) as rt:
            ids = [
                (
                    await rt.bash.start(
                        rt.bash.resolve(BashExecRequest(command=f"seq {i} {i + 99}"))
                    )
                ).id
                for i in range(200)
            ]
            for task_id in ids:
                await rt.bash.wait(task_id)
            for i, task_id in enumerate(ids):
                output = rt.bash.read_output(task_id)
                assert output.delta == "".join(f"{n}\n" for n in range(i, i + 100))
                assert output.task.status == "completed"
                assert output.task.exit_code == 0


async def test_what_a_command_leaves_in_its_group_dies_when_it_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "pgid"
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            # The shell exits at once; the sleep it started stays in its group.
            task = await started_task(rt, None, f"echo $$ > {pidfile}; sleep 60 &")
            pgid = await group_of(pidfile)
            assert (await rt.bash.wait(task)).exit_code == 0
            await assert_group_gone(pgid)  # gone before the runtime closes


async def test_closing_the_runtime_kills_and_reaps_every_task(tmp_path: Path) -> None:
    pidfile = tmp_path / "pgid"
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            await started_task(rt, None, f"echo $$ > {pidfile}; sleep 60 & sleep 60")
            pgid = await group_of(pidfile)
    await assert_group_gone(pgid)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"command": "  ", "description": "d"}, "bash: command must be a non-empty string"),
        ({"command": "ls", "description": ""}, "bash: description must be a non-empty string"),
        (
            {"command": "ls", "description": "d", "timeout_ms": 0},
            "bash: timeout_ms must be positive",
        ),
        (
            {"command": "ls", "description": "d", "workdir": "nowhere"},
            "is not an existing directory",
        ),
        ({"description": "d"}, "Object missing required field `command`"),
    ],
)
async def test_bad_bash_arguments_are_error_results_naming_the_field(
    tmp_path: Path, arguments: dict[str, object], message: str
) -> None:
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            outcome = await call(rt, None, "bash", **arguments)
    assert outcome.is_error
    assert message in outcome.content


async def test_an_unknown_task_id_is_an_error_result_and_the_turn_goes_on(tmp_path: Path) -> None:
    model = ScriptedModel(
        [[CallTool("bash_output", {"task_id": "bash-99"})], [Say("I see, no such task.")]]
    )
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path, model=model) as rt:
            agent = await new_agent(rt)
            agent.send("check it")
            await agent.when_idle()
            results = [e for e in agent.session.events if isinstance(e, ToolResult)]
            assert [(r.content, r.is_error) for r in results] == [
                ("unknown background task 'bash-99'", True)
            ]
            assert turn_ends(agent.session.events) == [(1, COMPLETED)]
            assert model.requests[1].messages[-1] == ToolTurn(
                "call-1", "unknown background task 'bash-99'", is_error=True
            )


async def test_disposing_mid_command_ends_the_turn_disposed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pgid"
    command = f"echo $$ > {pidfile}; sleep 30"
    model = ScriptedModel([[CallTool("bash", {"command": command, "description": "wait"})]])
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path, model=model) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s")
            handle.agent.send("run it")
            pgid = await group_of(pidfile)
            await handle.dispose()
            await assert_group_gone(pgid)
            events = handle.agent.session.events
            assert turn_ends(events) == [(1, DISPOSED)]
            results = [e for e in events if isinstance(e, ToolResult)]
            assert [(r.content, r.is_error) for r in results] == [("aborted: disposed", True)]


async def test_dispose_ends_the_sessions_tasks_and_a_later_life_cannot_reach_them(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pgid"
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s1")
            other = await new_agent(rt, "b", "s2")
            mine = await started_task(rt, handle.agent, f"echo $$ > {pidfile}; sleep 60")
            theirs = await started_task(rt, other, "sleep 60")
            pgid = await group_of(pidfile)
            await handle.dispose()
            assert rt.bash.get(mine) is None  # reaped and forgotten within the dispose
            await assert_group_gone(pgid)
            assert rt.bash.get(theirs).status == "running"  # type: ignore[union-attr]
            again = await new_agent(rt, "a2", "s1")
            for tool in ("bash_output", "bash_kill"):
                refused = await call(rt, again, tool, task_id=mine)
                assert refused.is_error
                assert refused.content == f"unknown background task {mine!r}"


async def test_a_childs_tasks_are_fenced_from_its_parent_and_die_with_the_parent(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pgid"
    with trio.fail_after(LIMIT):
        async with bash_runtime(tmp_path) as rt:
            parent = await rt.agents.create(agent_id="p", session_id="p")
            child = await parent.spawn(agent_id="c", session_id="c")
            childs = await started_task(rt, child.agent, f"echo $$ > {pidfile}; sleep 60")
            parents = await started_task(rt, parent.agent, "sleep 60")
            for tool in ("bash_output", "bash_kill"):
                # Neither reaches the other's task: tokens are per session.
                refused = await call(rt, parent.agent, tool, task_id=childs)
                assert refused.is_error
                assert refused.content == f"task {childs} belongs to another session"
                refused = await call(rt, child.agent, tool, task_id=parents)
                assert refused.is_error
                assert refused.content == f"task {parents} belongs to another session"
            pgid = await group_of(pidfile)
            assert rt.bash.get(childs).status == "running"  # type: ignore[union-attr]
            await parent.dispose()
            assert rt.bash.get(childs) is None
            assert rt.bash.get(parents) is None
            await assert_group_gone(pgid)
