"""`AgentLife`: one agent's whole life as one task, and `AgentHandle`, the capability to end it.

`AgentLife.__call__` is the one place that says an agent's teardown order, and it
says it with nesting::

    session log held (this process its writer)  (closed last: synced, let go)
      session entered in the store             (left sixth)
        agent registered                       (unregistered fifth)
          the session's MCP servers            (stopped fourth, within their grace)
            the session's owned processes      (released third: killed, reaped)
              the agent's children             (disposed second, at the latest)
                the agent's loop               (stopped first; its closing turn/end
                                                is appended and flushed, unstoppable;
                                                then its `close`: disposed, last flush)

`AgentHandle.dispose` stops the loop (`LiveAgent.stop`: the inbox wakes the
parked loop to return, and a turn in flight has its turns' scope cancelled
with reason ``"disposed"``) and waits for the life's task to return. A
supervisor owner closing stops it the same way (`stop` is its child spec's
``stop``, so it runs with no cancel scope of the supervisor's either); a
nursery owner closing cancels the task from outside. Python unwinds the
same nesting either way. The life has no cancel scope of its own: an idle
agent pays for none (a `trio.CancelScope` and its status are ~700 B). Nor
does a fresh agent hold its loop's frame: it waits for its first work in the
life's own (`LiveAgent.wait_for_work`), and `drive` starts then.

Children (`AgentHandle.spawn`, the ``task`` tool) are lives of their own,
started under their parent's owner beside it, so that an idle agent pays
nothing for the ability to have them. The parent's life owns them all the
same: its loop disposes them before it appends its own closing ``turn/end``
(`end_children`), and its nesting does again before anything else is let go,
so no child outlives its parent, whichever way the parent ends. A parent's
cancel reaches its children (`cancel_children`).

An `Owner` is what a life runs under: a `Supervisor` or a nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import trio

from greenroom.actors.prompt import Prompt
from greenroom.actors.registry import AgentRegistry
from greenroom.actors.types import (
    Agent,
    AgentOptions,
    SessionClient,
    SessionServers,
    SpawnArgs,
    SpawnRefused,
)
from greenroom.protocol.mcp import McpServer
from greenroom.session import SessionStore
from greenroom.session.persistence import PersistenceError, SessionLog
from greenroom.supervisor import Supervisor

logger = logging.getLogger("greenroom.agent")

#: Releases what a session owns outside the agent (its background processes), by session id.
#: It runs to the end even when its caller is cancelled (it shields itself), and bounds itself.
ReleaseOwned = Callable[[str], Awaitable[None]]
#: Whom an agent must not outlive: a supervisor (it becomes a temporary child) or a nursery.
Owner: TypeAlias = Supervisor | trio.Nursery
#: The factory's half of `AgentHandle.spawn`: start a child of a parent's life.
Spawner: TypeAlias = Callable[["AgentLife", SpawnArgs], Awaitable["AgentHandle"]]


class LiveAgent(Agent, Protocol):
    """An agent as its life runs it."""

    def wait_for_work(self) -> Awaitable[None]:
        """Awaited, returns once there is work for `drive` (or `stop` was called)."""
        ...

    async def drive(self) -> None:
        """Run turns until `stop` (then it returns) or the owner's cancel (re-raised)."""
        ...

    async def close(self) -> None:
        """What is left once `drive` ended (or was never reached): the agent disposed,
        the last flush. Unstoppable."""
        ...

    def stop(self) -> None:
        """Make `drive` return: a turn in flight ends ``disposed``, a parked loop (or
        `wait_for_work`) wakes. Never checkpoints; idempotent."""
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

    __slots__ = ("_life", "agent", "resumed", "spec")

    def __init__(self, agent: Agent, life: AgentLife) -> None:
        self.agent = agent
        self._life = life
        #: The prompt of the cut turn `AgentFactory.resume(..., interrupted="continue")`
        #: carries on (awaiting it gives that turn's `Answer`); None otherwise.
        self.resumed: Prompt[None] | None = None
        #: The `AgentSpec` it was started from (`Runtime.start`, a spawn of a spec), or None.
        self.spec: object = None

    def __repr__(self) -> str:
        return f"<AgentHandle {self.agent.id!r} session {self.session_id!r}>"

    @property
    def id(self) -> str:
        """Its agent's id."""
        return self.agent.id

    @property
    def session_id(self) -> str:
        """Its agent's session's id."""
        return self.agent.session.id

    async def dispose(self) -> None:
        self._life.stop()
        await self._life.wait_exited()

    async def spawn(
        self,
        spec: object = None,
        /,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        tools: Sequence[str] | None = None,
        mcp_servers: Sequence[McpServer] = (),
    ) -> AgentHandle:
        """Start a child of this agent; returns the child's handle once it is live.

        Either an `AgentSpec` (``spawn(spec, session_id=...)``: the child is what
        the spec says; its session id defaults to a fresh one), or the child's
        ``agent_id`` and ``session_id``, with ``options``, the runtime's tools it
        has (only those named in ``tools``, if given) and its ``mcp_servers``.
        The child's session records this one as its ``parent_session``; it runs
        in this agent's directories and asks this agent's front end. It is this
        agent's: this agent's cancel cancels it, and disposing this agent
        disposes it first. Raises `SpawnRefused` past the runtime's
        `SpawnLimits` or once this agent is being disposed (a spawn in flight
        then leaves nothing), `TypeError` for a str as ``tools``, for a spec
        given with ``options`` or ``tools``, or ids missing without one, and what
        `AgentFactory.create` raises.
        """
        return await self._life.spawn(
            SpawnArgs(
                spec=spec,
                agent_id=agent_id,
                session_id=session_id,
                options=options,
                tools=tools,
                mcp_servers=mcp_servers,
            )
        )


