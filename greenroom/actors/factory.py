"""`LoopFactory`: how a `LoopAgent` is made, started and owned.

`AgentTask` is the one place that says an agent's teardown order, and it
says it with nesting::

    session entered in the store        (detached last)
      agent registered                  (unregistered second)
        agent.live(): the loop          (stopped first; closing turn/end + flush shielded)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

from greenroom.actors.loop import CLOSING_GRACE, LoopAgent
from greenroom.actors.registry import AgentHandle, AgentRegistry, Owner
from greenroom.actors.types import AgentOptions, ToolExecutor
from greenroom.models.base import ModelAdapter
from greenroom.session import Session, SessionStore
from greenroom.session.persistence import Persistence
from greenroom.supervisor import ChildSpec, Supervisor
from greenroom.supervisor.hooks import Hooks


class AgentTask:
    """One agent's whole life as one task (a supervisor child's start, or a nursery's).

    `__call__` is the one place that says the teardown order, by nesting.
    """

    __slots__ = ("_handle", "_registry", "_sessions")

    def __init__(self, handle: AgentHandle, sessions: SessionStore, registry: AgentRegistry):
        self._handle = handle
        self._sessions = sessions
        self._registry = registry

    async def __call__(self, *, task_status: trio.TaskStatus[AgentHandle]) -> None:
        agent = self._handle.agent
        try:
            with self._sessions.entered(agent.session), self._registry.registered(agent):
                await agent.live(task_status, self._handle)
        finally:
            agent._exited.set()


class LoopFactory:
    """Creates `LoopAgent`s under an owner (default: the runtime's agent supervisor)."""

    def __init__(
        self,
        *,
        hooks: Hooks,
        sessions: SessionStore,
        registry: AgentRegistry,
        model: ModelAdapter,
        tools: ToolExecutor,
        default_owner: Owner,
        persistence: Persistence | None = None,
    ) -> None:
        self._hooks = hooks
        self._sessions = sessions
        self._registry = registry
        self._model = model
        self._tools = tools
        self._default_owner = default_owner
        self._persistence = persistence

    async def create(
        self,
        *,
        agent_id: str,
        session_id: str,
        cwd: str | None = None,
        options: AgentOptions | None = None,
        owner: Owner | None = None,
    ) -> AgentHandle:
        with self._reserved(agent_id, session_id):
            session = self._sessions.prepare(session_id, cwd=cwd)
            return await self._start(agent_id, session, options, owner)

    async def resume(
        self,
        *,
        agent_id: str,
        session_id: str,
        options: AgentOptions | None = None,
        owner: Owner | None = None,
    ) -> AgentHandle:
        if self._persistence is None:
            raise RuntimeError(
                f"cannot resume session {session_id!r}: no session persistence is configured"
                " (pass persistence= to open_runtime)"
            )
        with self._reserved(agent_id, session_id):
            header, events = await self._persistence.load(session_id)
            session = self._sessions.prepare(
                session_id,
                seed=events,
                cwd=header.cwd,
                parent_session=header.parent_session,
                created_at=header.created_at,
            )
            return await self._start(agent_id, session, options, owner)

    @contextmanager
    def _reserved(self, agent_id: str, session_id: str) -> Iterator[None]:
        """Hold both ids until the agent is published (or its start failed).

        A duplicate is rejected before anything exists, and a racing create or
        resume cannot publish the same ids while this one loads and starts.
        """
        release_agent = self._registry.reserve(agent_id)
        try:
            release_session = self._sessions.reserve(session_id)
            try:
                yield
            finally:
                release_session()
        finally:
            release_agent()

    async def _start(
        self, agent_id: str, session: Session, options: AgentOptions | None, owner: Owner | None
    ) -> AgentHandle:
        agent = LoopAgent(
            agent_id,
            session,
            model=self._model,
            tools=self._tools,
            hooks=self._hooks,
            options=options,
        )
        handle = AgentHandle(agent)
        owner = owner or self._default_owner
        start = AgentTask(handle, self._sessions, self._registry)
        if isinstance(owner, Supervisor):
            spec = ChildSpec(
                f"agent:{handle.agent.id}", start, restart="temporary", shutdown=CLOSING_GRACE
            )
            await owner.start_child(spec)
        else:
            await owner.start(start)
        return handle
