"""The MCP servers a session owns: supervised children nested in its agent's life.

`McpHub` (the runtime's `ServerHub`) opens a `SessionMcp` per session that
was given servers. Its life calls `SessionMcp.start` before the agent goes
live and `SessionMcp.stop` after the loop stopped, on every path::

    SessionMcp.start → a nursery of its own, held until stop
      one keeper task per server, all at once:
        Supervisor "mcp:<session>:<server>"   (restarts with backoff, intensity-limited)
          the server's child: one McpConnection per incarnation

`stop` cancels the nursery: every server's supervisor stops its child at
once (beside the others), and its transport ends the server: for a stdio
server greenroom's own (`client._stdio`: stdin closed, 2 s, SIGTERM to its
process group, 2 s, SIGKILL, then whatever carries its process mark); for
an HTTP server the SDK's streamable HTTP client closes its session. The servers' tools
are offered under ``mcp__<server>__<tool>`` while their server is ready, and
every call goes through the runtime's `ToolRegistry` (its ``tools/execute``
waterfall, its permission gate and its bound on results) like any other tool.

`ServerSlot` is one server of a session (its supervisor, its offer, its calls); its tools
are named by `tool_name`; what becomes of it is told as ``mcp/status``, its prompts as
``mcp/prompts``.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import msgspec
import trio

from greenroom.actors.events import AGENT_ERROR
from greenroom.actors.types import (
    MODE_ACCESS,
    Agent,
    ToolExecutor,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.backoff import Backoff
from greenroom.hooks import EmitHook, Hooks
from greenroom.protocol.events import ToolKind
from greenroom.protocol.mcp import (
    McpServer,
    McpServerError,
    McpState,
    McpStatus,
    McpStdioServer,
    safe_name,
)
from greenroom.protocol.model import ToolSchema
from greenroom.sandbox import Sandbox, Sandboxes
from greenroom.supervisor import ChildSpec, Supervisor, SupervisorEscalation
from greenroom.supervisor.supervisor import describe_error
from greenroom.tools.registry import NO_TOOLS, ToolEntry, ToolRegistry, session_mode

if TYPE_CHECKING:
    import mcp_types

    from greenroom.tools.mcp.client import McpConnection

logger = logging.getLogger("greenroom.mcp")

#: Every change of a session's server: (the session's agent, what became of the server).
MCP_STATUS: EmitHook[[Agent, McpStatus]] = EmitHook("mcp/status")


class McpPromptArgument(msgspec.Struct, frozen=True, gc=False):
    name: str
    description: str = ""
    required: bool = False


class McpPrompt(msgspec.Struct, frozen=True, gc=False):
    """One prompt a server offers (``prompts/list``): its name, what it is, its arguments."""

    name: str
    description: str = ""
    arguments: list[McpPromptArgument] = []


class McpPrompts(NamedTuple):
    """A server's prompts now (none while it is not ready), and how to get one: ``get(name,
    arguments)`` is the texts of its messages (`McpServerError` naming the server if it
    cannot)."""

    server: str
    prompts: list[McpPrompt]
    get: Callable[[str, dict[str, str]], Awaitable[list[str]]]


#: A session's server offers other prompts (ready, listed again, or gone): (its agent, them).
MCP_PROMPTS: EmitHook[[Agent, McpPrompts]] = EmitHook("mcp/prompts")

#: The time a server's child has to stop (the SDK's transport ends it within ~4.5 s).
MCP_GRACE: Final = 5.0
#: Restarts allowed per server within `MCP_PERIOD` seconds before it is given up.
MCP_INTENSITY: Final = 3
MCP_PERIOD: Final = 60.0
MCP_BACKOFF: Final = Backoff(initial=0.5, maximum=10.0)

_MAX_NAME: Final = 64  # what model APIs accept for a tool's name
_object_decoder: msgspec.json.Decoder[dict[str, Any]] = msgspec.json.Decoder(dict[str, Any])


class McpHub:
    """Opens the `SessionMcp` of each session given servers; one per runtime. Its stdio
    servers run in `sandboxes` (the runtime's)."""

    __slots__ = ("_hooks", "_registry", "_sandboxes")

    def __init__(self, registry: ToolRegistry, hooks: Hooks, sandboxes: Sandboxes) -> None:
        self._registry = registry
        self._hooks = hooks
        self._sandboxes = sandboxes

    def open(
        self,
        session_id: str,
        cwd: str | None,
        servers: Sequence[McpServer],
        tools: ToolExecutor,
        wait: float = math.inf,
    ) -> SessionMcp:
        return SessionMcp(
            self._registry, tools, self._hooks, self._sandboxes, session_id, cwd, servers, wait
        )


class SessionMcp:
    """One session's servers, and the tools its agent runs: theirs, then the agent's.

    A `ToolExecutor` (``tools`` is itself): `schemas` lists the agent's tools
    (``base``) and those of every ready server; `execute` runs a server's
    tool through the registry's gate, any other through ``base``. Not
    reusable: started once, stopped once.
    """

    __slots__ = (
        "_base",
        "_entries",
        "_hooks",
        "_nursery",
        "_nursery_manager",
        "_registry",
        "_schemas",
        "_schemas_of",
        "_wait",
        "sandboxes",
        "session_id",
        "slots",
    )

    def __init__(
        self,
        registry: ToolRegistry,
        base: ToolExecutor,
        hooks: Hooks,
        sandboxes: Sandboxes,
        session_id: str,
        cwd: str | None,
        servers: Sequence[McpServer],
        wait: float = math.inf,
    ) -> None:
        self._registry = registry
        self._base = base
        self._hooks = hooks
        self._wait = wait
        self.sandboxes = sandboxes
        self.session_id = session_id
        self.slots = [ServerSlot(self, spec, cwd) for spec in servers]
        self._entries: Mapping[str, ToolEntry] = NO_TOOLS
        self._schemas: list[ToolSchema] = []
        self._schemas_of: list[ToolSchema] | None = None  # the registry list they extend
        self._nursery_manager: AbstractAsyncContextManager[trio.Nursery] = trio.open_nursery()
        self._nursery: trio.Nursery | None = None

    # -- SessionServers --------------------------------------------------------

    @property
    def tools(self) -> SessionMcp:
        return self

    async def start(self, agent: Agent) -> None:
        """Start every server at once; return when each is ready or failed its first start,
        or once the wait is over: a server still starting then is said to be slow and goes
        on starting, its tools offered once it is ready."""
        self._nursery = await self._nursery_manager.__aenter__()
        for slot in self.slots:
            self._nursery.start_soon(slot.keep, agent, name=f"mcp:{slot.spec.name}")
        with trio.move_on_after(self._wait):
            for slot in self.slots:
                await slot.settled.wait()
        for slot in self.slots:
            if not slot.settled.is_set():
                slot.slow(agent, self._wait)

    async def stop(self) -> None:
        """Stop every server (at once, each within its grace). Shields itself; idempotent.

        Called by the task that called `start`, with the nursery `start` opened
        as its innermost scope (the life nests it so).
        """
        nursery, self._nursery = self._nursery, None
        if nursery is None:
            return
        # The nursery's own scope is shielded, not a new one around its exit: a
        # scope entered after the nursery would have to be left before it.
        nursery.cancel_scope.shield = True
        nursery.cancel_scope.cancel(reason=f"session {self.session_id!r} ended")
        await self._nursery_manager.__aexit__(None, None, None)

    # -- ToolExecutor ----------------------------------------------------------

    def schemas(self) -> list[ToolSchema]:
        base = self._base.schemas()
        if base is not self._schemas_of:
            self._schemas_of = base
            self._schemas = [*base, *(entry.schema for entry in self._entries.values())]
        return self._schemas

    def describe(self, name: str, arguments: str) -> ToolView:
        if name in self._entries:
            return self._registry.describe(name, arguments, self._entries)
        return self._base.describe(name, arguments)

    async def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        if invocation.name in self._entries:
            return await self._registry.execute(invocation, self._entries)
        return await self._base.execute(invocation)

    # -- what the slots report ---------------------------------------------------

    def offered(self) -> None:
        """A server's tools changed: rebuild the tools offered."""
        entries: dict[str, ToolEntry] = {}
        for slot in self.slots:
            entries.update(slot.entries)
        self._entries = entries
        self._schemas_of = None

    def tell_prompts(self, agent: Agent, prompts: McpPrompts) -> None:
        self._hooks.emit(MCP_PROMPTS, agent, prompts)

    def report(self, agent: Agent, status: McpStatus) -> None:
        log = logger.info if status.state == "ready" else logger.warning
        log("session %r: %s", self.session_id, status.describe())
        self._hooks.emit(MCP_STATUS, agent, status)
        if status.state in ("failed", "gave-up"):
            self._hooks.emit(
                AGENT_ERROR, agent, 0, 0, McpServerError(status.server, status.describe())
            )


class ServerSlot:
    """One server of a session, across its incarnations: its state and the tools it offers."""

    __slots__ = (
        "_agent",
        "_connection",
        "_cwd",
        "_failures",
        "_owner",
        "_prompts",
        "_slow",
        "entries",
        "settled",
        "spec",
        "state",
    )

    def __init__(self, owner: SessionMcp, spec: McpServer, cwd: str | None) -> None:
        self._owner = owner
        self.spec = spec
        self._cwd = cwd
        self.state: McpState = "starting"
        self.entries: dict[str, ToolEntry] = {}
        self.settled = trio.Event()  # the first start is over: ready, or failed
        self._connection: McpConnection | None = None
        self._agent: Agent | None = None
        self._failures = 0
        self._prompts: list[McpPrompt] = []
        self._slow = False  # said to be slow: its readiness is said too

    async def keep(self, agent: Agent) -> None:
        """The server under its own supervisor until cancelled, or until it gives up."""
        self._agent = agent
        name = self.spec.name
        child = ChildSpec(name, self._incarnation, restart="permanent", shutdown=MCP_GRACE)
        try:
            async with Supervisor(
                [child],
                name=f"mcp:{self._owner.session_id}:{name}",
                intensity=MCP_INTENSITY,
                period=MCP_PERIOD,
                backoff=MCP_BACKOFF,
            ):
                await trio.sleep_forever()
        except SupervisorEscalation as exc:
            self._set("gave-up", exc.exits[-1].exception or "it kept failing")
        finally:
            self.settled.set()

    async def _incarnation(self, *, task_status: trio.TaskStatus[None]) -> None:
        from greenroom.tools.mcp.client import McpConnection  # the SDK, on first use

        task_status.started()
        assert self._agent is not None
        connection = McpConnection(
            self.spec, self._cwd, self._owner.sandboxes, self._sandbox(self._agent)
        )
        try:
            await connection.run(self._offer)
        except Exception as exc:
            self._failures += 1
            self._set("failed", describe_error(exc))
            raise
        finally:
            self._connection = None
            if self.entries:
                self.entries = {}
                self._owner.offered()
            self._offer_prompts([])
            self.settled.set()

    def _sandbox(self, agent: Agent) -> Sandbox:
        """The sandbox of a start: the spec's, else its session's mode's now."""
        session = agent.session
        spec = self.spec
        chosen = spec.sandbox if isinstance(spec, McpStdioServer) else None
        access = chosen or MODE_ACCESS[session_mode(session)]
        header = session.header
        roots = (*([header.cwd] if header.cwd else []), *header.additional_directories)
        return Sandbox(access, session.id, tuple(roots))

    def _offer(self, connection: McpConnection) -> None:
        entries = self._entries(connection.tools)
        # Reported only when something changed: a server may list its tools again and
        # again (``tools/list_changed`` at will) without anything new to tell.
        changed = self.state != "ready" or entries.keys() != self.entries.keys()
        self._connection = connection
        self.entries = entries
        self._owner.offered()
        self._offer_prompts([_prompt(p) for p in connection.prompts])
        if changed:
            again = self._failures > 0 and self.state != "ready"
            late = self._slow and self.state != "ready"
            self._slow = False
            why = "back after a restart" if again else "after a slow start" if late else ""
            self._set("ready", why, len(entries))
        self.settled.set()

    def slow(self, agent: Agent, waited: float) -> None:
        """Its session went live without it: say so (it goes on starting). Its keeper may
        not have run yet (a wait of 0)."""
        self._agent = agent
        self._slow = True
        self._set("starting", f"not ready after {waited:g} s; it goes on starting")

    def _offer_prompts(self, prompts: list[McpPrompt]) -> None:
        """Tell the session's front end of the server's prompts, when they changed."""
        if prompts == self._prompts:
            return
        self._prompts = prompts
        assert self._agent is not None
        self._owner.tell_prompts(self._agent, McpPrompts(self.spec.name, prompts, self.prompt))

    async def prompt(self, name: str, arguments: dict[str, str]) -> list[str]:
        connection = self._connection
        if connection is None:
            raise McpServerError(self.spec.name, f"is not running ({self.state})")
        return await connection.prompt(name, arguments)

    def _set(self, state: McpState, message: str, tools: int = 0) -> None:
        previous, self.state = self.state, state
        assert self._agent is not None
        status = McpStatus(self.spec.name, state, message, tools, previous)
        self._owner.report(self._agent, status)

    def _entries(self, tools: list[mcp_types.Tool]) -> dict[str, ToolEntry]:
        entries: dict[str, ToolEntry] = {}
        for tool in tools:
            name = tool_name(self.spec.name, tool.name)
            if name in entries:
                logger.warning(
                    "MCP server %r: tool %r is offered as %r, like another; dropped",
                    self.spec.name,
                    tool.name,
                    name,
                )
                continue
            title = f"{tool.title or tool.name} ({self.spec.name})"
            view = ToolView(kind=_kind(tool), title=title)
            entries[name] = ToolEntry(
                ToolSchema(name, tool.description or title, dict(tool.input_schema)),
                _object_decoder.decode,
                _Call(self, tool.name),
                view.kind,
                _shown(view),
            )
        return entries

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        connection = self._connection
        if connection is None:
            await trio.lowlevel.checkpoint()
            return ToolOutcome.failed(
                f"MCP server {self.spec.name!r} is not running ({self.state})",
                "mcp-unavailable",
                "McpError",
            )
        return await connection.call(tool, arguments)


class _Call:
    """The run of one server tool's `ToolEntry`."""

    __slots__ = ("_slot", "_tool")

    def __init__(self, slot: ServerSlot, tool: str) -> None:
        self._slot = slot
        self._tool = tool

    async def __call__(self, arguments: dict[str, Any], invocation: ToolInvocation) -> ToolOutcome:
        return await self._slot.call(self._tool, arguments)


def _shown(view: ToolView) -> Callable[[object], ToolView]:
    return lambda _arguments: view


def _prompt(prompt: mcp_types.Prompt) -> McpPrompt:
    arguments = [
        McpPromptArgument(a.name, a.description or "", bool(a.required))
        for a in prompt.arguments or ()
    ]
    return McpPrompt(prompt.name, prompt.description or prompt.title or "", arguments)


def tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>``, with characters model APIs refuse replaced by ``_``;
    past 64 characters, cut and ended by a hash of the whole, so it stays stable."""
    name = f"mcp__{safe_name(server)}__{safe_name(tool)}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}_{digest}"


def _kind(tool: mcp_types.Tool) -> ToolKind:
    """What a tool does, from its annotations (hints the user's chosen server gives).

    Read-only: ``read`` (``fetch`` unless it says it stays in a closed world), never asked.
    Declared not destructive: ``edit``, asked unless the mode accepts edits.
    Otherwise (MCP's default is "may destroy"): ``execute``, always asked.
    """
    hints = tool.annotations
    if hints is not None and hints.read_only_hint:
        return "read" if hints.open_world_hint is False else "fetch"
    if hints is not None and hints.destructive_hint is False:
        return "edit"
    return "execute"
