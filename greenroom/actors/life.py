"""`AgentLife`: one agent's whole life as one task, and `AgentHandle`, the capability to end it.

`AgentLife.__call__` is the one place that says an agent's teardown order, and it
says it with nesting::

    session log held (this process its writer)  (closed last: synced, let go)
      session entered in the store             (left fifth)
        agent registered                       (unregistered fourth)
          the session's MCP servers            (stopped third, within their grace)
            the session's owned processes      (released second: killed, reaped)
              the life scope: the agent's loop (stopped first; its closing turn/end
                                                is appended and flushed, unstoppable)

`AgentHandle.dispose` cancels the life scope and waits for the life's task to
return; an owner closing cancels the same task from outside. Python unwinds
the same nesting either way.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from greenroom.actors.registry import AgentRegistry
from greenroom.actors.types import Agent, SessionServers
from greenroom.session import SessionStore
from greenroom.session.persistence import PersistenceError, SessionLog

logger = logging.getLogger("greenroom.agent")

#: Releases what a session owns outside the agent (its background processes), by session id.
#: It runs to the end even when its caller is cancelled (it shields itself), and bounds itself.
ReleaseOwned = Callable[[str], Awaitable[None]]


class LiveAgent(Agent, Protocol):
    """An agent as its life runs it."""

    async def run(self) -> None:
        """Run turns until cancelled (the life scope, or the owner); never returns otherwise."""
        ...


class AgentHandle:
    """The capability to tear down exactly one agent.

    `dispose` stops the agent's loop (a turn in flight ends ``disposed``, its
    closing ``turn/end`` and flush run shielded), then waits until its task
    has returned: the session's owned processes released, its MCP servers
    stopped, the agent unregistered, its session out of the store, in that
    order. It is
    memoised: every caller, concurrent or later, awaits the same teardown.
    A cancelled caller stops waiting; the teardown goes on.
    """

    __slots__ = ("_life", "agent")

    def __init__(self, agent: Agent, life: AgentLife) -> None:
        self.agent = agent
        self._life = life

    def __repr__(self) -> str:
        return f"<AgentHandle {self.agent.id!r}>"

    async def dispose(self) -> None:
        self._life.stop()
        await self._life.wait_exited()


class AgentLife:
    """One agent's life: the life scope, the exit, and the nesting its task unwinds.

    The life builds its agent (``build(life)``), so the agent can read
    `disposing` (true from the first `stop`) to refuse new work, and await
    `wait_exited` where it promises full quiescence. The life itself is the
    task's body: its owner calls ``life(task_status=...)`` (a supervisor
    child's start, or ``nursery.start``), which reports the handle once live.
    """

    __slots__ = (
        "_exited",
        "_log",
        "_registry",
        "_release_owned",
        "_scope",
        "_servers",
        "_sessions",
        "agent",
        "disposing",
        "handle",
    )

    def __init__(
        self,
        sessions: SessionStore,
        registry: AgentRegistry,
        release_owned: ReleaseOwned,
        log: SessionLog | None,
        servers: SessionServers | None,
        build: Callable[[AgentLife], LiveAgent],
    ) -> None:
        self._log = log
        self._servers = servers
        self._sessions = sessions
        self._registry = registry
        self._release_owned = release_owned
        self._scope = trio.CancelScope()
        self._exited = trio.Event()
        self.disposing = False
        self.agent = build(self)
        self.handle = AgentHandle(self.agent, self)

    def stop(self) -> None:
        """Begin the teardown: cancel the life scope with reason ``"disposed"``. Idempotent."""
        self.disposing = True
        self._scope.cancel(reason="disposed")

    async def _close_log(self, session_id: str) -> None:
        """The last sync, then let the session go; a failure is logged, never raised here."""
        if self._log is None:
            return
        try:
            await self._log.close()  # shields itself
        except PersistenceError:
            logger.exception("closing the log of session %r failed", session_id)

    async def wait_exited(self) -> None:
        """Wait until the life's task has returned (or raised). Checkpoints."""
        await self._exited.wait()

    async def __call__(self, *, task_status: trio.TaskStatus[AgentHandle]) -> None:
        """The whole life, nested as the module docstring says.

        Returns after `stop`; re-raises the owner's cancel.
        """
        agent, session = self.agent, self.agent.session
        try:
            try:
                self._sessions.enter(session)
                try:
                    self._registry.register(agent)
                    try:
                        servers = self._servers
                        try:
                            if servers is not None:
                                await servers.start(agent)
                            try:
                                with self._scope:
                                    task_status.started(self.handle)
                                    await agent.run()
                            finally:
                                await self._release_owned(session.id)
                        finally:
                            if servers is not None:
                                await servers.stop()  # shields itself
                    finally:
                        self._registry.unregister(agent)
                finally:
                    self._sessions.leave(session)
            finally:
                await self._close_log(session.id)
        finally:
            self.disposing = True
            self._exited.set()
