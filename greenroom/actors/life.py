"""`AgentLife`: one agent's whole life as one task, and `AgentHandle`, the capability to end it.

`AgentLife.run` is the one place that says an agent's teardown order, and it
says it with nesting::

    session entered in the store               (detached last)
      agent registered                         (unregistered second)
        the session's owned processes          (released third: killed and reaped)
          the life scope: the agent's loop     (stopped first; its closing turn/end
                                                and flush run in cleanup_scope())

`AgentHandle.dispose` cancels the life scope and waits for `run` to return;
an owner closing cancels the same task from outside. Python unwinds the same
nesting either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, Protocol

import trio

from greenroom.actors.registry import AgentRegistry
from greenroom.actors.types import Agent
from greenroom.session import SessionStore
from greenroom.supervisor import cleanup_scope

#: The most an agent's closing work (the last flush, releasing what its session owns) may take
#: once it is stopped, when no supervisor's grace bounds it sooner.
CLOSING_GRACE: Final = 10.0

#: Releases what a session owns outside the agent (its background processes), by session id.
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
    has returned: the session's owned processes released, the agent
    unregistered, its session out of the store, in that order. It is
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
    """One agent's life: the life scope, the exit, and the nesting `run` unwinds.

    The agent reads `disposing` (true from the first `stop`) to refuse new
    work, and awaits `wait_exited` where it promises full quiescence.
    """

    __slots__ = ("_exited", "_registry", "_release_owned", "_scope", "_sessions", "disposing")

    def __init__(
        self, sessions: SessionStore, registry: AgentRegistry, release_owned: ReleaseOwned
    ) -> None:
        self._sessions = sessions
        self._registry = registry
        self._release_owned = release_owned
        self._scope = trio.CancelScope()
        self._exited = trio.Event()
        self.disposing = False

    def stop(self) -> None:
        """Begin the teardown: cancel the life scope with reason ``"disposed"``. Idempotent."""
        self.disposing = True
        self._scope.cancel(reason="disposed")

    async def wait_exited(self) -> None:
        """Wait until `run` has returned (or raised). Checkpoints."""
        await self._exited.wait()

    async def run(self, agent: LiveAgent, *, task_status: trio.TaskStatus[AgentHandle]) -> None:
        """The whole life (a supervisor child's start, or a nursery's): see the module docstring.

        Returns after `stop`; re-raises the owner's cancel.
        """
        session = agent.session
        try:
            with self._sessions.entered(session), self._registry.registered(agent):
                try:
                    with self._scope:
                        task_status.started(AgentHandle(agent, self))
                        await agent.run()
                finally:
                    with closing_scope():
                        await self._release_owned(session.id)
        finally:
            self.disposing = True
            self._exited.set()


@contextlib.contextmanager
def closing_scope() -> Iterator[trio.CancelScope]:
    """`cleanup_scope`, cut off after `CLOSING_GRACE` at the latest (a nursery owner has none)."""
    with cleanup_scope() as closing:
        closing.deadline = min(closing.deadline, trio.current_time() + CLOSING_GRACE)
        yield closing
