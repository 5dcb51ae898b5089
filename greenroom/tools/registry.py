"""`ToolRegistry`: the tools an agent may call, and the one way a call is executed.

A tool declares its arguments as a msgspec Struct; the registry decodes and
validates the model's JSON against it before the tool runs, so a tool only
ever sees well-typed arguments. Every failure on the way (an unknown tool,
bad JSON, a missing or mistyped field, a tool that raises) becomes an error
result for the model, naming what was wrong; only a cancel propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from greenroom.actors.types import ToolInvocation, ToolOutcome
from greenroom.hooks import Hooks, WaterfallHook
from greenroom.protocol.events import ToolError
from greenroom.protocol.model import ToolSchema

logger = logging.getLogger("greenroom.tools")

A = TypeVar("A", bound=msgspec.Struct)

#: Every invocation passes through this before it runs (rewrite it, or raise to refuse it).
TOOLS_EXECUTE: WaterfallHook[ToolInvocation, []] = WaterfallHook("tools/execute")


@dataclass(frozen=True, slots=True)
class Tool(Generic[A]):
    """A named, described tool whose arguments are the Struct ``args``.

    ``run(args, invocation)`` returns the text for the model, or a
    `ToolOutcome` to mark an error itself.
    """

    name: str
    description: str
    args: type[A]
    run: Callable[[A, ToolInvocation], Awaitable[str | ToolOutcome]]


class _Entry:
    __slots__ = ("decoder", "schema", "tool")

    def __init__(self, tool: Tool[Any]) -> None:
        self.tool = tool
        self.decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(tool.args)
        self.schema = ToolSchema(tool.name, tool.description, _parameters(tool.args))


class ToolRegistry:
    """Tools by name; `execute` never raises for a bad call, only for a cancel."""

    __slots__ = ("_entries", "_hooks", "_schemas")

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._entries: dict[str, _Entry] = {}
        self._schemas: list[ToolSchema] = []

    def register(self, tool: Tool[Any]) -> Callable[[], None]:
        """Add `tool`; a second tool of the same name raises. Returns the remover."""
        if tool.name in self._entries:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        entry = _Entry(tool)
        self._entries[tool.name] = entry
        self._schemas = [e.schema for e in self._entries.values()]

        def remove() -> None:
            if self._entries.get(tool.name) is entry:
                del self._entries[tool.name]
                self._schemas = [e.schema for e in self._entries.values()]

        return remove

    def schemas(self) -> list[ToolSchema]:
        return self._schemas

    async def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        try:
            invocation = await self._hooks.waterfall(TOOLS_EXECUTE, invocation)
        except Exception as exc:
            return _error(f"tool call {invocation.name!r} was refused: {exc}", exc, "refused")
        entry = self._entries.get(invocation.name)
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none"
            return _error(
                f"unknown tool {invocation.name!r} (known tools: {known})", None, "unknown-tool"
            )
        try:
            args = entry.decoder.decode(invocation.arguments.strip() or "{}")
        except msgspec.ValidationError as exc:
            return _error(
                f"invalid arguments for {invocation.name}: {exc}", exc, "invalid-arguments"
            )
        except msgspec.DecodeError as exc:
            return _error(
                f"arguments for {invocation.name} are not a JSON object: {exc}",
                exc,
                "invalid-arguments",
            )
        try:
            result = await entry.tool.run(args, invocation)
        except Exception as exc:
            logger.info("tool %r raised", invocation.name, exc_info=True)
            return _error(f"{invocation.name} failed: {type(exc).__name__}: {exc}", exc, "raised")
        return result if isinstance(result, ToolOutcome) else ToolOutcome(result)


def _error(message: str, exc: BaseException | None, code: str) -> ToolOutcome:
    name = type(exc).__name__ if exc is not None else "ToolError"
    return ToolOutcome(message, is_error=True, error=ToolError(name=name, code=code))


def _parameters(args: type[msgspec.Struct]) -> dict[str, object]:
    """The JSON Schema of `args`, with its own definition inlined at the top."""
    (schema,), defs = msgspec.json.schema_components([args], ref_template="#/$defs/{name}")
    top = dict(defs.pop(args.__name__, schema))
    if defs:
        top["$defs"] = defs
    return top
