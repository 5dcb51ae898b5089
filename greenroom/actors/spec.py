"""`AgentSpec`: an agent as a value, and `Resolved`, what the runtime makes of one.

A spec says what an agent is (its model, instructions, tools, output,
limits, guards, servers) and nothing of where it runs: `Runtime.start`
starts it on a session (creating it, or resuming it when stored), and a
parent's `AgentHandle.spawn` starts it as a child. Specs hold functions and
adapters, so they are frozen dataclasses checked at construction (as the
supervisor's `ChildSpec` is); what only the runtime can check (a tool name it
offers, a model string's key) is checked at start, each a `ValueError` or
`TypeError` naming the field.

`Resolver` is what the runtime makes one with (`greenroom.resolve.SpecResolver`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from greenroom.actors.compaction import CompactionPolicy
from greenroom.actors.limits import Limits
from greenroom.actors.output import output_spec
from greenroom.actors.types import AgentOptions, Guard, Permissions, ToolExecutor
from greenroom.models.base import ModelAdapter
from greenroom.protocol.mcp import McpServer, check_servers

#: What `AgentSpec.instructions` may be: text, or a function giving it (sync or async).
Instructions = str | Callable[[], str | Awaitable[str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSpec:
    """What an agent is.

    * ``name``: what it is called (its agents' ids are ``NAME:SESSION``).
    * ``model``: a model string by the command line's rule (``"anthropic:claude-sonnet-4-5"``,
      ``"openai:gpt-5"``, ``"scripted"``), or an adapter; None: the runtime's default. A
      string the runtime has a model of that id for reuses it; another makes one adapter
      per distinct string, held and closed by the runtime. The session's ``model``
      setting may choose among the runtime's models and this one.
    * ``instructions``: its system prompt, or a function giving it (sync or async),
      called at each start and resume; the text is logged as the session's
      ``instructions`` setting, so a request is built from the log alone.
    * ``tools``: its own tools (`Tool`s and ``@tool`` functions), and the names of the
      runtime's tools it is offered; it is offered no other of the runtime's.
    * ``plugins``: plugins (``plugin(ctx)``) whose tools it is offered: each is plugged
      into the runtime once, at the first start that names it.
    * ``output``: the structured output `send` and `run` ask for when they name none.
    * ``mcp_servers``, ``compaction``, ``limits``, ``guards``: its MCP servers (started
      with each of its sessions), its compaction policy (None: the runtime's), the
      `Limits` its runs cannot pass, the `Guard`s that watch them.
    * ``permissions``: whom its decisions (a tool's permission, an ``ask_user``
      question) ask when its session's front end asks no one: None, the runtime's
      policy; `Defer`, no one (they wait, parked, for `decide`).
    * ``decision_wait``: seconds a decision may wait before the turn's prompts are
      answered ``requires-action`` (the turn waits on, parked); None: no deadline.
    """

    name: str
    model: str | ModelAdapter | None = None
    instructions: Instructions | None = None
    tools: Sequence[object] = ()
    plugins: Sequence[Callable[..., object]] = ()
    output: type[Any] | None = None
    mcp_servers: Sequence[McpServer] = ()
    compaction: CompactionPolicy | None = None
    limits: Limits | None = None
    guards: Sequence[Guard] = ()
    permissions: Permissions | None = None
    decision_wait: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"AgentSpec.name must be non-empty text, got {self.name!r}")
        where = f"AgentSpec {self.name!r}"
        model = self.model
        if (
            model is not None
            and not isinstance(model, str)
            and not callable(getattr(model, "stream", None))
        ):
            raise TypeError(
                f"{where}: model must be a model string or an adapter (with stream()),"
                f" got {type(model).__name__}"
            )
        if isinstance(model, str) and not model.strip():
            raise ValueError(f"{where}: model must be a model string such as 'scripted'")
        instructions = self.instructions
        if (
            instructions is not None
            and not isinstance(instructions, str)
            and not callable(instructions)
        ):
            raise TypeError(
                f"{where}: instructions must be text or a function giving it,"
                f" got {type(instructions).__name__}"
            )
        for field in ("tools", "plugins", "mcp_servers", "guards"):
            value = getattr(self, field)
            if isinstance(value, str | bytes) or not isinstance(value, Sequence):
                raise TypeError(f"{where}: {field} must be a list, got {type(value).__name__}")
            object.__setattr__(self, field, tuple(value))
        for index, entry in enumerate(self.tools):
            if not isinstance(entry, str) and not callable(entry) and not hasattr(entry, "name"):
                raise TypeError(
                    f"{where}: tools[{index}] must be a Tool, a @tool function or a tool's"
                    f" name, got {type(entry).__name__}"
                )
        for index, plugin in enumerate(self.plugins):
            if not callable(plugin):
                raise TypeError(f"{where}: plugins[{index}] must be a plugin function")
        for index, guard in enumerate(self.guards):
            if not isinstance(guard, Guard):
                raise TypeError(f"{where}: guards[{index}] must be a Guard, got {guard!r}")
        if self.output is not None:
            try:
                output_spec(self.output)
            except TypeError as exc:
                raise TypeError(f"{where}: output: {exc}") from None
        if self.limits is not None and not isinstance(self.limits, Limits):
            raise TypeError(f"{where}: limits must be Limits, got {type(self.limits).__name__}")
        if self.compaction is not None and not isinstance(self.compaction, CompactionPolicy):
            raise TypeError(f"{where}: compaction must be a CompactionPolicy")
        if self.permissions is not None and not callable(getattr(self.permissions, "decide", None)):
            raise TypeError(f"{where}: permissions must be a policy with decide(), or Defer()")
        wait = self.decision_wait
        if wait is not None and (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not math.isfinite(wait)
            or wait < 0
        ):
            raise ValueError(
                f"{where}: decision_wait must be a finite number of seconds >= 0, got {wait!r}"
            )
        try:
            check_servers(self.mcp_servers)
        except ValueError as exc:
            raise ValueError(f"{where}: mcp_servers: {exc}") from None


@dataclass(frozen=True, slots=True)
class Resolved:
    """What the runtime made of an `AgentSpec` (`Runtime` resolves, the factory starts):
    the agent's options, its models by id (its own first: the default), the tools it is
    offered, and its instructions' text for this start (None: none)."""

    spec: AgentSpec
    options: AgentOptions
    models: Mapping[str, ModelAdapter]
    tools: ToolExecutor
    instructions: str | None


class Resolver(Protocol):
    """What makes specs real (the runtime): their models, tools and instructions."""

    async def resolve(self, spec: AgentSpec) -> Resolved:
        """`spec`'s options, models, tools and instructions' text for one start; raises
        `ValueError` or `TypeError` naming the field that cannot be made real."""
        ...

    def named(self, names: Sequence[str]) -> ToolExecutor:
        """The runtime's tools named in `names`, as a spawned child without a spec is
        offered them."""
        ...
