"""The ``todo`` tool: the model keeps a plan (a task list), the editor shows it.

Each call replaces the calling agent's plan whole with its ``entries``
(shaped like ACP's ``PlanEntry``: content, priority, status) and logs it as
one ``plan/set`` in the caller's own session, so a sub-agent's plan stays in
its session and a resumed session replays its plans. The plugin also tells
the model, in the system prompt of every request that offers the tool, that
it exists and when to use it.

`todo_plugin` offers the tool and its note.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from greenroom.actors.events import AGENT_REQUEST
from greenroom.actors.types import Agent, ToolInvocation, ToolOutcome, ToolView
from greenroom.protocol.events import PlanEntry, PlanSet
from greenroom.protocol.model import ModelRequest, ToolSchema
from greenroom.tools.plugins import PluginContext
from greenroom.tools.registry import Tool

PLUGIN: Final = "tool-todo"
#: Tool lists whose answer `_Offered` keeps, at most (then it starts over).
_KEPT: Final = 64
#: Entries of one plan, at most.
MAX_ENTRIES: Final = 100
#: Characters of one entry's content, at most.
MAX_CONTENT: Final = 1_000

#: What the system prompt of a request offering ``todo`` says of it.
TODO_NOTE: Final = (
    "You have a todo tool: for work of several steps, keep a plan with it. Each call "
    "replaces the whole list; mark one entry in_progress while you work on it and "
    "completed as soon as it is done. The user sees the list."
)


class TodoArgs(msgspec.Struct, frozen=True, kw_only=True):
    """The arguments of ``todo``: the whole plan."""

    entries: list[PlanEntry]


def _refuse(message: str) -> ToolOutcome:
    return ToolOutcome.failed(f"todo: {message}", "invalid-plan", "TodoError")


def render_plan(entries: list[PlanEntry]) -> str:
    """The plan as the model reads it back: one line per entry."""
    if not entries:
        return "The plan is empty."
    marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
    lines = [f"Plan ({len(entries)} entries):"]
    lines += [f"{marks[e.status]} {e.content} ({e.priority})" for e in entries]
    return "\n".join(lines)


async def todo(args: TodoArgs, call: ToolInvocation) -> str | ToolOutcome:
    """Replace the caller's plan with ``args.entries`` and log it (``plan/set``)."""
    agent: Agent | None = call.agent
    if agent is None:
        return _refuse("a plan belongs to an agent's session; this call has none")
    if len(args.entries) > MAX_ENTRIES:
        return _refuse(f"{len(args.entries)} entries; a plan holds at most {MAX_ENTRIES}")
    for index, entry in enumerate(args.entries):
        if not entry.content.strip():
            return _refuse(f"entries[{index}].content is empty")
        if len(entry.content) > MAX_CONTENT:
            return _refuse(
                f"entries[{index}].content has {len(entry.content)} characters;"
                f" at most {MAX_CONTENT}"
            )
    session = agent.session
    session.append(PlanSet(turn=session.open_turn or 0, call_id=call.call_id, entries=args.entries))
    return render_plan(args.entries)


TODO: Final[Tool[Any]] = Tool(
    "todo",
    "Keep your plan: the whole task list, replaced on each call. Each entry has content, "
    "priority (high, medium, low) and status (pending, in_progress, completed).",
    TodoArgs,
    todo,
    kind="think",
    view=lambda a: ToolView(kind="think", title=f"plan: {len(a.entries)} entries"),
)


class _Offered:
    """Whether a request offers ``todo``, worked out once per tool list, not per request: a
    session's tool list is one list object until its tools change (`ToolExecutor.schemas`),
    so a list held here, compared by identity, keeps its answer. A list built afresh per
    request is looked through each time, as before. At most `_KEPT` lists are held."""

    __slots__ = ("_answers",)

    def __init__(self) -> None:
        self._answers: dict[int, tuple[list[ToolSchema], bool]] = {}

    async def tell_the_model(self, request: ModelRequest, *_: object) -> ModelRequest:
        if not self._offers(request.tools):
            return request
        system = f"{request.system}\n\n{TODO_NOTE}" if request.system else TODO_NOTE
        return msgspec.structs.replace(request, system=system)

    def _offers(self, tools: list[ToolSchema]) -> bool:
        known = self._answers.get(id(tools))
        if known is not None and known[0] is tools:
            return known[1]
        offers = any(tool.name == "todo" for tool in tools)
        if len(self._answers) >= _KEPT:
            self._answers.clear()
        self._answers[id(tools)] = (tools, offers)
        return offers


def todo_plugin(ctx: PluginContext) -> None:
    """The ``tool-todo`` plugin: the tool, and its note in the system prompt."""
    ctx.register_tool(TODO)
    ctx.hooks.intercept(AGENT_REQUEST, _Offered().tell_the_model, scope=ctx.scope)
