"""`ToolRegistry`: the tools an agent may call, and the one way a call is executed.

A tool declares its arguments as a msgspec Struct and what it does (its
`ToolKind`); the registry decodes and validates the model's JSON against the
Struct, then, for a tool that edits, deletes, moves or executes, decides
whether it may run (a call asking to leave its sandbox, the session's mode
and the sandbox the tool is confined to, its remembered "always" answers,
then whom its front end asks, or the runtime's policy), and only then runs
it. Every failure on the way (an unknown tool, bad JSON, a missing or
mistyped field, a refusal, a tool that raises) becomes an error result for
the model, naming what was wrong; only a cancel propagates.

Every result leaves `execute` bounded: a text (its output, each side of each
of its diffs) longer than ``max_tool_result`` characters is cut with a
marker saying how much was cut and naming a spill file that holds the whole
text. The loop logs the result as it comes back, so neither the log nor the
model's history ever holds more.

The names: `Tool` (a tool: its arguments Struct, its run, its kind, its view, the sandboxes
it is ``confined`` to) and `ToolEntry` (one tool as the registry runs it: from a `Tool`, or
an MCP server's); the ``tools/execute`` waterfall; the permission gate
(`ToolRegistry._permit`: an unsandboxed call always asked once; `session_mode`; `AllowAll`,
the default policy when no front end asks anyone); a session's extra tools (its agent's own,
its MCP servers') looked up first; the spill directory of cut results, removed by
`ToolRegistry.aclose` at the runtime's end.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any, Final, Generic, TypeVar

import msgspec
import trio

from greenroom.actors.step import StepFailed, TurnStopped
from greenroom.actors.types import (
    DEFAULT_MODE,
    MODE_ACCESS,
    Defer,
    NamedAnswer,
    PermissionRequest,
    Permissions,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.hooks import Hooks, WaterfallHook
from greenroom.protocol.arguments import decode_arguments
from greenroom.protocol.events import (
    FileDiff,
    PermissionDecision,
    PermissionRule,
    ToolKind,
)
from greenroom.protocol.model import ToolSchema
from greenroom.sandbox import Access
from greenroom.session import Session
from greenroom.spill import DEFAULT_MAX_TOOL_RESULT, SpillDir, TextCap

logger = logging.getLogger("greenroom.tools")

A = TypeVar("A", bound=msgspec.Struct)

#: Every invocation passes through this before it runs (rewrite it, or raise to refuse it).
TOOLS_EXECUTE: WaterfallHook[ToolInvocation, []] = WaterfallHook("tools/execute")

#: The kinds of tool that change something outside the conversation: they ask first.
ASKS_PERMISSION: Final = frozenset({"edit", "delete", "move", "execute"})


class AllowAll:
    """The runtime's default policy when no front end asks anyone: every call may run.

    The session's mode still applies (``read-only`` refuses edits and the commands
    no sandbox confines).
    """

    async def decide(self, request: PermissionRequest) -> PermissionDecision:
        await trio.lowlevel.checkpoint()
        return "allow_once"


@dataclass(frozen=True, slots=True)
class Tool(Generic[A]):
    """A named, described tool whose arguments are the Struct ``args``.

    ``run(args, invocation)`` returns the text for the model, or a
    `ToolOutcome` to mark an error itself. ``kind`` says what it does;
    ``view(args)`` gives a reader its title and the places it touches.
    ``concurrent`` calls of one step run at once (the others one by one).
    ``idempotent``: running a call twice does what running it once does, so a
    call a crash cut after it started is run again when its turn is continued
    (``read`` tools are run again without it); any other such call is given an
    ``interrupted`` result instead. ``confined``: the sandboxes (`greenroom.sandbox`)
    its calls run in when the session's mode asks for one of them, as the kernel
    gives them: a mode whose sandbox is among them runs the call without asking
    (read only, accept edits), since the kernel bounds what it can change.
    """

    name: str
    description: str
    args: type[A]
    run: Callable[[A, ToolInvocation], Awaitable[str | ToolOutcome]]
    kind: ToolKind = "other"
    view: Callable[[A], ToolView] | None = None
    concurrent: bool = False
    idempotent: bool = False
    confined: frozenset[Access] = frozenset()


class ToolEntry:
    """One callable tool as the registry runs it: its schema, how its arguments decode, its run.

    Built once per tool: from a `Tool` (`of`), or by a source of tools whose
    schemas come as JSON Schema (an MCP server), which decodes to a dict and
    leaves validation to the tool.
    """

    __slots__ = (
        "concurrent",
        "confined",
        "decode",
        "idempotent",
        "kind",
        "name",
        "plain",
        "run",
        "schema",
        "view",
    )

    def __init__(
        self,
        schema: ToolSchema,
        decode: Callable[[str], Any],
        run: Callable[[Any, ToolInvocation], Awaitable[str | ToolOutcome]],
        kind: ToolKind = "other",
        view: Callable[[Any], ToolView] | None = None,
        concurrent: bool = False,
        idempotent: bool = False,
        confined: frozenset[Access] = frozenset(),
    ) -> None:
        self.name = schema.name
        self.schema = schema
        self.decode = decode
        self.run = run
        self.kind: ToolKind = kind
        self.view = view
        self.concurrent = concurrent
        self.idempotent = idempotent
        self.confined = confined
        #: Its view of any call when it has no `view` of its own (or that fails): made once.
        self.plain = ToolView(
            kind=kind, title=self.name, concurrent=concurrent, idempotent=idempotent
        )

    @classmethod
    def of(cls, tool: Tool[Any]) -> ToolEntry:
        schema = ToolSchema(tool.name, tool.description, _parameters(tool.args))
        decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(tool.args)
        return cls(
            schema,
            decoder.decode,
            tool.run,
            tool.kind,
            tool.view,
            tool.concurrent,
            tool.idempotent,
            tool.confined,
        )


#: No tools beyond the registry's.
NO_TOOLS: Final[Mapping[str, ToolEntry]] = MappingProxyType({})


class ToolRegistry:
    """Tools by name; `execute` never raises for a bad call, only for a cancel, or a guard
    that stops the turn (`TurnStopped`, out of the ``tools/execute`` waterfall).

    ``permissions`` is the policy for calls whose session has no front end
    that asks (default `AllowAll`). ``describe`` and ``execute`` take the
    ``extra`` tools of one session (its MCP servers'), looked up before the
    registry's own and run through the same gate. ``max_tool_result`` bounds
    every text of a result (see the module); the spill files of cut results
    live in a private temporary directory until `aclose` (the runtime's end).
    A ``max_tool_result`` that is not a positive int is a `ValueError`.
    """

    __slots__ = ("_cap", "_entries", "_hooks", "_permissions", "_schemas", "_spills")

    def __init__(
        self,
        hooks: Hooks,
        permissions: Permissions | None = None,
        *,
        max_tool_result: int = DEFAULT_MAX_TOOL_RESULT,
    ) -> None:
        self._spills = SpillDir("greenroom-results-")
        self._cap = TextCap(max_tool_result, self._spills, option="max_tool_result")
        self._hooks = hooks
        self._permissions: Permissions = permissions or AllowAll()
        self._entries: dict[str, ToolEntry] = {}
        self._schemas: list[ToolSchema] = []

    async def aclose(self) -> None:
        """Remove every spill file of a cut result (at once, even in a cancelled scope);
        a result cut later names no file."""
        self._spills.close()

    def register(self, tool: Tool[Any]) -> Callable[[], None]:
        """Add `tool`; a second tool of the same name raises. Returns the remover."""
        if tool.name in self._entries:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        entry = ToolEntry.of(tool)
        self._entries[tool.name] = entry
        self._schemas = [e.schema for e in self._entries.values()]

        def remove() -> None:
            if self._entries.get(tool.name) is entry:
                del self._entries[tool.name]
                self._schemas = [e.schema for e in self._entries.values()]

        return remove

    def schemas(self) -> list[ToolSchema]:
        return self._schemas

    def describe(
        self, name: str, arguments: str, extra: Mapping[str, ToolEntry] = NO_TOOLS
    ) -> ToolView:
        """What a call of `name` with `arguments` does; a bad call is titled by its name."""
        entry = extra.get(name) or self._entries.get(name)
        return ToolView(title=name) if entry is None else _view(entry, arguments)

    async def execute(
        self, invocation: ToolInvocation, extra: Mapping[str, ToolEntry] = NO_TOOLS
    ) -> ToolOutcome:
        """Run one call through the gate; its result, every text of it bounded (and one
        UTF-8 can hold: a lone surrogate, as a file name not in UTF-8 decodes, would make
        the log refuse the result, so it becomes U+FFFD)."""
        outcome = await self._execute(invocation, extra)
        limit = self._cap.limit
        if all(len(text) <= limit and _encodes(text) for text in _texts(outcome)):
            return outcome
        bound = self._bound
        diffs = [
            FileDiff(
                await bound(diff.path),
                await bound(diff.new_text),
                None if diff.old_text is None else await bound(diff.old_text),
            )
            for diff in outcome.diffs
        ]
        return msgspec.structs.replace(outcome, content=await bound(outcome.content), diffs=diffs)

    async def _bound(self, text: str) -> str:
        if not _encodes(text):
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return await self._cap(text)

    async def _execute(
        self, invocation: ToolInvocation, extra: Mapping[str, ToolEntry]
    ) -> ToolOutcome:
        if TOOLS_EXECUTE in self._hooks.listened:
            try:
                invocation = await self._hooks.waterfall(TOOLS_EXECUTE, invocation)
            except TurnStopped:  # a guard: not this call's result, the turn's end
                raise
            except Exception as exc:
                return ToolOutcome.failed(
                    f"tool call {invocation.name!r} was refused: {exc}",
                    "refused",
                    type(exc).__name__,
                )
        entry = extra.get(invocation.name) or self._entries.get(invocation.name)
        if entry is None:
            known = ", ".join(sorted({*self._entries, *extra})) or "none"
            return ToolOutcome.failed(
                f"unknown tool {invocation.name!r} (known tools: {known})", "unknown-tool"
            )
        try:
            args = decode_arguments(invocation.arguments, entry.decode)
        except msgspec.ValidationError as exc:
            return ToolOutcome.failed(
                f"invalid arguments for {invocation.name}: {exc}",
                "invalid-arguments",
                type(exc).__name__,
            )
        except msgspec.DecodeError as exc:
            return ToolOutcome.failed(
                f"arguments for {invocation.name} are not a JSON object: {exc}",
                "invalid-arguments",
                type(exc).__name__,
            )
        refusal = await self._permit(invocation, entry)
        if refusal is not None:
            return refusal
        if invocation.on_start is not None:
            invocation.on_start()
        try:
            result = await entry.run(args, invocation)
        except Exception as exc:
            logger.info("tool %r raised", invocation.name, exc_info=True)
            return ToolOutcome.failed(
                f"{invocation.name} failed: {type(exc).__name__}: {exc}",
                "raised",
                type(exc).__name__,
            )
        return result if isinstance(result, ToolOutcome) else ToolOutcome(result)

    async def _permit(self, invocation: ToolInvocation, tool: ToolEntry) -> ToolOutcome | None:
        """None if the call may run; else the refusal, as a result for the model.

        The session's mode first: a call asking to run unsandboxed is refused in
        ``read-only`` and otherwise always asked, a once answer only; a call of a
        tool confined to the mode's sandbox runs unasked in ``read-only`` and
        ``accept-edits``; otherwise ``read-only`` refuses, and ``accept-edits``
        lets edits through. Then the session's remembered "always" answers, then
        whoever the session's front end asks (or the runtime's policy). An "always"
        answer is logged (``permission/rule``), so it outlives the process. A
        sub-agent's session runs under its family's: the root's mode, and the first
        remembered answer of the session or an ancestor.
        """
        if tool.kind not in ASKS_PERMISSION:
            return None
        session = invocation.agent.session if invocation.agent is not None else None
        family = _family(session)
        mode = session_mode(session)
        view = _view(tool, invocation.arguments)
        if view.unsandboxed:
            if mode == "read-only":
                return _read_only(tool, "run unsandboxed")
            return await self._ask(invocation, tool, view, session, once=True)
        confined = MODE_ACCESS.get(mode) in tool.confined
        if confined and mode in ("read-only", "accept-edits"):
            return None
        if mode == "read-only":
            return _read_only(tool, "run")
        if mode == "accept-edits" and tool.kind != "execute":
            return None
        remembered = next(
            (s.permissions[tool.name] for s in family if tool.name in s.permissions), None
        )
        if remembered is not None:
            return None if remembered else _refused(tool.name, "always")
        return await self._ask(invocation, tool, view, session, once=False)

    async def _ask(
        self,
        invocation: ToolInvocation,
        tool: ToolEntry,
        view: ToolView,
        session: Session | None,
        *,
        once: bool,
    ) -> ToolOutcome | None:
        """Ask whether the call may run: the session's front end, else the agent's policy,
        else the runtime's. Any but the runtime's `AllowAll` (which asks no one) is a
        decision of the agent's (`Decisions`): logged before it is asked, the turn
        parked until the first answer (the asker's, or the embedder's `decide`)."""
        client = invocation.client
        agent = invocation.agent
        permissions = (
            (client.permissions if client is not None else None)
            or (agent.options.permissions if agent is not None else None)
            or self._permissions
        )
        request = PermissionRequest(
            session_id=session.id if session is not None else "",
            call_id=invocation.call_id,
            tool=tool.name,
            kind=tool.kind,
            title=view.title,
            arguments=invocation.arguments,
            once=once,
        )
        decision: str  # a `PermissionDecision`: the policy's, or an option the decision offered
        try:
            if agent is None or (type(permissions) is AllowAll and not agent.session.decisions):
                decided = await permissions.decide(request)
                decision = decided.answer if isinstance(decided, NamedAnswer) else decided
            else:
                by = client.name if client is not None and client.permissions else "policy"
                decision, _ = await agent.decisions.ask(
                    invocation.call_id,
                    "permission",
                    None if type(permissions) is Defer else partial(permissions.decide, request),
                    by,
                    tool=tool.name,
                    title=view.title,
                    arguments=invocation.arguments,
                    options=_ONCE if once else _EVERY,
                )
        except (StepFailed, TurnStopped, trio.Cancelled):
            raise
        except Exception as exc:
            return ToolOutcome.failed(
                f"{tool.name} was not run: asking permission failed: {exc}",
                "refused",
                type(exc).__name__,
            )
        if decision.endswith("_always") and session is not None and not once:
            session.append(PermissionRule(tool=tool.name, allow=decision.startswith("allow")))
        return None if decision.startswith("allow") else _refused(tool.name, "once")


#: The answers a permission offers: a once answer only (a call asked to run unsandboxed),
#: or every one.
_ONCE: Final = ("allow_once", "reject_once")
_EVERY: Final = ("allow_once", "allow_always", "reject_once", "reject_always")


def session_mode(session: Session | None) -> str:
    """The mode `session` runs under: its root session's (a sub-agent's is its family's)."""
    family = _family(session)
    return family[-1].config.get("mode", DEFAULT_MODE) if family else DEFAULT_MODE


def _read_only(tool: ToolEntry, what: str) -> ToolOutcome:
    return ToolOutcome.failed(
        f"refused: {tool.name} ({tool.kind}) cannot {what}, the session is read-only",
        "read-only",
    )


def _texts(outcome: ToolOutcome) -> Iterator[str]:
    yield outcome.content
    for diff in outcome.diffs:
        yield diff.path
        yield diff.new_text
        if diff.old_text is not None:
            yield diff.old_text


def _encodes(text: str) -> bool:
    """Whether `text` is UTF-8 as it is (no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _family(session: Session | None) -> list[Session]:
    """`session`, its parent, ..., its root (empty without a session)."""
    family = []
    while session is not None:
        family.append(session)
        session = session.parent
    return family


def _view(entry: ToolEntry, arguments: str) -> ToolView:
    if entry.view is None:
        return entry.plain
    try:
        shown = entry.view(decode_arguments(arguments, entry.decode))
    except (ValueError, TypeError):  # msgspec's errors are ValueErrors
        return entry.plain
    return msgspec.structs.replace(
        shown, kind=entry.kind, concurrent=entry.concurrent, idempotent=entry.idempotent
    )


def _refused(tool: str, how: str) -> ToolOutcome:
    return ToolOutcome.failed(f"the user refused to let {tool} run ({how})", "rejected")


def _parameters(args: type[msgspec.Struct]) -> dict[str, object]:
    """The JSON Schema of `args`, with its own definition inlined at the top."""
    (schema,), defs = msgspec.json.schema_components([args], ref_template="#/$defs/{name}")
    top = dict(defs.pop(args.__name__, schema))
    if defs:
        top["$defs"] = defs
    return top
