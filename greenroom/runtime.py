"""`open_runtime()`: the services of one greenroom, wired under its root supervisor.

Floor 7: this is where configuration enters; nothing below reads the
environment or global state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from greenroom.actors.factory import LoopFactory
from greenroom.actors.registry import AgentRegistry
from greenroom.models.base import ModelAdapter
from greenroom.models.scripted import ScriptedModel
from greenroom.session import SESSION_EVENT, SESSION_FLUSH, SessionStore
from greenroom.session.persistence import Persistence, WriteBehind
from greenroom.supervisor import Supervisor
from greenroom.supervisor.hooks import Hooks
from greenroom.tools import Tool, ToolRegistry


class Runtime:
    """The services of an open runtime.

    * ``agents``: the `AgentRegistry` (``create``/``resume`` return handles);
    * ``sessions``: the live `SessionStore`;
    * ``tools``: the `ToolRegistry` every agent's tool calls go through;
    * ``hooks``: the listener table (``agent/*``, ``session/*``, ``tools/*``);
    * ``supervisor``: the agents' supervisor, the default owner of every agent.
    """

    __slots__ = ("agents", "hooks", "sessions", "supervisor", "tools")

    def __init__(
        self,
        *,
        agents: AgentRegistry,
        sessions: SessionStore,
        tools: ToolRegistry,
        hooks: Hooks,
        supervisor: Supervisor,
    ) -> None:
        self.agents = agents
        self.sessions = sessions
        self.tools = tools
        self.hooks = hooks
        self.supervisor = supervisor


@asynccontextmanager
async def open_runtime(
    *,
    model: ModelAdapter | None = None,
    persistence: Persistence | None = None,
    tools: Iterable[Tool[Any]] = (),
    name: str = "greenroom",
) -> AsyncIterator[Runtime]:
    """Open a runtime; closing it disposes every agent it owns.

    ``model`` defaults to the echoing `ScriptedModel`. With ``persistence``,
    every session's events reach it through a `WriteBehind` (one durable
    append per turn) and `agents.resume` can load sessions back. The agents' supervisor
    stops its children in reverse start order, so agents are disposed in
    reverse creation order, each through the same path as
    `AgentHandle.dispose` (closing ``turn/end``, flush, unregister, detach).
    """
    hooks = Hooks()
    sessions = SessionStore(hooks)
    registry = AgentRegistry(hooks)
    tool_registry = ToolRegistry(hooks)
    for tool in tools:
        tool_registry.register(tool)
    if persistence is not None:
        write_behind = WriteBehind(persistence)
        hooks.on(SESSION_EVENT, write_behind.on_event)
        hooks.on_async(SESSION_FLUSH, write_behind.flush)
    async with Supervisor(name=f"{name}:agents") as supervisor:
        factory = LoopFactory(
            hooks=hooks,
            sessions=sessions,
            registry=registry,
            model=model if model is not None else ScriptedModel(),
            tools=tool_registry,
            default_owner=supervisor,
            persistence=persistence,
        )
        remove_factory = registry.set_factory(factory)
        try:
            yield Runtime(
                agents=registry,
                sessions=sessions,
                tools=tool_registry,
                hooks=hooks,
                supervisor=supervisor,
            )
        finally:
            remove_factory()
