"""`AgentFactory`: the one place agents are made, started and owned.

`create`, `resume`, `start` (an `AgentSpec`, created or resumed) and a
parent's spawn each make one `_Start` (what the agent is, whom it answers
to) after their own checks, then take one path: reserve both ids (until the
agent is published or its start failed, so a duplicate is rejected before
anything exists and a racing create cannot publish the same ids), get the
session's log from the persistence (a new one, or the stored one repaired),
then `_start`: prepare the session with its sink and start its `AgentLife`
under the owner, which reports ready with the `AgentHandle`.

A spawn is checked against `SpawnLimits` (depth, live children: `SpawnRefused`); a fork
(`greenroom.actors.fork`) makes a new stored session for `resume` to take live.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence

from greenroom.actors.compaction import DEFAULT_POLICY, CompactionPolicy
from greenroom.actors.fork import fork_session
from greenroom.actors.launch import TAKE_OVERS, AgentStart, Launcher, TakeOver
from greenroom.actors.life import AgentHandle, AgentLife, Owner, ReleaseOwned
from greenroom.actors.registry import AgentRegistry
from greenroom.actors.spec import AgentSpec, Resolver
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
)
from greenroom.hooks import Hooks
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices, shipped_prices
from greenroom.protocol.events import SessionHeader
from greenroom.protocol.mcp import McpServer, check_servers
from greenroom.session import SessionStore
from greenroom.session.persistence import (
    INTERRUPTIONS,
    HandOff,
    Interruption,
    Persistence,
    SessionExists,
)
from greenroom.session.store import check_directory, check_session_id


class AgentFactory:
    """Creates and resumes `LoopAgent`s under an owner (default: the runtime's agent supervisor).

    `get`, `by_session` and `list` read the live agents off the registry;
    only `create`, `resume` and `start` hand out the `AgentHandle` that can
    dispose one. Specs are made real (models, tools, instructions) by the
    runtime's `Resolver`. Every agent's replies are priced by `prices` (None: the table
    greenroom ships, `greenroom.models.prices.shipped_prices`).
    """

    __slots__ = (
        "_launcher",
        "_limits",
        "_persistence",
        "_registry",
        "_resolver",
        "_servers",
        "_sessions",
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
        prices: Prices | None = None,
        watch_guards: Callable[[Sequence[Guard]], None] | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self._sessions = sessions
        self._registry = registry
        self._persistence = persistence
        self._servers = servers
        self._limits = limits or SpawnLimits()
        self._resolver = resolver
        self._launcher = Launcher(
            hooks=hooks,
            sessions=sessions,
            registry=registry,
            models=models,
            tools=tools,
            default_owner=default_owner,
            release_owned=release_owned,
            persistence=persistence,
            servers=servers,
            compaction=compaction,
            prices=shipped_prices() if prices is None else prices,
            watch_guards=watch_guards,
            spawner=self._spawn,  # one bound method, shared by every life
        )

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
        principal: str | None = None,
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
        header it stored stays stored). ``principal`` is recorded in the header as
        the session's owner (`SessionHeader.principal`).
        """
        self._check(session_id, mcp_servers)
        start = AgentStart(agent_id, options, owner, client, mcp_servers, wait=wait_for_servers)
        return await self._launcher.create(
            session_id, cwd, additional_directories, start, principal
        )

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
        self._check_resume(session_id, interrupted, take_over, wait, additional_directories)
        self._check(session_id, mcp_servers)
        start = AgentStart(agent_id, options, owner, client, mcp_servers, wait=wait_for_servers)
        return await self._launcher.resume(
            session_id, start, interrupted, take_over, wait, additional_directories
        )

    async def start(
        self,
        spec: AgentSpec,
        session_id: str | None = None,
        *,
        cwd: str | None = None,
        additional_directories: Sequence[str] | None = None,
        owner: Owner | None = None,
        client: SessionClient | None = None,
        interrupted: Interruption = "close",
        take_over: TakeOver = "refuse",
        wait: float = 0.0,
        wait_for_servers: float = math.inf,
    ) -> AgentHandle:
        """Start `spec` on session `session_id` (a fresh ``NAME-XXXXXXXX`` for None): made
        when the store does not hold it (in `cwd` and `additional_directories`), else
        resumed (as `resume`, with `interrupted`, `take_over` and `wait`; its stored
        directories unless `additional_directories` are given). The agent's id is
        ``NAME:SESSION``; ``handle.spec`` is `spec`. Its instructions' text, when it is
        not the session's ``instructions`` setting already, is logged as that setting.
        Raises `TypeError` for a `spec` that is not an `AgentSpec`, and what `create`,
        `resume` and the spec's resolution raise (each naming what was wrong)."""
        if not isinstance(spec, AgentSpec):
            raise TypeError(f"start() takes an AgentSpec, got {type(spec).__name__}")
        if session_id is None:
            session_id = f"{spec.name}-{secrets.token_hex(4)}"
        self._check(session_id, spec.mcp_servers)
        if self._persistence is not None:
            self._check_resume(session_id, interrupted, take_over, wait, additional_directories)
        start = await self._spec_start(spec, session_id, owner, client, wait_for_servers)
        try:
            handle = await self._launcher.create(
                session_id, cwd, additional_directories or (), start
            )
        except SessionExists:
            handle = await self._launcher.resume(
                session_id, start, interrupted, take_over, wait, additional_directories
            )
        handle.spec = spec
        text = start.instructions
        if text is not None and handle.agent.session.config.get("instructions") != text:
            handle.agent.configure("instructions", text)
        return handle

    async def fork(
        self,
        session_id: str,
        new_session_id: str,
        *,
        at_turn: int | None = None,
        cwd: str | None = None,
        additional_directories: Sequence[str] | None = None,
        principal: str | None = None,
    ) -> SessionHeader:
        """Store a new session holding `session_id`'s log up to the end of turn `at_turn`
        (default: all of it); returns its header (``forked_from`` names the original;
        its directories are the original's unless `cwd`/`additional_directories` say;
        its owner is `principal`).

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
        return await fork_session(
            self._persistence,
            self._sessions,
            session_id,
            new_session_id,
            at_turn=at_turn,
            cwd=cwd,
            additional_directories=additional_directories,
            principal=principal,
        )

    def _check(self, session_id: str, mcp_servers: Sequence[McpServer]) -> None:
        """Refuse, before anything exists, an id the persistence could not store, and
        servers that could not start."""
        check_session_id(session_id)
        if self._persistence is not None:
            self._persistence.check_session_id(session_id)
        check_servers(mcp_servers)
        if mcp_servers and self._servers is None:
            raise ValueError("mcp_servers given, but this factory has no server hub")

    def _check_resume(
        self,
        session_id: str,
        interrupted: str,
        take_over: str,
        wait: float,
        additional_directories: Sequence[str] | None,
    ) -> None:
        """Refuse, before anything is read, what `resume` cannot do."""
        if self._persistence is None:
            raise RuntimeError(
                f"cannot resume session {session_id!r}: no session persistence is configured"
                " (pass persistence= to open_runtime)"
            )
        if interrupted not in INTERRUPTIONS:
            raise ValueError(
                f"cannot resume session {session_id!r}: interrupted must be one of"
                f" {', '.join(INTERRUPTIONS)}, not {interrupted!r}"
            )
        if take_over not in TAKE_OVERS:
            raise ValueError(
                f"cannot resume session {session_id!r}: take_over must be one of"
                f" {', '.join(TAKE_OVERS)}, not {take_over!r}"
            )
        if take_over == "ask" and not isinstance(self._persistence, HandOff):
            raise ValueError(
                f"cannot resume session {session_id!r} with take_over='ask': its persistence"
                f" ({type(self._persistence).__name__}) cannot ask a holder to let go"
                " (PostgreSQL can)"
            )
        if not isinstance(wait, int | float) or not wait >= 0:
            raise ValueError(f"wait must be seconds >= 0, not {wait!r}")
        if additional_directories is not None:
            if isinstance(additional_directories, str):
                raise TypeError("additional_directories must be a sequence of paths, not a str")
            for path in additional_directories:
                check_directory(session_id, "additional directory", path)

    async def _spec_start(
        self,
        spec: AgentSpec,
        session_id: str,
        owner: Owner | None,
        client: SessionClient | None,
        wait_for_servers: float,
        parent: AgentLife | None = None,
    ) -> AgentStart:
        """The `_Start` of `spec` on `session_id`, its models, tools and instructions made
        real by the resolver."""
        if self._resolver is None:
            raise RuntimeError("this factory has no resolver: it cannot start an AgentSpec")
        resolved = await self._resolver.resolve(spec)
        return AgentStart(
            f"{spec.name}:{session_id}",
            resolved.options,
            owner,
            client,
            spec.mcp_servers,
            parent=parent,
            wait=wait_for_servers,
            models=resolved.models,
            tools=resolved.tools,
            instructions=resolved.instructions,
        )

    async def _spawn(self, parent: AgentLife, child: SpawnArgs) -> AgentHandle:
        """A child of `parent`: a new session naming the parent's, under the parent's owner."""
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
        spec = child.spec
        if spec is not None:
            if not isinstance(spec, AgentSpec):
                raise TypeError(f"spawn() takes an AgentSpec, got {type(spec).__name__}")
            if child.options is not None or child.tools is not None:
                raise TypeError("spawn() of an AgentSpec takes no options or tools: its spec's")
            session_id = child.session_id or f"{spec.name}-{secrets.token_hex(4)}"
            self._check(session_id, spec.mcp_servers)
            start = await self._spec_start(
                spec, session_id, parent.owner, parent.client, math.inf, parent
            )
        else:
            agent_id, named = child.agent_id, child.session_id
            if agent_id is None or named is None:
                missing = [k for k in ("agent_id", "session_id") if getattr(child, k) is None]
                raise TypeError(
                    f"spawn() is missing keyword arguments: {missing} (or give an AgentSpec)"
                )
            if isinstance(child.tools, str):  # a str is a Sequence[str], of one-letter names
                raise TypeError(
                    f"tools must be a sequence of tool names, not the str {child.tools!r}"
                )
            session_id = named
            self._check(session_id, child.mcp_servers)
            tools = None
            if child.tools is not None:
                if self._resolver is None:
                    raise ValueError("tools given, but this factory has no resolver to offer them")
                tools = self._resolver.named(child.tools)
            start = AgentStart(
                agent_id,
                child.options,
                parent.owner,
                parent.client,
                child.mcp_servers,
                parent=parent,
                tools=tools,
            )
        handle = await self._launcher.create(session_id, None, (), start)
        text = start.instructions
        if text is not None:
            handle.agent.configure("instructions", text)
        if spec is not None:
            handle.spec = spec
        return handle
