"""What a plugin gets: the services it may use, and a scope that undoes what it did.

A plugin is a function ``plugin(ctx)`` (sync or async) that registers tools
and listeners through `PluginContext`. Everything registered through the
context is removed when the plugin stops (``ctx.scope`` closes), so a reload
leaves no stale tool or listener behind. Services (the bash executor, the
registries) belong to the runtime and outlive any plugin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec

from greenroom.actors.factory import AgentFactory
from greenroom.hooks import EmitHook, Hooks
from greenroom.supervisor import Scope
from greenroom.tools.bash.seam import BashExecutor
from greenroom.tools.registry import Tool, ToolRegistry
from greenroom.tools.typed import as_tool

P = ParamSpec("P")


class PluginContext:
    """What one plugin may use while it runs, and `registered`, the names of the tools it
    registered (offered to the agents whose spec names the plugin)."""

    __slots__ = ("agents", "bash", "hooks", "name", "registered", "scope", "tools")

    def __init__(
        self,
        name: str,
        *,
        scope: Scope,
        tools: ToolRegistry,
        hooks: Hooks,
        agents: AgentFactory,
        bash: BashExecutor,
    ) -> None:
        self.name = name
        self.scope = scope
        self.tools = tools
        self.hooks = hooks
        self.agents = agents
        self.bash = bash
        self.registered: list[str] = []

    def register_tool(self, tool: Tool[Any] | Callable[..., Any]) -> None:
        """Register `tool` (a `Tool`, or a function decorated with `greenroom.tool`) for as
        long as the plugin runs; anything else raises `TypeError`."""
        made = as_tool(tool)
        self.scope.add(self.tools.register(made))
        self.registered.append(made.name)

    def on(self, hook: EmitHook[P], listener: Callable[P, object]) -> None:
        """Listen to `hook` for as long as the plugin runs."""
        self.hooks.on(hook, listener, scope=self.scope)


Plugin = Callable[[PluginContext], Awaitable[None] | None]
