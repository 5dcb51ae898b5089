"""The ``task`` tool: the model hands a piece of work to a sub-agent and gets its answer.

Each call spawns a child of the calling agent (`AgentHandle.spawn`: a session
of its own naming the caller's as its ``parent_session``), sends it the
prompt, waits for that turn's end, and returns the child's final answer as
the result; the child is disposed when the call ends, however it ends.
Calls of one step run at once (the tool is ``concurrent``). A cancel of the
caller's turn cancels the child too (the caller's `cancel` reaches its
children); the call waits, within `CLOSING_GRACE`, for the child's turn to
end ``aborted``, so the child's ``turn/end`` is on disk before the caller's.
A child that fails, or is cancelled on its own, is an error result; the
caller's turn goes on.

`task_tool` makes the tool (optionally with specs a child may be made from), `task_plugin`
offers it; each spawn is told as ``subagent/started``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Final

import msgspec
import trio

from greenroom.actors.loop import CLOSING_GRACE
from greenroom.actors.spec import AgentSpec
from greenroom.actors.types import (
    Agent,
    AgentOptions,
    ChildHandle,
    SpawnRefused,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.protocol.events import (
    Aborted,
    AgentSource,
    AssistantMessage,
    Completed,
    Errored,
    MaxTokens,
    Refused,
    TurnEnd,
)
from greenroom.session.session import TITLE_LENGTH
from greenroom.tools.plugins import PluginContext
from greenroom.tools.registry import Tool

PLUGIN: Final = "tool-task"


class TaskArgs(msgspec.Struct, frozen=True, kw_only=True):
    """The arguments of ``task``: the work, a few words for the user, and either the system
    prompt of a fresh sub-agent or the `agent` (one of the specs the tool was given)."""

    prompt: str
    description: str = ""
    instructions: str | None = None
    agent: str | None = None


def task_tool(specs: Sequence[AgentSpec] = ()) -> Tool[TaskArgs]:
    """The ``task`` tool. Without `specs`, each call starts a fresh sub-agent (the caller's
    model, the call's `instructions`); with them, a call names the one to start (`agent`:
    a spec's name; its description lists them), and may start only those: give it as an
    agent's own tool (``AgentSpec(tools=[task_tool([researcher, writer])])``). A spec
    named twice is a `ValueError`."""
    named = {spec.name: spec for spec in specs}
    if len(named) < len(specs):
        raise ValueError("task_tool: two specs share a name; each must be told apart by it")

    async def run(args: TaskArgs, invocation: ToolInvocation) -> ToolOutcome:
        parent, spawn = invocation.agent, invocation.spawn
        if parent is None or spawn is None:
            await trio.lowlevel.checkpoint()
            return _failed("there is no agent to spawn a sub-agent from", "no-agent")
        if not args.prompt.strip():
            await trio.lowlevel.checkpoint()
            return _failed("the prompt is empty", "invalid-arguments")
        try:
            if named:
                spec = named.get(args.agent or "")
                if spec is None:
                    await trio.lowlevel.checkpoint()
                    known = ", ".join(named)
                    return _failed(
                        f"agent must be one of {known}, not {args.agent!r}", "unknown-agent"
                    )
                child = await spawn(spec)
            else:
                child_id = str(uuid.uuid4())
                options = AgentOptions(model=parent.options.model, system_prompt=args.instructions)
                child = await spawn(agent_id=child_id, session_id=child_id, options=options)
        except SpawnRefused as exc:
            return _failed(f"no sub-agent was started: {exc}", "spawn-refused")
        try:
            return await _answer(child, args.prompt, parent)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSING_GRACE):
                await child.dispose()

    if named:
        how = f" Name the sub-agent to start in `agent`: one of {', '.join(named)}."
    else:
        how = " `instructions` become its system prompt."
    return Tool(
        "task",
        "Hand a self-contained piece of work to a sub-agent with a fresh context. Give it"
        " everything it needs in `prompt`; `description` is a few words for the user."
        f"{how} Returns its final answer. Several task calls in one step run at once.",
        TaskArgs,
        run,
        kind="think",
        view=_view,
        concurrent=True,
    )


def _failed(message: str, code: str) -> ToolOutcome:
    return ToolOutcome.failed(f"task: {message}", code, "TaskError")


async def _answer(child: ChildHandle, prompt: str, parent: Agent) -> ToolOutcome:
    """Run the child's one turn; its final answer, or an error result saying why not."""
    agent = child.agent
    try:
        # A cancel of the caller that came while the child was starting found it
        # idle, so it cancelled nothing there: honour it before the child gets work.
        await trio.lowlevel.checkpoint_if_cancelled()
        agent.send(prompt, source=AgentSource(parent.id))
        await agent.when_idle()
    except BaseException:
        if parent.status != "disposed":  # a cancel: the child's turn is ending aborted
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSING_GRACE):
                await agent.when_idle()
        raise
    events = agent.session.events
    end = next((e for e in reversed(events) if isinstance(e, TurnEnd)), None)
    answer = next(
        (e.content for e in reversed(events) if isinstance(e, AssistantMessage) and e.content),
        "",
    )
    if end is None:
        return ToolOutcome.failed(
            "task: the sub-agent ended without a turn", "subagent-failed", "TaskError"
        )
    reason = end.reason
    if isinstance(reason, Completed | MaxTokens):
        return ToolOutcome(answer or "(the sub-agent gave no answer)")
    if isinstance(reason, Errored):
        return ToolOutcome.failed(
            f"task: the sub-agent failed: {reason.message}", "subagent-failed", "TaskError"
        )
    if isinstance(reason, Refused):
        return ToolOutcome.failed(
            "task: the sub-agent's model refused the task", "subagent-refused", "TaskError"
        )
    if isinstance(reason, Aborted):
        return ToolOutcome.failed(
            f"task: the sub-agent was cancelled: {reason.reason}", "subagent-cancelled", "TaskError"
        )
    return ToolOutcome.failed(
        "task: the sub-agent was disposed before it answered", "subagent-failed", "TaskError"
    )


def _view(args: TaskArgs) -> ToolView:
    title = args.description.strip() or (args.prompt.strip().splitlines() or [""])[0]
    return ToolView(kind="think", title=title[:TITLE_LENGTH] or "task")


def task_plugin(ctx: PluginContext) -> None:
    """The ``tool-task`` plugin: the ``task`` tool, starting fresh sub-agents."""
    ctx.register_tool(task_tool())
