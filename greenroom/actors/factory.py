"""`AgentFactory`: the one place agents are made, started and owned.

`create`, `resume` and a parent's spawn take one path after their own
checks: reserve both ids (until the agent is published or its start failed,
so a duplicate is rejected before anything exists and a racing create cannot
publish the same ids), get the session's log from the persistence (a new one,
or the stored one repaired), then `_start`: prepare the session with its
sink and start its `AgentLife` under the owner, which reports ready with the
`AgentHandle`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, cast

import msgspec
import trio

from greenroom.actors.carry import continued_prompt
from greenroom.actors.compaction import DEFAULT_POLICY, CompactionPolicy
from greenroom.actors.events import AGENT_DISPOSED
from greenroom.actors.life import AgentHandle, AgentLife, Owner, ReleaseOwned, Spawner
from greenroom.actors.loop import CLOSING_GRACE, LoopAgent
from greenroom.actors.registry import AgentRegistry
from greenroom.actors.types import (
    Agent,
    AgentOptions,
    Guard,
    ServerHub,
    SessionClient,
    SpawnArgs,
    SpawnLimits,
    SpawnRefused,
    ToolExecutor,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.hooks import Hooks
from greenroom.models.base import ModelAdapter
from greenroom.protocol.content import referenced
from greenroom.protocol.events import (
    SessionEvent,
    SessionHeader,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.mcp import McpServer, check_servers
from greenroom.protocol.model import ToolSchema
from greenroom.session import SessionStore, new_header
from greenroom.session.persistence import (
    INTERRUPTIONS,
    HandOff,
    Interruption,
    Persistence,
    ReleaseAsked,
    SessionLog,
    repair,
)
from greenroom.session.store import check_directory, check_session_id
from greenroom.supervisor import ChildSpec, Supervisor

logger = logging.getLogger("greenroom.agent")

#: What `resume` does with a session live elsewhere: refuse it (`SessionLocked`), or ask its
#: holder to let it go (a `HandOff` persistence).
TakeOver: TypeAlias = Literal["refuse", "ask"]
TAKE_OVERS: Final = ("refuse", "ask")


class AgentFactory:
    """Creates and resumes `LoopAgent`s under an owner (default: the runtime's agent supervisor).

    `get`, `by_session` and `list` read the live agents off the registry;
    only `create` and `resume` hand out the `AgentHandle` that can dispose one.
    """

    __slots__ = (
        "_answering",
        "_compaction",
        "_default_owner",
        "_handles",
        "_hooks",
        "_limits",
        "_models",
        "_persistence",
        "_registry",
        "_release_owned",
        "_servers",
        "_sessions",
        "_spawner",
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
        persistence: Persistence | None = None,
        servers: ServerHub | None = None,
        limits: SpawnLimits | None = None,
        compaction: CompactionPolicy = DEFAULT_POLICY,
        watch_guards: Callable[[Sequence[Guard]], None] | None = None,
    ) -> None:
        self._hooks = hooks
        self._watch_guards = watch_guards  # told each agent's guards as it starts
        self._sessions = sessions
        self._registry = registry
        self._models = models
        self._tools = tools
        self._default_owner = default_owner
        self._persistence = persistence
        self._release_owned = release_owned
        self._servers = servers
        self._limits = limits or SpawnLimits()
        self._compaction = compaction  # an agent's own options may say otherwise
        self._spawner: Spawner = self._spawn  # one bound method, shared by every life
        #: The handle of each live session's agent, for release requests (`HandOff`).
        self._handles: dict[str, AgentHandle] = {}
        self._answering = False  # the hand-off service runs
        hooks.on(AGENT_DISPOSED, self._forget_handle)

    def get(self, agent_id: str) -> Agent | None:
        return self._registry.get(agent_id)

    def by_session(self, session_id: str) -> Agent | None:
        return self._registry.by_session(session_id)

    def list(self) -> list[Agent]:
        return self._registry.list()

    async def create(
        self,
        *,
        agent_id: str,
        session_id: str,
        cwd: str | None = None,
        additional_directories: Sequence[str] = (),
        options: AgentOptions | None = None,
        owner: Owner | None = None,
        client: SessionClient | None = None,
        mcp_servers: Sequence[McpServer] = (),
        wait_for_servers: float = math.inf,
    ) -> AgentHandle:
        """Start an agent on a new session; returns its handle once it is live.

        ``client`` is the front end that drives the session (whom its tools ask
        permission, whose files they read); without one the runtime's defaults
        apply. ``additional_directories`` widen where its file tools may reach,
        beside ``cwd``. ``mcp_servers`` are started for the session, owned by
        its life, and their tools offered to its model; the handle comes once
        each is ready or has failed its first start (reported, not raised), or
        after ``wait_for_servers`` seconds: a server not ready by then goes on
        starting (said in its ``mcp/status``), its tools offered from the first
        model step after it is ready (0: the handle comes at once).

        With persistence, the session's header is stored first and the session
        held by this process for the agent's life, so a session that is never
        prompted can still be resumed; a stored id raises `SessionExists`,
        one live in another process `SessionLocked`. Raises
        `AgentIdInUse`/`SessionIdInUse` for an id that is live or being
        created, `ValueError` for a bad id, a relative `cwd` or a server spec
        that cannot start (naming it), before anything exists. A cancelled
        caller leaves no agent, no live session, no server and no hold (a
        header it stored stays stored).
        """
        self._check(session_id, mcp_servers)
        with self._registry.reserved(agent_id), self._sessions.reserved(session_id):
            header = new_header(session_id, cwd=cwd, additional_directories=additional_directories)
            log = None if self._persistence is None else await self._persistence.create(header)
            plan = _Plan(agent_id, options, owner, client, mcp_servers, wait=wait_for_servers)
            return await self._start(header, (), log, plan)

    async def resume(
        self,
        *,
        agent_id: str,
        session_id: str,
        options: AgentOptions | None = None,
        owner: Owner | None = None,
        client: SessionClient | None = None,
        mcp_servers: Sequence[McpServer] = (),
        wait_for_servers: float = math.inf,
        additional_directories: Sequence[str] | None = None,
        interrupted: Interruption = "close",
        take_over: TakeOver = "refuse",
        wait: float = 0.0,
    ) -> AgentHandle:
        """Take a stored session live (repairing a crashed turn) and start an agent on it.

        Turn numbers and the model history continue from the log. A last turn
        a crash cut (no ``turn/end``) is closed ``interrupted`` by default; with
        ``interrupted="continue"`` the agent carries it on before anything
        else (docs/semantics.md, "Durable turns"), logging ``turn/resumed``,
        and ``handle.resumed`` is its `Prompt` (None when no prompt's turn was
        cut: a cut injection, setting or compaction turn is closed as before).
        With ``take_over="ask"`` (a `HandOff` persistence: PostgreSQL) a
        session live on another node is asked for: its holder lets it go (at
        once when idle, after its turn when busy, or refuses) and this waits up
        to ``wait`` seconds for the lease. Raises `ValueError` for another
        ``interrupted`` or ``take_over``, or ``"ask"`` of a persistence that
        cannot hand off, `RuntimeError` without persistence, `SessionLocked`
        naming the holder while the session is live in another process (after
        a refusal, or past ``wait``), and a
        `PersistenceError` naming what the store could not read. Its MCP
        servers are not stored: give them again (as an editor does on load);
        ``wait_for_servers`` as for `create`.
        `additional_directories`, if given, are this life's extra roots instead
        of the stored ones (the stored header is not rewritten).
        """
        if self._persistence is None:
            raise RuntimeError(
                f"cannot resume session {session_id!r}: no session persistence is configured"
                " (pass persistence= to open_runtime)"
            )
        self._check(session_id, mcp_servers)
        if interrupted not in INTERRUPTIONS:
            raise ValueError(
                f"cannot resume session {session_id!r}: interrupted must be one of"
                f" {', '.join(INTERRUPTIONS)}, not {interrupted!r}"
            )
        persistence = self._persistence
        if take_over not in TAKE_OVERS:
            raise ValueError(
                f"cannot resume session {session_id!r}: take_over must be one of"
                f" {', '.join(TAKE_OVERS)}, not {take_over!r}"
            )
        if take_over == "ask" and not isinstance(persistence, HandOff):
            raise ValueError(
                f"cannot resume session {session_id!r} with take_over='ask': its persistence"
                f" ({type(persistence).__name__}) cannot ask a holder to let go (PostgreSQL can)"
            )
        if not isinstance(wait, int | float) or not wait >= 0:
            raise ValueError(f"wait must be seconds >= 0, not {wait!r}")
        if additional_directories is not None:
            if isinstance(additional_directories, str):
                raise TypeError("additional_directories must be a sequence of paths, not a str")
            for path in additional_directories:
                check_directory(session_id, "additional directory", path)
        with self._registry.reserved(agent_id), self._sessions.reserved(session_id):
            if isinstance(persistence, HandOff) and take_over == "ask":
                opened = await persistence.open_handed_off(
                    session_id, interrupted=interrupted, wait=wait
                )
            elif interrupted == "continue":
                opened = await self._persistence.open(session_id, interrupted="continue")
            else:  # as every persistence takes it, one written before the option too
                opened = await self._persistence.open(session_id)
            header, events, log = opened
            if additional_directories is not None:
                header = msgspec.structs.replace(
                    header, additional_directories=list(additional_directories)
                )
            carry_on = interrupted == "continue"
            plan = _Plan(
                agent_id,
                options,
                owner,
                client,
                mcp_servers,
                carry_on=carry_on,
                wait=wait_for_servers,
            )
            return await self._start(header, events, log, plan)

    async def fork(
        self,
        session_id: str,
        new_session_id: str,
        *,
        at_turn: int | None = None,
        cwd: str | None = None,
        additional_directories: Sequence[str] | None = None,
    ) -> SessionHeader:
        """Store a new session holding `session_id`'s log up to the end of turn `at_turn`
        (default: all of it); returns its header (``forked_from`` names the original;
        its directories are the original's unless `cwd`/`additional_directories` say).

        The original is only read (as `Persistence.load` reads it: safe while it
        is live, an unfinished turn closed ``interrupted`` in the copy) and is
        untouched. The fork is not live: `resume` takes it. Raises
        `RuntimeError` without persistence, `SessionNotFound`, `SessionExists`
        for a stored `new_session_id`, `ValueError` for a turn the log does not
        have or a bad id, before anything is stored. A copy that fails or is
        cancelled part way is deleted before the error reaches the caller.
        """
        if self._persistence is None:
            raise RuntimeError(
                f"cannot fork session {session_id!r}: no session persistence is configured"
            )
        self._check(new_session_id, ())
        header, events = await self._persistence.load(session_id)
        kept = _up_to(events, at_turn, session_id)
        with self._sessions.reserved(new_session_id):
            fork = new_header(
                new_session_id,
                cwd=header.cwd if cwd is None else cwd,
                additional_directories=header.additional_directories
                if additional_directories is None
                else additional_directories,
                parent_session=header.parent_session,
                forked_from=session_id,
            )
            log = await self._persistence.create(fork)
            try:
                try:
                    digests = [
                        d for e in kept if type(e) is UserMessage for d in referenced(e.parts)
                    ]
                    if digests:  # the prompts' images go with the copy, ahead of its log
                        await log.put_blobs(await self._persistence.read_blobs(session_id, digests))
                    for event in kept:
                        log.append(event)
                    await log.flush()
                finally:
                    await log.close()
            except BaseException as exc:
                await _unstore(self._persistence, new_session_id, exc)
                raise
        return fork

    def _check(self, session_id: str, mcp_servers: Sequence[McpServer]) -> None:
        """Refuse, before anything exists, an id the persistence could not store, and
        servers that could not start."""
        check_session_id(session_id)
        if self._persistence is not None:
            self._persistence.check_session_id(session_id)
        check_servers(mcp_servers)
        if mcp_servers and self._servers is None:
            raise ValueError("mcp_servers given, but this factory has no server hub")

    async def _start(
        self,
        header: SessionHeader,
        seed: Sequence[SessionEvent],
        log: SessionLog | None,
        plan: _Plan,
    ) -> AgentHandle:
        """Start the life that owns `log` from here on; if it never runs, close `log`."""
        try:
            if not self._answering and isinstance(self._persistence, HandOff):
                await self._answer_releases_from_now()
            return await self._start_life(header, seed, log, plan)
        except BaseException:
            if log is not None:
                await log.close()  # a no-op if the life ran and closed it
            raise

    async def _start_life(
        self,
        header: SessionHeader,
        seed: Sequence[SessionEvent],
        log: SessionLog | None,
        plan: _Plan,
    ) -> AgentHandle:
        guards = plan.options.guards if plan.options is not None else ()
        if guards:
            if self._watch_guards is None:
                raise ValueError("options.guards given, but this factory runs no guards")
            self._watch_guards(guards)
        session = self._sessions.prepare(header, seed=seed, sink=log)
        if plan.parent is not None:
            session.parent = plan.parent.agent.session
        resumed = continued_prompt(session) if plan.carry_on else None
        if resumed is None and session.open_turn is not None:  # no prompt's turn to carry on
            for closer in repair(session.events):
                session.append(closer)
        servers = None
        tools: ToolExecutor = self._tools
        if plan.mcp_servers and self._servers is not None:
            servers = self._servers.open(header.id, header.cwd, plan.mcp_servers, plan.wait)
            tools = servers.tools
        if plan.tools is not None:
            tools = _OnlyTools(tools, plan.tools)
        owner = plan.owner or self._default_owner
        agent_tools = tools
        life = AgentLife(
            self._sessions,
            self._registry,
            self._release_owned,
            log,
            servers,
            lambda life: LoopAgent(
                plan.agent_id,
                session,
                life=life,
                models=self._models,
                tools=agent_tools,
                hooks=self._hooks,
                options=plan.options,
                client=plan.client,
                compaction=self._compaction,
                resumed=resumed,
            ),
            spawner=self._spawner,
            owner=owner,
            client=plan.client,
            parent=plan.parent,
        )
        if isinstance(owner, Supervisor):
            spec = ChildSpec(
                f"agent:{plan.agent_id}",
                life,
                restart="temporary",
                shutdown=CLOSING_GRACE,
                stop=life.stop,
            )
            handle = cast(AgentHandle, await owner.start_child(spec))
        else:
            handle = await owner.start(life)
        handle.resumed = resumed
        self._handles[header.id] = handle
        return handle

    async def _answer_releases_from_now(self) -> None:
        """Start answering other nodes' release requests (once, at the first session this
        factory takes live), under the default owner: it ends with the runtime."""
        self._answering = True
        owner = self._default_owner
        if isinstance(owner, Supervisor):
            spec = ChildSpec("hand-off", self._answer_releases, restart="temporary")
            await owner.start_child(spec)
        else:
            await owner.start(self._answer_releases)

    async def _answer_releases(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        persistence = self._persistence
        assert isinstance(persistence, HandOff)
        async with trio.open_nursery() as nursery, aclosing(persistence.release_requests()) as asks:
            task_status.started()
            async for request in asks:
                nursery.start_soon(self._let_go, request, persistence.keep_busy)

    async def _let_go(self, request: ReleaseAsked, keep_busy: bool) -> None:
        """Another node asked for a session: dispose its agent here (its lease freed by the
        close) at once when idle, after its turn when busy, or, with `keep_busy`, refuse.
        A session not live here is left alone: its asker sees the lease as it is."""
        handle = self._handles.get(request.session_id)
        if handle is None:
            return
        agent = handle.agent
        try:
            if agent.status == "running":
                if keep_busy:
                    await request.refuse(
                        f"its agent {agent.id!r} is mid-turn, and this node keeps busy sessions"
                    )
                    return
                await agent.when_idle()
            await handle.dispose()
        except Exception as exc:  # one answer's failure never stops the others
            logger.warning("release of session %r failed: %s", request.session_id, exc)

    def _forget_handle(self, agent: Agent) -> None:
        handle = self._handles.get(agent.session.id)
        if handle is not None and handle.agent is agent:
            del self._handles[agent.session.id]

    async def _spawn(self, parent: AgentLife, child: SpawnArgs) -> AgentHandle:
        """A child of `parent`: a new session naming the parent's, under the parent's owner."""
        unknown = child.keys() - SpawnArgs.__annotations__.keys()
        if unknown:
            raise TypeError(f"spawn() got unexpected keyword arguments: {sorted(unknown)}")
        missing = SpawnArgs.__required_keys__ - child.keys()
        if missing:
            raise TypeError(f"spawn() is missing keyword arguments: {sorted(missing)}")
        agent_id, session_id = child["agent_id"], child["session_id"]
        tools, mcp_servers = child.get("tools"), child.get("mcp_servers", ())
        limits = self._limits
        if parent.depth + 1 > limits.max_depth:
            raise SpawnRefused(
                f"agent {parent.agent.id!r} is at depth {parent.depth}; children may nest"
                f" at most {limits.max_depth} deep"
            )
        if parent.live_children > limits.max_children:  # the count includes this one
            raise SpawnRefused(
                f"agent {parent.agent.id!r} has {parent.live_children - 1} live children,"
                f" the most it may have at once"
            )
        if isinstance(tools, str):  # a str is a Sequence[str], of one-letter names
            raise TypeError(f"tools must be a sequence of tool names, not the str {tools!r}")
        self._check(session_id, mcp_servers)
        above = parent.agent.session.header
        with self._registry.reserved(agent_id), self._sessions.reserved(session_id):
            header = new_header(
                session_id,
                cwd=above.cwd,
                additional_directories=above.additional_directories,
                parent_session=above.id,
            )
            log = None if self._persistence is None else await self._persistence.create(header)
            plan = _Plan(
                agent_id,
                child.get("options"),
                parent.owner,
                parent.client,
                mcp_servers,
                tools,
                parent,
            )
            return await self._start(header, (), log, plan)


def _up_to(
    events: Sequence[SessionEvent], at_turn: int | None, session_id: str
) -> Sequence[SessionEvent]:
    """The events of turns 1..`at_turn` (all of them for None), in order."""
    if at_turn is None:
        return events
    last = max((e.turn for e in events if isinstance(e, TurnEnd)), default=0)
    # Only an int: True is not turn 1, nor 1.0 or "1" a turn.
    if type(at_turn) is not int or not 0 <= at_turn <= last:
        raise ValueError(
            f"session {session_id!r} has turns 1..{last}; cannot fork it at turn {at_turn!r}"
        )
    for index, event in enumerate(events):
        if isinstance(event, TurnStart) and event.turn > at_turn:
            return events[:index]
    return events


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a start was asked for, beside the session it starts on."""

    agent_id: str
    options: AgentOptions | None
    owner: Owner | None
    client: SessionClient | None
    mcp_servers: Sequence[McpServer]
    tools: Sequence[str] | None = None
    parent: AgentLife | None = None
    carry_on: bool = False  # a turn the log has open is the agent's to carry on
    wait: float = math.inf  # seconds its start waits for its MCP servers


class _OnlyTools:
    """The tools of `inner` named in `names`; a call of any other is an unknown tool."""

    __slots__ = ("_inner", "_names", "_schemas", "_schemas_of")

    def __init__(self, inner: ToolExecutor, names: Sequence[str]) -> None:
        self._inner = inner
        self._names = frozenset(names)
        self._schemas: list[ToolSchema] = []
        self._schemas_of: list[ToolSchema] | None = None

    def schemas(self) -> list[ToolSchema]:
        every = self._inner.schemas()
        if every is not self._schemas_of:
            self._schemas_of = every
            self._schemas = [schema for schema in every if schema.name in self._names]
        return self._schemas

    def describe(self, name: str, arguments: str) -> ToolView:
        return self._inner.describe(name, arguments)

    async def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        if invocation.name not in self._names:
            await trio.lowlevel.checkpoint()
            known = ", ".join(sorted(self._names)) or "none"
            return ToolOutcome.failed(
                f"unknown tool {invocation.name!r} (known tools: {known})", "unknown-tool"
            )
        return await self._inner.execute(invocation)


async def _unstore(persistence: Persistence, session_id: str, cause: BaseException) -> None:
    """Delete a session whose copy failed or was cancelled part way, so no partial copy
    stays stored; shielded, bounded by `CLOSING_GRACE`. A delete that fails too is told
    on `cause` (which the caller raises) rather than hiding it."""
    with trio.move_on_after(CLOSING_GRACE, shield=True) as bound:
        try:
            await persistence.delete(session_id)
        except Exception as exc:
            cause.add_note(f"the partial fork {session_id!r} is still stored: {exc!r}")
    if bound.cancelled_caught:
        cause.add_note(f"the partial fork {session_id!r} may still be stored: its delete timed out")
