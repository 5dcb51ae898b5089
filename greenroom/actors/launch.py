"""`Launcher`: the one path every agent's life starts by, once its arguments were checked.

Reserve both ids (until the agent is published or its start failed, so a
duplicate is rejected before anything exists and a racing create cannot
publish the same ids), get the session's log from the persistence (a new
one, or the stored one repaired), prepare the session with the log as its
sink, and start its `AgentLife` under the owner, which reports ready with
the `AgentHandle`. `AgentFactory` checks what it was asked and makes one
`AgentStart` of it; the launcher does the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, cast

import msgspec

from greenroom.actors.carry import continued_prompt
from greenroom.actors.compaction import CompactionPolicy
from greenroom.actors.life import AgentHandle, AgentLife, Lives, Owner, ReleaseOwned, Spawner
from greenroom.actors.loop import CLOSING_GRACE, LoopAgent
from greenroom.actors.registry import AgentRegistry
from greenroom.actors.releases import ReleaseDesk
from greenroom.actors.types import (
    AgentOptions,
    Guard,
    ServerHub,
    SessionClient,
    ToolExecutor,
)
from greenroom.hooks import Hooks
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices
from greenroom.protocol.events import SessionEvent, SessionHeader
from greenroom.protocol.mcp import McpServer
from greenroom.session import SessionStore, new_header
from greenroom.session.persistence import (
    HandOff,
    Interruption,
    Persistence,
    SessionLog,
    repair,
)
from greenroom.supervisor import ChildSpec, Supervisor

#: What `resume` does with a session live elsewhere: refuse it (`SessionLocked`), or ask its
#: holder to let it go (a `HandOff` persistence).
TakeOver: TypeAlias = Literal["refuse", "ask"]
TAKE_OVERS: Final = ("refuse", "ask")


class Launcher:
    """Starts agents' lives (see the module docstring); one per factory."""

    __slots__ = (
        "_compaction",
        "_default_owner",
        "_desk",
        "_hooks",
        "_lives",
        "_models",
        "_persistence",
        "_prices",
        "_registry",
        "_servers",
        "_sessions",
        "_tools",
        "_watch_guards",
    )

    def __init__(
        self,
        *,
        hooks: Hooks,
        sessions: SessionStore,
        registry: AgentRegistry,
        models: Mapping[str, ModelAdapter],
        tools: ToolExecutor,
        default_owner: Owner,
        release_owned: ReleaseOwned,
        persistence: Persistence | None,
        servers: ServerHub | None,
        compaction: CompactionPolicy,
        prices: Prices,
        watch_guards: Callable[[Sequence[Guard]], None] | None,
        spawner: Spawner,
    ) -> None:
        self._hooks = hooks
        self._sessions = sessions
        self._registry = registry
        self._models = models
        self._tools = tools
        self._default_owner = default_owner
        self._persistence = persistence
        self._servers = servers
        self._compaction = compaction  # an agent's own options may say otherwise
        self._prices = prices
        self._watch_guards = watch_guards  # told each agent's guards as it starts
        self._lives = Lives(sessions, registry, release_owned, spawner)  # shared by each life
        self._desk = (
            ReleaseDesk(hooks, persistence, default_owner)
            if isinstance(persistence, HandOff)
            else None
        )

    async def create(
        self,
        session_id: str,
        cwd: str | None,
        additional_directories: Sequence[str],
        launch: AgentStart,
        principal: str | None = None,
    ) -> AgentHandle:
        with self._registry.reserved(launch.agent_id), self._sessions.reserved(session_id):
            parent = launch.parent.agent.session.header if launch.parent is not None else None
            header = new_header(
                session_id,
                cwd=cwd if parent is None else parent.cwd,
                additional_directories=additional_directories
                if parent is None
                else parent.additional_directories,
                parent_session=None if parent is None else parent.id,
                principal=principal if parent is None else parent.principal,
            )
            log = None if self._persistence is None else await self._persistence.create(header)
            return await self._start(header, (), log, launch)

    async def resume(
        self,
        session_id: str,
        launch: AgentStart,
        interrupted: Interruption,
        take_over: TakeOver,
        wait: float,
        additional_directories: Sequence[str] | None,
    ) -> AgentHandle:
        persistence = self._persistence
        assert persistence is not None  # `_check_resume` refused it
        with self._registry.reserved(launch.agent_id), self._sessions.reserved(session_id):
            if isinstance(persistence, HandOff) and take_over == "ask":
                opened = await persistence.open_handed_off(
                    session_id, interrupted=interrupted, wait=wait
                )
            elif interrupted == "continue":
                opened = await persistence.open(session_id, interrupted="continue")
            else:  # as every persistence takes it, one written before the option too
                opened = await persistence.open(session_id)
            header, events, log = opened
            if additional_directories is not None:
                header = msgspec.structs.replace(
                    header, additional_directories=list(additional_directories)
                )
            launch.carry_on = interrupted == "continue"
            return await self._start(header, events, log, launch)

    async def _start(
        self,
        header: SessionHeader,
        seed: Sequence[SessionEvent],
        log: SessionLog | None,
        launch: AgentStart,
    ) -> AgentHandle:
        """Start the life that owns `log` from here on; if it never runs, close `log`."""
        try:
            if self._desk is not None:
                await self._desk.open()
            handle = await self._start_life(header, seed, log, launch)
        except BaseException:
            if log is not None:
                await log.close()  # a no-op if the life ran and closed it
            raise
        if self._desk is not None:
            self._desk.hold(header.id, handle)
        return handle

    async def _start_life(
        self,
        header: SessionHeader,
        seed: Sequence[SessionEvent],
        log: SessionLog | None,
        launch: AgentStart,
    ) -> AgentHandle:
        guards = launch.options.guards if launch.options is not None else ()
        if guards:
            if self._watch_guards is None:
                raise ValueError("options.guards given, but this factory runs no guards")
            self._watch_guards(guards)
        session = self._sessions.prepare(header, seed=seed, sink=log)
        if launch.parent is not None:
            session.parent = launch.parent.agent.session
        # A turn parked on a decision is carried on whatever `interrupted` says: nothing
        # was in flight but the wait, and the answer kept for it, if any, is taken at once.
        waits = session.decisions
        resumed = continued_prompt(session) if launch.carry_on or waits else None
        if resumed is None and session.open_turn is not None:  # no prompt's turn to carry on
            for closer in repair(session.events):
                session.append(closer)
        persistence = self._persistence
        kept = await persistence.read_answers(header.id) if waits and persistence else {}
        tools = launch.tools or self._tools
        servers = None
        if launch.mcp_servers and self._servers is not None:
            servers = self._servers.open(
                header.id, header.cwd, launch.mcp_servers, tools, launch.wait
            )
            tools = servers.tools
        owner = launch.owner or self._default_owner
        agent_tools, models = tools, launch.models or self._models
        life = AgentLife(
            self._lives,
            log,
            servers,
            lambda life: LoopAgent(
                launch.agent_id,
                session,
                life=life,
                models=models,
                tools=agent_tools,
                hooks=self._hooks,
                options=launch.options,
                compaction=self._compaction,
                prices=self._prices,
                resumed=resumed,
                answers=kept,
            ),
            owner=owner,
            client=launch.client,
            parent=launch.parent,
        )
        if isinstance(owner, Supervisor):
            spec = ChildSpec(
                f"agent:{launch.agent_id}",
                life,
                restart="temporary",
                shutdown=CLOSING_GRACE,
                stop=life.stop,
            )
            handle = cast(AgentHandle, await owner.start_child(spec))
        else:
            handle = await owner.start(life)
        handle.resumed = resumed
        return handle


@dataclass(slots=True)
class AgentStart:
    """What a start was asked for, beside the session it starts on, made once by the
    factory."""

    agent_id: str
    options: AgentOptions | None
    owner: Owner | None
    client: SessionClient | None
    mcp_servers: Sequence[McpServer]
    parent: AgentLife | None = None
    carry_on: bool = False  # a turn the log has open is the agent's to carry on
    wait: float = math.inf  # seconds its start waits for its MCP servers
    models: Mapping[str, ModelAdapter] | None = None  # None: the runtime's
    tools: ToolExecutor | None = None  # None: the runtime's, all of them
    instructions: str | None = None  # its spec's text, logged as a setting
