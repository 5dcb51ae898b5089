"""`open_runtime()`: the services of one greenroom, wired under its root supervisor.

This is where configuration enters. Below it only the model adapters read the
environment, for a key or endpoint not given in code (docs/semantics.md,
"Endpoint and key"); nothing reads global state.

`Runtime` is what the block holds: ``agents`` (the factory), `plug` and `reload` of
plugins, `start` (an `AgentSpec` on a session), `history` and `list_sessions`, `decide`
and `decisions` (the decisions of live and stored sessions).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from functools import partial
from typing import Any, Protocol, TypedDict, cast, runtime_checkable

import trio

from greenroom.actors.compaction import DEFAULT_POLICY, CompactionPolicy
from greenroom.actors.decisions import (
    EMBEDDER,
    OpenDecision,
    decide_stored,
    stored_decisions,
)
from greenroom.actors.factory import AgentFactory
from greenroom.actors.launch import TakeOver
from greenroom.actors.life import AgentHandle, Owner
from greenroom.actors.registry import AgentRegistry
from greenroom.actors.spec import AgentSpec
from greenroom.actors.types import Permissions, SpawnLimits
from greenroom.errors import alone
from greenroom.guards import Guards
from greenroom.hooks import Hooks
from greenroom.models.base import ModelAdapter, open_models
from greenroom.models.prices import Prices
from greenroom.models.scripted import ScriptedModel
from greenroom.resolve import SpecResolver
from greenroom.sandbox import Sandboxes, SandboxSettings
from greenroom.session import SessionStore
from greenroom.session.history import HistoryEntry, history_of
from greenroom.session.persistence import (
    Interruption,
    Persistence,
    StoredSession,
)
from greenroom.session.persistence.urls import store_from_url
from greenroom.spill import DEFAULT_MAX_TOOL_RESULT
from greenroom.supervisor import ChildSpec, Scope, Supervisor
from greenroom.tools import Tool, ToolRegistry
from greenroom.tools.bash import BashExecutor, LocalBashExecutor
from greenroom.tools.bash.tools import release_owner
from greenroom.tools.mcp import McpHub
from greenroom.tools.plugins import Plugin, PluginContext
from greenroom.tools.typed import as_tool


class Runtime:
    """The services of an open runtime.

    * ``agents``: the `AgentFactory` (``create``/``resume`` return handles;
      ``get``/``by_session``/``list`` find live agents);
    * ``sessions``: the live `SessionStore`;
    * ``tools``: the `ToolRegistry` every agent's tool calls go through;
    * ``hooks``: the listener table (``agent/*``, ``session/*``, ``tools/*``);
    * ``persistence``: where sessions are stored between processes, or None;
    * ``models``: the model adapters by id (the first is the default);
    * ``bash``: the `BashExecutor` (background tasks outlive any plugin, not
      their session: an agent's dispose ends its session's tasks);
    * ``supervisor``: the agents' supervisor, the default owner of every agent;
    * ``plugins``: the plugins' supervisor (see `plug` and `reload`).
    """

    __slots__ = (
        "_plugged",
        "agents",
        "bash",
        "hooks",
        "models",
        "persistence",
        "plugins",
        "sessions",
        "supervisor",
        "tools",
        "workdir",
    )

    def __init__(
        self,
        *,
        agents: AgentFactory,
        sessions: SessionStore,
        tools: ToolRegistry,
        hooks: Hooks,
        models: Mapping[str, ModelAdapter],
        persistence: Persistence | None,
        bash: BashExecutor,
        supervisor: Supervisor,
        plugins: Supervisor,
        workdir: str,
    ) -> None:
        self.agents = agents
        self.sessions = sessions
        self.tools = tools
        self.hooks = hooks
        self.models = models
        self.persistence = persistence
        self.bash = bash
        self.supervisor = supervisor
        self.plugins = plugins
        #: Where a command without a directory runs, and a relative `start` cwd is from.
        self.workdir = workdir
        self._plugged: dict[str, Plugin] = {}

    async def start(
        self,
        spec: AgentSpec,
        session: str | None = None,
        *,
        cwd: str | None = None,
        additional_directories: Sequence[str] | None = None,
        owner: Owner | None = None,
        interrupted: Interruption = "close",
        take_over: TakeOver = "refuse",
        wait: float = 0.0,
        wait_for_servers: float = math.inf,
    ) -> AgentHandle:
        """Start the agent `spec` says on session `session` (a fresh ``NAME-XXXXXXXX``
        when None) and return its handle once it is live: the session is created when the
        store does not hold it, else resumed where it stopped (`interrupted`, `take_over`
        and `wait` as `agents.resume` takes them). `cwd` is where a new session works:
        relative to the runtime's `workdir`, which it defaults to. The agent's id is
        ``NAME:SESSION``; `owner` (a `Supervisor` or a nursery) outlives it (default: the
        runtime's agents' supervisor). A bad argument is a `ValueError` or `TypeError`
        raised here, naming it; what the store refuses is raised as `agents.resume` raises
        it."""
        return await self.agents.start(
            spec,
            session,
            cwd=_under(self.workdir, cwd),
            additional_directories=additional_directories,
            owner=owner,
            interrupted=interrupted,
            take_over=take_over,
            wait=wait,
            wait_for_servers=wait_for_servers,
        )

    async def list_sessions(self) -> list[StoredSession]:
        """The stored sessions, as ``greenroom sessions list`` shows them (headers,
        titles, when each last changed, who holds it live where the store says).
        Raises `RuntimeError` without persistence, and what the store raises."""
        return await self._store("list the stored sessions").list()

    async def history(self, session_id: str) -> list[HistoryEntry]:
        """A session's conversation as typed values (`greenroom.session.history`): the
        live session's log if it is live here, else the stored one (read as
        ``greenroom sessions show`` reads it: repaired in memory, never written; safe on
        a session live elsewhere). Raises `SessionNotFound` for an id the store does not
        hold, `RuntimeError` without persistence for a session not live here."""
        live = self.sessions.get(session_id)
        if live is not None:
            return history_of(live.events)
        _, events = await self._store(f"read session {session_id!r}").load(session_id)
        return history_of(events)

    async def decide(
        self, session_id: str, decision_id: str, answer: str, *, by: str = EMBEDDER
    ) -> None:
        """Answer decision `decision_id` of session `session_id` (a permission with one of
        its options, a question with text), live or not. The first answer wins.

        Live here: given to its agent (`Agent.decide`). Else the stored log is read
        (never written) to check the decision is open and offers `answer`, and the
        answer is kept beside the log (`Persistence.put_answer`): the session's next
        holder logs it as ``decision/made`` and carries the parked turn on; its live
        holder on another node is told at once (PostgreSQL), one in another process of
        a file store learns it at its next start. Raises `DecisionRefused` for an
        unknown or void decision, an answer not offered, or one answered already
        (naming who answered first, whichever process or node did); `SessionNotFound`
        for a session the store does not hold; `RuntimeError` without persistence."""
        agent = self.agents.by_session(session_id)
        if agent is not None:
            agent.decide(decision_id, answer, by)
            return
        store = self._store(f"answer decision {decision_id!r} of session {session_id!r}")
        await decide_stored(store, session_id, decision_id, answer, by)

    async def decisions(self) -> list[OpenDecision]:
        """The open decisions of every session live here or stored, oldest session first
        within each: what a person has to answer (`decide`). A decision answered while
        its session was stored, and not yet taken by a holder, is not listed. Reads each
        stored session's log (as ``greenroom sessions show`` does): its cost grows with
        the store's size."""
        found: list[OpenDecision] = []
        live = set()
        for session in self.sessions.list():
            live.add(session.id)
            found += [OpenDecision(session.id, r) for r in session.logged_decisions()]
        if self.persistence is None:
            return found
        return found + await stored_decisions(self.persistence, live)

    def _store(self, doing: str) -> Persistence:
        if self.persistence is None:
            raise RuntimeError(
                f"cannot {doing}: no session persistence is configured"
                " (pass persistence= to open_runtime)"
            )
        return self.persistence

    async def plug(self, name: str, plugin: Plugin) -> list[str]:
        """Run `plugin` as a supervised child named `name`; returns the names of the tools it
        registered.

        What it registers through its `PluginContext` is removed when it stops.
        Raises `ValueError` if a plugin of that name runs already.
        """
        spec = ChildSpec(name, _PluginTask(self, name, plugin), restart="temporary")
        registered = cast(list[str], await self.plugins.start_child(spec))
        self._plugged[name] = plugin
        return registered

    async def reload(self, name: str) -> None:
        """Stop plugin `name`, re-import its module (``importlib.reload``), start it again."""
        try:
            plugin = self._plugged[name]
        except KeyError:
            raise KeyError(f"no plugin named {name!r} is plugged") from None
        await self.plugins.stop_child(name)
        del self._plugged[name]
        module = importlib.reload(sys.modules[plugin.__module__])
        await self.plug(name, getattr(module, plugin.__qualname__))


@runtime_checkable
class _Connected(Protocol):
    """A store that holds connections (SQLite's, PostgreSQL's): `close` lets them go."""

    def close(self) -> None: ...


def _under(workdir: str, cwd: str | None) -> str:
    """`cwd` from `workdir` (itself for None): the absolute path a session works in."""
    if cwd is not None and not isinstance(cwd, str):
        raise TypeError(f"start(): cwd must be a path (str), got {type(cwd).__name__}")
    return os.path.normpath(os.path.join(workdir, cwd or "."))


class _PluginTask:
    """A plugin's life as a supervised child: set up, wait, then undo its registrations."""

    __slots__ = ("_name", "_plugin", "_runtime")

    def __init__(self, runtime: Runtime, name: str, plugin: Plugin) -> None:
        self._runtime = runtime
        self._name = name
        self._plugin = plugin

    async def __call__(self, *, task_status: trio.TaskStatus[list[str]]) -> None:
        runtime = self._runtime
        scope = Scope(f"plugin {self._name!r}")
        try:
            context = PluginContext(
                self._name,
                scope=scope,
                tools=runtime.tools,
                hooks=runtime.hooks,
                agents=runtime.agents,
                bash=runtime.bash,
            )
            ready = self._plugin(context)
            if ready is not None:
                await ready
            task_status.started(context.registered)
            await trio.sleep_forever()
        finally:
            await scope.close()


class RuntimeOptions(TypedDict, total=False):
    """`open_runtime`'s options, as the other hosts take them (`greenroom.blocking_runtime`,
    `greenroom.aio.open_runtime`): mypy checks each against `open_runtime`'s signature."""

    model: ModelAdapter | None
    models: Mapping[str, ModelAdapter] | None
    persistence: Persistence | None
    store: str | None
    permissions: Permissions | None
    spawn_limits: SpawnLimits | None
    tools: Iterable[Tool[Any] | Callable[..., Any]]
    workdir: str | None
    max_tool_result: int
    compaction: CompactionPolicy
    prices: Prices | None
    sandbox: SandboxSettings | None
    name: str


@asynccontextmanager
async def open_runtime(
    *,
    model: ModelAdapter | None = None,
    models: Mapping[str, ModelAdapter] | None = None,
    persistence: Persistence | None = None,
    store: str | None = None,
    permissions: Permissions | None = None,
    spawn_limits: SpawnLimits | None = None,
    tools: Iterable[Tool[Any] | Callable[..., Any]] = (),
    workdir: str | None = None,
    max_tool_result: int = DEFAULT_MAX_TOOL_RESULT,
    compaction: CompactionPolicy = DEFAULT_POLICY,
    prices: Prices | None = None,
    sandbox: SandboxSettings | None = None,
    name: str = "greenroom",
) -> AsyncIterator[Runtime]:
    """Open a runtime; closing it disposes every agent it owns.

    ``model`` defaults to the echoing `ScriptedModel`; ``models`` gives several,
    by id, the first the default, for a session to choose from (its ``model``
    setting). ``permissions`` decides whether a tool that edits or executes may
    run when the session's front end does not ask anyone (default: it may).
    ``spawn_limits`` bound agent teams (`AgentHandle.spawn`, the ``task`` tool):
    how deep children nest and how many live children one parent may have.
    ``compaction`` says when an agent's history is compacted and how much recent
    context stays verbatim, unless its `AgentOptions.compaction` says otherwise.
    ``prices`` is the price table each step's cost is reckoned by (`Prices`; default: the
    one greenroom ships, `greenroom.models.prices.shipped_prices`; a file's rows over it:
    ``shipped_prices() | Prices.read(path)``).
    With ``persistence``,
    every session's events go to its sink over it (one durable append per
    turn) and `agents.resume` can load sessions back; ``store`` is the same by
    URL, as ``--store`` takes it (``"jsonl:DIR"``, ``"sqlite:PATH"``,
    ``"postgresql://..."``; a bad one is a `StoreError` naming it), the store
    then the runtime's to close. The agents' supervisor
    stops its children in reverse start order, so agents are disposed in
    reverse creation order, each through the same path as
    `AgentHandle.dispose` (closing ``turn/end``, flush, its session's bash
    tasks ended, unregister, detach); then the plugins stop; then the bash
    executor kills and reaps whatever is left; last, the model adapters' pooled
    connections close (opened lazily, reused by every step, turn and session of
    the runtime: `greenroom.models.base.open_models`). ``workdir`` is where a bash
    command without one runs (default: the current directory).
    ``max_tool_result`` is the most characters of any text of a tool's result
    the log and the model get (default 100,000; the rest is cut with a marker
    naming a spill file that holds it all; the spill files are removed when
    the runtime closes); not a positive int: `ValueError`. ``tools`` are
    registered for every agent: `Tool`s, and functions decorated with
    `greenroom.tool`; anything else (a plain function, a plugin) raises
    `TypeError` saying what a tool is, before anything starts. ``sandbox``: what the
    sandbox of its commands and MCP stdio servers lets them write, and each session's
    process and memory limits (`greenroom.sandbox.SandboxSettings`; what the kernel
    enforces is `Runtime.bash.sandboxes.protections`, and a warning is logged when it
    offers nothing).

    An exception raised in the body comes out as itself, not wrapped in the
    groups the runtime's nurseries make (``except ValueError:`` around the
    block catches it, and so does ``except*``); a group comes out only where two
    things failed at once.
    """
    hooks = Hooks()
    sessions = SessionStore(hooks)
    tool_registry = ToolRegistry(hooks, permissions, max_tool_result=max_tool_result)
    if models is None:
        models = {"default": model if model is not None else ScriptedModel()}
    elif model is not None or not models:
        raise ValueError("give open_runtime either model= or a non-empty models=, not both")
    for tool in tools:
        tool_registry.register(as_tool(tool))
    if store is not None:
        if persistence is not None:
            raise ValueError("give open_runtime either persistence= or store=, not both")
        persistence = await trio.to_thread.run_sync(
            partial(store_from_url, store, what="open_runtime(store=...)")
        )
        owned = persistence
    else:
        owned = None
    try:
        # The nesting is the teardown order: agents, then plugins, then bash tasks, then the
        # sandboxes' launcher and cgroups, then the spill files of cut tool results.
        runtime: Runtime | None = None

        async def plug(name: str, plugin: Plugin) -> list[str]:
            assert runtime is not None  # a spec starts once the runtime is open
            return await runtime.plug(name, plugin)

        async with (
            open_models(models.values()),  # closed last: the model adapters' pooled connections
            SpecResolver(models, tool_registry, plug) as resolver,  # and those specs named
            aclosing(tool_registry),
            Sandboxes(sandbox) as sandboxes,
            LocalBashExecutor(workdir or os.getcwd(), sandboxes=sandboxes) as bash,
            Supervisor(name=f"{name}:plugins") as plugins,
            Supervisor(name=f"{name}:agents") as supervisor,
        ):
            agents = AgentFactory(
                hooks=hooks,
                sessions=sessions,
                registry=AgentRegistry(hooks),
                models=models,
                tools=tool_registry,
                default_owner=supervisor,
                persistence=persistence,
                release_owned=partial(release_owner, bash),
                servers=McpHub(tool_registry, hooks, sandboxes),
                limits=spawn_limits,
                compaction=compaction,
                prices=prices,
                watch_guards=Guards(hooks).watch,
                resolver=resolver,
            )
            runtime = Runtime(
                agents=agents,
                sessions=sessions,
                tools=tool_registry,
                hooks=hooks,
                models=models,
                persistence=persistence,
                bash=bash,
                supervisor=supervisor,
                plugins=plugins,
                workdir=workdir or os.getcwd(),
            )
            yield runtime
    except BaseExceptionGroup as group:  # a nursery's group of one: the error itself
        error = alone(group)
        if error is None:
            raise
        raise error from None
    finally:
        if isinstance(owned, _Connected):  # the store the URL made: after every agent's log
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(owned.close)
