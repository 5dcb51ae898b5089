"""`OfferedTools`: the tools one agent is offered, and the one way its calls run.

An agent made from an `AgentSpec` has tools of its own, and is offered of the
runtime's tools only those it names; a spawned child may be given a subset
of the runtime's by name. Every call still goes through the runtime's
`ToolRegistry` (its ``tools/execute`` waterfall, the permission gate, the
cap on results): an agent's own tools are the registry's ``extra`` tools for
that call, looked up first, as a session's MCP servers' are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import trio

from greenroom.actors.types import ToolInvocation, ToolOutcome, ToolView
from greenroom.protocol.model import ToolSchema
from greenroom.tools.registry import NO_TOOLS, ToolEntry, ToolRegistry


class OfferedTools:
    """A `ToolExecutor`: `own` tools (by name), then the registry's named in `names` (all
    of them for None). A call of any other tool is an ``unknown-tool`` error result
    naming those it may call.

    The schemas are the registry's offered ones, then the own ones; the list is made
    again only when the registry's changes (a plugin added or removed a tool).
    """

    __slots__ = ("_names", "_own", "_registry", "_schemas", "_schemas_of")

    def __init__(
        self,
        registry: ToolRegistry,
        own: Mapping[str, ToolEntry] = NO_TOOLS,
        names: Iterable[str] | None = None,
    ) -> None:
        self._registry = registry
        self._own = own
        self._names = None if names is None else frozenset(names)
        self._schemas: list[ToolSchema] = []
        self._schemas_of: list[ToolSchema] | None = None

    def schemas(self) -> list[ToolSchema]:
        every = self._registry.schemas()
        if every is not self._schemas_of:
            self._schemas_of = every
            names, own = self._names, self._own
            offered = [
                schema
                for schema in every
                if schema.name not in own and (names is None or schema.name in names)
            ]
            self._schemas = [*offered, *(entry.schema for entry in own.values())]
        return self._schemas

    def describe(self, name: str, arguments: str) -> ToolView:
        return self._registry.describe(name, arguments, self._own)

    async def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        name = invocation.name
        if name in self._own or self._names is None or name in self._names:
            return await self._registry.execute(invocation, self._own)
        await trio.lowlevel.checkpoint()
        known = ", ".join(sorted({*self._names, *self._own})) or "none"
        return ToolOutcome.failed(f"unknown tool {name!r} (known tools: {known})", "unknown-tool")