@dataclass(frozen=True, slots=True)
class Lives:
    """What every life a launcher starts shares, held once: the store its session enters,
    the registry its agent joins, the release of its session's owned processes, and the
    factory's half of its spawns."""

    sessions: SessionStore
    registry: AgentRegistry
    release_owned: ReleaseOwned
    spawner: Spawner


class AgentLife:
    """One agent's life: its stop, the exit, and the nesting its task unwinds.

    The life builds its agent (``build(life)``), so the agent can read
    `disposing` (true from the first `stop`) to refuse new work, and await
    `wait_exited` where it promises full quiescence. The life itself is the
    task's body: its owner calls ``life(task_status=...)`` (a supervisor
    child's start, or ``nursery.start``), which reports the handle once live.
    """

    __slots__ = (
        "_children",
        "_exited",
        "_lives",
        "_log",
        "_parent",
        "_servers",
        "_spawning",
        "_spawns_settled",
        "agent",
        "client",
        "disposing",
        "handle",
        "owner",
    )

    def __init__(
        self,
        lives: Lives,
        log: SessionLog | None,
        servers: SessionServers | None,
        build: Callable[[AgentLife], LiveAgent],
        *,
        owner: Owner,
        client: SessionClient | None,
        parent: AgentLife | None = None,
    ) -> None:
        self._log = log
        self._servers = servers
        self._lives = lives
        self._exited: trio.Event | bool = False  # an Event once someone waits (it is 216 B)
        self.disposing = False
        #: For the factory's spawner: where this life runs, whom its session asks.
        self.owner = owner
        self.client = client
        self._parent = parent
        self._children: list[AgentHandle] | None = None  # made on the first spawn
        self._spawning: set[trio.CancelScope] | None = None  # the spawns in flight, once any
        self._spawns_settled: trio.Event | None = None  # made when `end_children` waits
        self.agent = build(self)
        self.handle = AgentHandle(self.agent, self)

    # -- children -----------------------------------------------------------------

    @property
    def depth(self) -> int:
        """How deep it nests: 0 for a top-level agent, its parent's depth + 1 for a child."""
        depth, parent = 0, self._parent
        while parent is not None:
            depth, parent = depth + 1, parent._parent
        return depth

    @property
    def children(self) -> Sequence[AgentHandle]:
        """The live children, oldest first."""
        return self._children or ()

    @property
    def live_children(self) -> int:
        """The live children and those starting: what a limit on children counts."""
        return len(self._children or ()) + len(self._spawning or ())

    async def spawn(self, child: SpawnArgs) -> AgentHandle:
        """`AgentHandle.spawn`; the child is one of `children` until its life exits."""
        if self.disposing:
            raise SpawnRefused(f"agent {self.agent.id!r} is being disposed; it spawns no more")
        # Its own scope, so that the parent's end (`end_children`) can call it off.
        scope = trio.CancelScope()
        if self._spawning is None:
            self._spawning = set()
        self._spawning.add(scope)
        try:
            with scope:
                handle = await self._lives.spawner(self, child)
        finally:
            self._spawning.discard(scope)
            if not self._spawning and self._spawns_settled is not None:
                self._spawns_settled.set()
        if scope.cancelled_caught:  # the factory left nothing of it behind
            raise SpawnRefused(f"agent {self.agent.id!r} is being disposed; it spawns no more")
        if self._children is None:
            self._children = []
        self._children.append(handle)
        if self.disposing:  # the parent began its end as the child went live
            await handle.dispose()
        return handle

    def cancel_children(self, reason: str) -> None:
        """The parent's cancel, passed on: each child cancels its own work (and its children's)."""
        for child in self.children:
            child.agent.cancel(reason)

    async def end_children(self) -> None:
        """Refuse new children, call off the spawns in flight and wait for them, then
        dispose every child at once and wait for all of them. Shields itself.

        A spawn in flight either leaves nothing (it raises `SpawnRefused`) or
        its child is already one of `children` when this disposes them.
        """
        self.disposing = True
        if not self._children and not self._spawning:
            return
        with trio.CancelScope(shield=True):
            if self._spawning:
                self._spawns_settled = trio.Event()
                for spawning in self._spawning:
                    spawning.cancel(reason="disposed")
                await self._spawns_settled.wait()
            async with trio.open_nursery() as disposing:
                for child in list(self._children or ()):
                    disposing.start_soon(child.dispose)

    def _left(self, child: AgentHandle) -> None:
        if self._children is not None and child in self._children:
            self._children.remove(child)

    def stop(self) -> None:
        """Begin the teardown: stop the agent's loop (reason ``"disposed"``). Idempotent."""
        self.disposing = True
        self.agent.stop()

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
        if self._exited is True:
            await trio.lowlevel.checkpoint()
            return
        if self._exited is False:
            self._exited = trio.Event()
        await self._exited.wait()

    async def __call__(self, *, task_status: trio.TaskStatus[AgentHandle]) -> None:
        """The whole life, nested as the module docstring says.

        Returns after `stop`; re-raises the owner's cancel.
        """
        agent, session = self.agent, self.agent.session
        try:
            try:
                self._lives.sessions.enter(session)
                try:
                    self._lives.registry.register(agent)
                    try:
                        try:
                            if self._servers is not None:
                                await self._servers.start(agent)
                            try:
                                try:
                                    task_status.started(self.handle)
                                    # Trio's status holds its start's nursery (~800 B).
                                    del task_status
                                    # A fresh agent parks here: no frame of its loop's
                                    # until its first work.
                                    await agent.wait_for_work()
                                    await agent.drive()
                                finally:
                                    try:
                                        await agent.close()
                                    finally:
                                        await self.end_children()
                            finally:
                                await self._lives.release_owned(session.id)
                        finally:
                            if self._servers is not None:
                                await self._servers.stop()  # shields itself
                    finally:
                        self._lives.registry.unregister(agent)
                finally:
                    self._lives.sessions.leave(session)
            finally:
                await self._close_log(session.id)
        finally:
            self._exit()

    def _exit(self) -> None:
        """The life's last word: its parent forgets it, and whoever waits for it is told.
        A method, not inline: the life's frame, held for its whole life, keeps fewer
        locals."""
        self.disposing = True
        if self._parent is not None:
            self._parent._left(self.handle)
        exited, self._exited = self._exited, True
        if isinstance(exited, trio.Event):
            exited.set()
