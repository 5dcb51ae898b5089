"""`AgentRegistry` (find live agents), `AgentHandle` (own one), `AgentFactory` (make one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from greenroom.actors.events import AGENT_CREATED, AGENT_DISPOSED
from greenroom.actors.loop import LoopAgent
from greenroom.actors.types import Agent, AgentOptions
from greenroom.supervisor import Supervisor
from greenroom.supervisor.hooks import Hooks

#: Whom an agent must not outlive: a supervisor (it becomes a temporary child) or a nursery.
Owner = Supervisor | trio.Nursery


class AgentIdInUse(ValueError):
    """An agent id is registered, or reserved by a create or resume in flight."""


class AgentHandle:
    """The capability to tear down exactly one agent.

    `dispose` stops the agent's loop (a turn in flight ends ``disposed``, its
    closing ``turn/end`` and flush run shielded), then waits for the agent's
    task to exit, which is after it was unregistered and its session left the
    store, in that order. It is memoised: every caller, concurrent or later,
    awaits the same teardown. Closing the agent's owner takes the same path.
    """

    __slots__ = ("agent",)

    def __init__(self, agent: LoopAgent) -> None:
        self.agent = agent

    def __repr__(self) -> str:
        return f"<AgentHandle {self.agent.id!r}>"

    async def dispose(self) -> None:
        self.agent._stop()
        await self.agent._exited.wait()


class AgentFactory(Protocol):
    """Makes, starts and registers agents: what `AgentRegistry.create`/`resume` call."""

    async def create(
        self,
        *,
        agent_id: str,
        session_id: str,
        cwd: str | None = None,
        options: AgentOptions | None = None,
        owner: Owner | None = None,
    ) -> AgentHandle: ...

    async def resume(
        self,
        *,
        agent_id: str,
        session_id: str,
        options: AgentOptions | None = None,
        owner: Owner | None = None,
    ) -> AgentHandle: ...


class AgentRegistry:
    """The live agents by id, and the factory slot.

    `get` and `list` hand out bare agents; only `create`/`resume` hand out
    the `AgentHandle` that can dispose one.
    """

    __slots__ = ("_agents", "_factory", "_hooks", "_reserved")

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._agents: dict[str, Agent] = {}
        self._reserved: set[str] = set()
        self._factory: AgentFactory | None = None

    def get(self, agent_id: str) -> Agent | None:
        return self._agents.get(agent_id)

    def list(self) -> list[Agent]:
        return list(self._agents.values())

    def register(self, agent: Agent) -> Callable[[], None]:
        """Record a live agent and emit ``agent/created``; returns the unregister.

        The unregister removes it, then emits ``agent/disposed`` (a raising
        listener is contained, so it never skips what the owner does next).
        """
        if agent.id in self._agents:
            raise AgentIdInUse(f"agent {agent.id!r} is already registered")
        self._agents[agent.id] = agent
        self._hooks.emit(AGENT_CREATED, agent)
        return lambda: self._unregister(agent)

    def _unregister(self, agent: Agent) -> None:
        if self._agents.get(agent.id) is agent:
            del self._agents[agent.id]
            self._hooks.emit(AGENT_DISPOSED, agent)

    def registered(self, agent: Agent) -> _Registered:
        """``with registry.registered(agent):`` registered for the body, unregistered after."""
        return _Registered(self, agent)

    def reserve(self, agent_id: str) -> Callable[[], None]:
        """Hold `agent_id` across an async create; returns the release."""
        if not isinstance(agent_id, str) or not agent_id:
            raise ValueError(f"an agent id must be a non-empty string, got {agent_id!r}")
        if agent_id in self._agents:
            raise AgentIdInUse(f"agent {agent_id!r} is already registered")
        if agent_id in self._reserved:
            raise AgentIdInUse(f"agent {agent_id!r} is being created or resumed already")
        self._reserved.add(agent_id)
        return lambda: self._reserved.discard(agent_id)

    def set_factory(self, factory: AgentFactory) -> Callable[[], None]:
        """Fill the factory slot; a second factory raises. Returns the remover."""
        if self._factory is not None:
            raise RuntimeError("an agent factory is already set")
        self._factory = factory

        def remove() -> None:
            if self._factory is factory:
                self._factory = None

        return remove

    async def create(
        self,
        *,
        agent_id: str,
        session_id: str,
        cwd: str | None = None,
        options: AgentOptions | None = None,
        owner: Owner | None = None,
    ) -> AgentHandle:
        """Create, start and register an agent on a new session; returns its handle."""
        return await self._require_factory().create(
            agent_id=agent_id, session_id=session_id, cwd=cwd, options=options, owner=owner
        )

    async def resume(
        self,
        *,
        agent_id: str,
        session_id: str,
        options: AgentOptions | None = None,
        owner: Owner | None = None,
    ) -> AgentHandle:
        """Load a persisted session and start an agent on it; returns its handle."""
        return await self._require_factory().resume(
            agent_id=agent_id, session_id=session_id, options=options, owner=owner
        )

    def _require_factory(self) -> AgentFactory:
        if self._factory is None:
            raise RuntimeError("no agent factory is set (open the runtime with open_runtime())")
        return self._factory


class _Registered:
    __slots__ = ("_agent", "_registry")

    def __init__(self, registry: AgentRegistry, agent: Agent) -> None:
        self._registry = registry
        self._agent = agent

    def __enter__(self) -> Agent:
        self._registry.register(self._agent)
        return self._agent

    def __exit__(self, *exc_info: object) -> None:
        self._registry._unregister(self._agent)
