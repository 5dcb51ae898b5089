"""The ``bash``, ``bash_output`` and ``bash_kill`` tools, the plugin that provides them,
and the owner-token policy: the one place that says who may reach which task.

The policy lives here, in the consumer of the executor seam: a caller's
token is its session id (``session.header.id``), or None when no agent
calls; a task with an owner is readable and killable only by a caller with
that same token; a task without one is open to anyone. Because the token is
stored on the executor's task, a reload of this plugin changes nothing about
who may reach which task. `owned_tasks`, `kill_owned` and `release_owner`
say what one token holds, for whoever ends a session (its agent's life, the
ACP bridge).

`bash_plugin` offers the tools. The ``bash`` tool runs a command in its session's mode's
sandbox (``unsandboxed`` on request, asked for), tells the session its protections once
per life (``sandbox/protections``), and adds a note after a refusal the sandbox made.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Final

import msgspec
import trio

from greenroom.actors.types import (
    MODE_ACCESS,
    Agent,
    AgentDisposed,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.protocol.events import PluginSource, Protections, SandboxProtections
from greenroom.sandbox import ACCESSES, Access, Sandbox, confines, describe
from greenroom.tools.bash.seam import (
    BashExecRequest,
    BashExecutor,
    BashOutput,
    BashRunResult,
    BashTask,
    UnknownTask,
)
from greenroom.tools.plugins import PluginContext
from greenroom.tools.registry import Tool, session_mode

PLUGIN = "tool-bash"

#: The live agent on a session id, if any (the registry's `by_session`).
LiveAgents = Callable[[str], Agent | None]


class BashArgs(msgspec.Struct, kw_only=True):
    command: str
    description: str
    timeout_ms: int | None = None
    workdir: str | None = None
    run_in_background: bool = False
    unsandboxed: bool = False


class BashTaskArgs(msgspec.Struct, kw_only=True):
    task_id: str


def caller_token(invocation: ToolInvocation) -> str | None:
    agent = invocation.agent
    return agent.session.header.id if agent is not None else None


def owned_tasks(executor: BashExecutor, token: str) -> list[BashTask]:
    """Every task `token` owns, running or finished, oldest first."""
    return [task for task in executor.list() if executor.owner_of(task.id) == token]


def kill_owned(executor: BashExecutor, token: str) -> None:
    """Start killing every running task `token` owns, at once (never checkpoints)."""
    for task in owned_tasks(executor, token):
        if task.status == "running":
            executor.kill(task.id)


async def release_owner(executor: BashExecutor, token: str) -> None:
    """End what `token` holds: kill its running tasks, wait until each is reaped, forget all;
    then the session's sandbox goes once its last process has (`BashExecutor.end_session`).

    After it returns no task of `token` is left, so a later life of the same
    session id cannot read or kill an earlier life's tasks. It runs shielded:
    a cancelled caller still sees every group reaped.
    """
    tasks = owned_tasks(executor, token)
    with trio.CancelScope(shield=True):  # bounded: a kill escalates to SIGKILL in KILL_GRACE
        if tasks:
            kill_owned(executor, token)
            for task in tasks:
                await executor.wait(task.id)
                executor.forget(task.id)
        await executor.end_session(token)


def render_result(result: BashRunResult) -> str:
    parts = []
    if result.stdout.text:
        parts.append(result.stdout.text.rstrip("\n"))
    if result.stderr.text:
        parts.append("[stderr]\n" + result.stderr.text.rstrip("\n"))
    if not parts:
        parts.append("(no output)")
    for stream in (result.stdout, result.stderr):
        if stream.dropped:
            parts.append(f"[output truncated; {_capped(stream.spill_path, stream.dropped)}]")
        elif stream.truncated:
            parts.append(f"[output truncated; full output: {stream.spill_path or '(unavailable)'}]")
    if result.timed_out:
        parts.append(f"[timed out after {result.timeout_ms} ms]")
    if result.signal is not None:
        parts.append(f"[killed by signal: {result.signal}]")
    else:
        parts.append(f"[exit code: {result.exit_code}]")
    return "\n".join(parts)


def _capped(spill: str | None, dropped: int) -> str:
    return (
        f"the output up to the spill file's cap is in {spill or '(unavailable)'}; the"
        f" {dropped:,} bytes after it were counted, not kept"
    )


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
    if output.dropped:
        spill = output.stdout_spill_path or output.stderr_spill_path
        parts.append(f"[some output was dropped from memory; {_capped(spill, output.dropped)}]")
    elif output.lossy:
        spill = output.stdout_spill_path or output.stderr_spill_path or "(unavailable)"
        parts.append(f"[some output was dropped from memory; full output: {spill}]")
    parts.append(render_status(output.task))
    return "\n".join(parts)


def bash_tools(executor: BashExecutor, live: LiveAgents) -> list[Tool[Any]]:
    """The three tools over `executor`.

    A command runs in the sandbox of its session's mode (`MODE_ACCESS`), or
    unsandboxed when the call asks to (``unsandboxed``: the gate asks the user
    each time); its session is told once per life what the kernel enforces (a
    ``sandbox/protections`` event). A finished task read by its owner's live
    agent (found through `live`, the agent its completion notice went to) is
    forgotten after that read: the read delivered everything the task will
    ever say.
    """
    protections = executor.sandboxes.protections
    confined = frozenset(a for a in ACCESSES if a != "full-access" and confines(protections, a))

    async def bash(args: BashArgs, call: ToolInvocation) -> str | ToolOutcome:
        for field in ("command", "description"):
            if not getattr(args, field).strip():
                return ToolOutcome.failed(
                    f"bash: {field} must be a non-empty string", "invalid-arguments", "BashError"
                )
        if args.timeout_ms is not None and args.timeout_ms <= 0:
            return ToolOutcome.failed(
                f"bash: timeout_ms must be positive, got {args.timeout_ms}",
                "invalid-arguments",
                "BashError",
            )
        session = call.agent.session if call.agent is not None else None
        header = session.header if session is not None else None
        session_cwd = header.cwd if header is not None else None
        workdir = args.workdir
        if workdir is not None and not os.path.isabs(workdir) and session_cwd is not None:
            workdir = os.path.join(session_cwd, workdir)
        access = "full-access" if args.unsandboxed else MODE_ACCESS[session_mode(session)]
        # The session's directories; without a session cwd, the one its commands run in.
        roots: tuple[str, ...] = (session_cwd or executor.default_workdir,)
        if header is not None:
            roots += tuple(header.additional_directories)
        sandbox = Sandbox(access, caller_token(call), roots)
        request = BashExecRequest(
            command=args.command,
            workdir=workdir or session_cwd,
            timeout_ms=args.timeout_ms,
            owner=caller_token(call) if args.run_in_background else None,
            sandbox=sandbox,
        )
        try:
            spec = executor.resolve(request)
        except ValueError as exc:
            return ToolOutcome.failed(f"bash: {exc}", "invalid-arguments", "BashError")
        if session is not None and executor.sandboxes.first_told(session.id):
            session.append(SandboxProtections(protections=protections))
        if args.run_in_background:
            task = await executor.start(spec)
            return f"started background task {task.id}"
        result = await executor.run(spec, call.progress)
        text = render_result(result)
        if access in confined and _denied(result):
            text += "\n" + _sandbox_note(access, roots, executor.sandboxes.settings.cache_dirs)
        return text

    def _reachable(task_id: str, call: ToolInvocation) -> ToolOutcome | None:
        """An error outcome when the caller may not reach `task_id`, else None."""
        if executor.get(task_id) is None:
            return ToolOutcome.failed(
                f"unknown background task {task_id!r}", "unknown-task", "BashError"
            )
        owner = executor.owner_of(task_id)
        if owner is not None and owner != caller_token(call):
            return ToolOutcome.failed(
                f"task {task_id} belongs to another session", "not-owner", "BashError"
            )
        return None

    async def bash_output(args: BashTaskArgs, call: ToolInvocation) -> str | ToolOutcome:
        refusal = _reachable(args.task_id, call)
        if refusal is not None:
            return refusal
        try:
            output = executor.read_output(args.task_id)
        except UnknownTask as exc:
            return ToolOutcome.failed(str(exc), "unknown-task", "BashError")
        token = caller_token(call)
        if (
            output.task.status != "running"
            and token is not None
            and live(token) is call.agent
            and executor.owner_of(args.task_id) == token
        ):
            executor.forget(args.task_id)
        return render_output(output)

    async def bash_kill(args: BashTaskArgs, call: ToolInvocation) -> str | ToolOutcome:
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
            "Set run_in_background to start it as a task and read it with bash_output. "
            + _sandbox_description(protections, confined),
            BashArgs,
            bash,
            kind="execute",
            view=_bash_view,
            confined=confined,
        ),
        Tool(
            "bash_output",
            "Read the new output of a background bash task, and its status.",
            BashTaskArgs,
            bash_output,
            kind="read",
            view=lambda a: ToolView(title=f"output of {a.task_id}"),
        ),
        Tool(
            "bash_kill",
            "Stop a background bash task.",
            BashTaskArgs,
            bash_kill,
            view=lambda a: ToolView(title=f"stop {a.task_id}"),
        ),
    ]


def _bash_view(args: BashArgs) -> ToolView:
    if args.unsandboxed:
        return ToolView(title=f"{args.command}  (unsandboxed)", unsandboxed=True)
    return ToolView(title=args.command)


#: What a confined command's own error output says when its sandbox refused something.
_REFUSALS: Final = ("Permission denied", "Operation not permitted", "Read-only file system")


def _denied(result: BashRunResult) -> bool:
    return any(r in text for text in (result.stderr.text, result.stdout.text) for r in _REFUSALS)


def _sandbox_note(access: Access, roots: tuple[str, ...], caches: tuple[str, ...]) -> str:
    if access == "read-only":
        what = (
            "the session is read only: nothing can be written but in $TMPDIR, and no socket opened"
        )
    else:
        places = ", ".join((*roots, "$TMPDIR", *caches))
        what = f"writes are allowed only under {places}"
    return (
        f"[the sandbox refused what was denied above: {what}. A command that must go"
        " further can be run again with unsandboxed: true; the user is asked first]"
    )


def _sandbox_description(protections: Protections, confined: frozenset[Access]) -> str:
    """What the model is told of the sandbox its commands run in."""
    if not confined:
        return (
            "Commands run unsandboxed: this machine's kernel offers no sandbox"
            f" ({describe(protections)})."
        )
    parts = [
        "Commands run in a sandbox the kernel enforces: they read anything but write only"
        " under the session's directories, $TMPDIR (private to the session) and the package"
        " caches"
    ]
    if "read-only" in confined:
        parts.append("; in read-only mode only $TMPDIR, with the network off")
    if protections.signals:
        parts.append("; they cannot signal processes outside their own command")
    parts.append(
        ". A refused write fails with 'Permission denied'. To run one command outside the"
        " sandbox, set unsandboxed: true: the user is asked each time."
    )
    return "".join(parts)


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
    no notice. The owner's read after its notice forgets the task's record.
    """
    for tool in bash_tools(ctx.bash, ctx.agents.by_session):
        ctx.register_tool(tool)

    def notify(task: BashTask) -> None:
        owner = ctx.bash.owner_of(task.id)
        agent = ctx.agents.by_session(owner) if owner is not None else None
        if agent is None:
            return
        with contextlib.suppress(AgentDisposed):
            agent.inject(completion_notice(task), source=PluginSource(PLUGIN))

    ctx.bash.on_task_done(notify, scope=ctx.scope)
