"""`AgentRegistry`: the live agents, by agent id and by session id. A plain index."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from greenroom.actors.events import AGENT_CREATED, AGENT_DISPOSED
from greenroom.actors.types import Agent
from greenroom.hooks import Hooks


class AgentIdInUse(ValueError):
    """An agent id is registered, or reserved by a create or resume in flight."""


class AgentRegistry:
    """Who is live: `get`, `by_session` and `list` hand out bare agents.

    An agent is in the registry from its `register` to its `unregister` (its
    life nests them); `reserved` holds an id across an async create so that
    two racing creates cannot both publish it. Creating agents is the factory's job
    (`greenroom.actors.factory.AgentFactory`); disposing one is its handle's.
    """

    __slots__ = ("_agents", "_by_session", "_hooks", "_reserved")

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._agents: dict[str, Agent] = {}
        self._by_session: dict[str, Agent] = {}
        self._reserved: set[str] = set()

    def get(self, agent_id: str) -> Agent | None:
        return self._agents.get(agent_id)

    def by_session(self, session_id: str) -> Agent | None:
        """The live agent on `session_id` (a session is live in one agent at most)."""
        return self._by_session.get(session_id)

    def list(self) -> list[Agent]:
        return list(self._agents.values())

    @contextmanager
    def reserved(self, agent_id: str) -> Iterator[None]:
        """Hold `agent_id` for the body; raises `AgentIdInUse` if it is taken."""
        if not isinstance(agent_id, str) or not agent_id:
            raise ValueError(f"an agent id must be a non-empty string, got {agent_id!r}")
        if agent_id in self._agents:
            raise AgentIdInUse(f"agent {agent_id!r} is already registered")
        if agent_id in self._reserved:
            raise AgentIdInUse(f"agent {agent_id!r} is being created or resumed already")
        self._reserved.add(agent_id)
        try:
            yield
        finally:
            self._reserved.discard(agent_id)

    def register(self, agent: Agent) -> None:
        """Add a live agent and emit ``agent/created``; `unregister` undoes it.

        Raises `AgentIdInUse` for an id that is registered. A raising listener
        is contained (`Hooks.emit`), so it never undoes the registration.
        """
        if agent.id in self._agents:
            raise AgentIdInUse(f"agent {agent.id!r} is already registered")
        self._agents[agent.id] = agent
        self._by_session[agent.session.id] = agent
        self._hooks.emit(AGENT_CREATED, agent)

    def unregister(self, agent: Agent) -> None:
        """Remove `agent` and emit ``agent/disposed`` (a raising listener is contained)."""
        del self._agents[agent.id]
        del self._by_session[agent.session.id]
        self._hooks.emit(AGENT_DISPOSED, agent)
