"""The ``bash``, ``bash_output`` and ``bash_kill`` tools, and the plugin that provides them.

The access policy lives here, in the consumer of the executor seam: a
caller's token is its session id (``session.header.id``), or None when no
agent calls; a task with an owner is readable and killable only by a caller
with that same token; a task without one is open to anyone. Because the
token is stored on the executor's task, a reload of this plugin changes
nothing about who may reach which task.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import msgspec

from greenroom.actors.types import AgentDisposed, ToolInvocation, ToolOutcome
from greenroom.protocol.events import PluginSource, ToolError
from greenroom.tools.bash.seam import (
    BashExecRequest,
    BashExecutor,
    BashOutput,
    BashRunResult,
    BashTask,
    UnknownTask,
)
from greenroom.tools.plugins import PluginContext
from greenroom.tools.registry import Tool

PLUGIN = "tool-bash"


class BashArgs(msgspec.Struct, kw_only=True):
    command: str
    description: str
    timeout_ms: int | None = None
    workdir: str | None = None
    run_in_background: bool = False


class TaskArgs(msgspec.Struct, kw_only=True):
    task_id: str


def caller_token(invocation: ToolInvocation) -> str | None:
    agent = invocation.agent
    return agent.session.header.id if agent is not None else None


def _refuse(message: str, code: str) -> ToolOutcome:
    return ToolOutcome(message, is_error=True, error=ToolError(name="BashError", code=code))


def render_result(result: BashRunResult) -> str:
    parts = []
    if result.stdout.text:
        parts.append(result.stdout.text.rstrip("\n"))
    if result.stderr.text:
        parts.append("[stderr]\n" + result.stderr.text.rstrip("\n"))
    if not parts:
        parts.append("(no output)")
    for stream in (result.stdout, result.stderr):
        if stream.truncated:
            parts.append(f"[output truncated; full output: {stream.spill_path or '(unavailable)'}]")
    if result.timed_out:
        parts.append(f"[timed out after {result.timeout_ms} ms]")
    if result.signal is not None:
        parts.append(f"[killed by signal: {result.signal}]")
    else:
        parts.append(f"[exit code: {result.exit_code}]")
    return "\n".join(parts)


def render_status(task: BashTask) -> str:
    if task.status == "running":
        return "[status: running]"
    if task.status == "killed":
        return f"[status: killed by {task.signal}]" if task.signal else "[status: killed]"
    if task.signal is not None:
        return f"[status: completed, killed by signal: {task.signal}]"
    return f"[status: completed, exit code: {task.exit_code}]"


def render_output(output: BashOutput) -> str:
    parts = [output.delta.rstrip("\n") if output.delta else "(no new output)"]
    if output.lossy:
        spill = output.stdout_spill_path or output.stderr_spill_path or "(unavailable)"
        parts.append(f"[some output was dropped from memory; full output: {spill}]")
    parts.append(render_status(output.task))
    return "\n".join(parts)


def bash_tools(executor: BashExecutor) -> list[Tool[Any]]:
    """The three tools over `executor`."""

    async def bash(args: BashArgs, call: ToolInvocation) -> str | ToolOutcome:
        for field in ("command", "description"):
            if not getattr(args, field).strip():
                return _refuse(f"bash: {field} must be a non-empty string", "invalid-arguments")
        if args.timeout_ms is not None and args.timeout_ms <= 0:
            return _refuse(
                f"bash: timeout_ms must be positive, got {args.timeout_ms}", "invalid-arguments"
            )
        session_cwd = call.agent.session.header.cwd if call.agent is not None else None
        workdir = args.workdir
        if workdir is not None and not os.path.isabs(workdir) and session_cwd is not None:
            workdir = os.path.join(session_cwd, workdir)
        request = BashExecRequest(
            command=args.command,
            workdir=workdir or session_cwd,
            timeout_ms=args.timeout_ms,
            owner=caller_token(call) if args.run_in_background else None,
        )
        try:
            spec = executor.resolve(request)
        except ValueError as exc:
            return _refuse(f"bash: {exc}", "invalid-arguments")
        if args.run_in_background:
            task = await executor.start(spec)
            return f"started background task {task.id}"
        return render_result(await executor.run(spec))

    def _reachable(task_id: str, call: ToolInvocation) -> ToolOutcome | None:
        """An error outcome when the caller may not reach `task_id`, else None."""
        if executor.get(task_id) is None:
            return _refuse(f"unknown background task {task_id!r}", "unknown-task")
        owner = executor.owner_of(task_id)
        if owner is not None and owner != caller_token(call):
            return _refuse(f"task {task_id} belongs to another session", "not-owner")
        return None

    async def bash_output(args: TaskArgs, call: ToolInvocation) -> str | ToolOutcome:
        refusal = _reachable(args.task_id, call)
        if refusal is not None:
            return refusal
        try:
            return render_output(executor.read_output(args.task_id))
        except UnknownTask as exc:
            return _refuse(str(exc), "unknown-task")

    async def bash_kill(args: TaskArgs, call: ToolInvocation) -> str | ToolOutcome:
        refusal = _reachable(args.task_id, call)
        if refusal is not None:
            return refusal
        if executor.kill(args.task_id):
            return f"killed background task {args.task_id}"
        return f"task {args.task_id} had already finished"

    return [
        Tool(
            "bash",
            "Run a shell command (bash -c) in the session's working directory. "
            "Set run_in_background to start it as a task and read it with bash_output.",
            BashArgs,
            bash,
        ),
        Tool(
            "bash_output",
            "Read the new output of a background bash task, and its status.",
            TaskArgs,
            bash_output,
        ),
        Tool("bash_kill", "Stop a background bash task.", TaskArgs, bash_kill),
    ]


def completion_notice(task: BashTask) -> str:
    return (
        f"background bash task {task.id} finished {render_status(task)}."
        " Read its output with bash_output."
    )


def bash_plugin(ctx: PluginContext) -> None:
    """The ``tool-bash`` plugin: the three tools, and completion notices to each task's owner.

    A notice goes to the live agent whose session id is the task's owner
    token, found through the registry when the task ends; with no owner or no
    such agent it is dropped. An agent disposed in between is the only error
    swallowed. A task that ends while the plugin is stopped (mid-reload) gets
    no notice.
    """
    for tool in bash_tools(ctx.bash):
        ctx.register_tool(tool)

    def notify(task: BashTask) -> None:
        owner = ctx.bash.owner_of(task.id)
        if owner is None:
            return
        for agent in ctx.agents.list():
            if agent.session.header.id == owner:
                with contextlib.suppress(AgentDisposed):
                    agent.inject(completion_notice(task), source=PluginSource(PLUGIN))
                return

    ctx.bash.on_task_done(notify, scope=ctx.scope)
