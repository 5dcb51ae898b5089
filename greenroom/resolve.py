"""`SpecResolver`: how a runtime makes an `AgentSpec` real, each time one starts.

Its model: the runtime's of that id, or one adapter per distinct model string
(`greenroom.models.named`), held by the resolver for the runtime's life and
closed with it, or the adapter the spec gives. Its tools: its own (`Tool`s
and ``@tool`` functions, run as the registry's extra tools), the runtime's
it names, and those of its plugins (each plugged once, at the first start
that names it). Its instructions: the text, or the function's answer at this
start. What cannot be made real is a `ValueError` or `TypeError` naming the
spec and the field.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Final, cast

import trio

from greenroom.actors.spec import AgentSpec, Resolved
from greenroom.actors.types import AgentOptions, ToolExecutor
from greenroom.models.base import ModelAdapter, PooledModel
from greenroom.models.named import model_named
from greenroom.tools.offered import OfferedTools
from greenroom.tools.plugins import Plugin
from greenroom.tools.registry import ToolEntry, ToolRegistry
from greenroom.tools.typed import as_tool

#: A plugin as the runtime plugs it: ``plug(name, plugin)`` returns the tools it registered.
Plug = Callable[[str, Plugin], Awaitable[Sequence[str]]]

#: How many specs' tools are kept made (a service that starts one spec per request makes
#: them once); past it the oldest are made again when next started.
KEPT_SPECS: Final = 64


class SpecResolver:
    """A runtime's `Resolver` (see the module docstring); entered for the runtime's life."""

    __slots__ = ("_made", "_models", "_plug", "_plugged", "_registry", "_stack", "_tools")

    def __init__(
        self, models: Mapping[str, ModelAdapter], registry: ToolRegistry, plug: Plug
    ) -> None:
        self._models = models  # the runtime's, by id (the first is the default)
        self._registry = registry
        self._plug = plug
        self._made: dict[str, ModelAdapter] = {}  # by model string, held by `_stack`
        self._plugged: dict[Plugin, Sequence[str]] = {}  # plugin -> its tools
        self._tools: dict[int, tuple[AgentSpec, ToolExecutor]] = {}  # by id(spec)
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> SpecResolver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()  # the adapters made for specs: their pools closed

    async def resolve(self, spec: AgentSpec) -> Resolved:
        where = f"AgentSpec {spec.name!r}"
        models = await self._models_of(spec, where)
        tools = await self._tools_of(spec, where)
        options = AgentOptions(
            compaction=spec.compaction,
            output=spec.output,
            limits=spec.limits,
            guards=tuple(spec.guards),
            permissions=spec.permissions,
            decision_wait=spec.decision_wait,
        )
        return Resolved(spec, options, models, tools, await _instructions(spec, where))

    def named(self, names: Sequence[str]) -> ToolExecutor:
        return OfferedTools(self._registry, names=names)

    async def _models_of(self, spec: AgentSpec, where: str) -> Mapping[str, ModelAdapter]:
        """The agent's models: its own first (the default), then the runtime's."""
        model = spec.model
        if model is None:
            return self._models
        if isinstance(model, str):
            if model in self._models:
                return {model: self._models[model], **self._models}
            adapter = self._made.get(model)
            if adapter is None:
                adapter = model_named(model, os.environ, what=f"{where}: model")
                if isinstance(adapter, PooledModel):
                    await self._stack.enter_async_context(adapter.connections.held())
                self._made[model] = adapter
            return {model: adapter, **self._models}
        for model_id, adapter in self._models.items():
            if adapter is model:
                return {model_id: adapter, **self._models}
        return {spec.name: model, **self._models}

    async def _tools_of(self, spec: AgentSpec, where: str) -> ToolExecutor:
        kept = self._tools.get(id(spec))
        if kept is not None and kept[0] is spec:
            return kept[1]
        own: dict[str, ToolEntry] = {}
        names: list[str] = []
        for index, entry in enumerate(spec.tools):
            if isinstance(entry, str):
                names.append(entry)
                continue
            try:
                tool = as_tool(entry)
            except TypeError as exc:
                raise TypeError(f"{where}: tools[{index}]: {exc}") from None
            if tool.name in own:
                raise ValueError(f"{where}: tools[{index}]: a second tool named {tool.name!r}")
            own[tool.name] = ToolEntry.of(tool)
        for plugin in map(_plugin, spec.plugins):
            plugged = self._plugged.get(plugin)
            if plugged is None:
                name = (
                    f"{getattr(plugin, '__module__', '')}.{getattr(plugin, '__qualname__', plugin)}"
                )
                plugged = self._plugged[plugin] = await self._plug(name, plugin)
            names.extend(plugged)
        known = {schema.name for schema in self._registry.schemas()}
        for name in names:
            if name not in known:
                offered = ", ".join(sorted(known)) or "none"
                raise ValueError(
                    f"{where}: tools: the runtime has no tool {name!r} (it has: {offered})"
                )
        tools = OfferedTools(self._registry, own, names)
        if len(self._tools) >= KEPT_SPECS:
            del self._tools[next(iter(self._tools))]
        self._tools[id(spec)] = (spec, tools)
        return tools


def _plugin(plugin: Callable[..., object]) -> Plugin:
    """A spec's plugin, as the runtime plugs it (a spec, made below the tools, cannot say)."""
    return cast(Plugin, plugin)


async def _instructions(spec: AgentSpec, where: str) -> str | None:
    """The text of `spec`'s instructions at this start (a function is called now)."""
    instructions: Any = spec.instructions
    if instructions is None or isinstance(instructions, str):
        return instructions
    try:
        text = instructions()
        if inspect.isawaitable(text):
            text = await text
    except Exception as exc:
        raise ValueError(f"{where}: instructions raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(text, str):
        raise TypeError(f"{where}: instructions gave {type(text).__name__}, not text")
    await trio.lowlevel.checkpoint()
    return text
