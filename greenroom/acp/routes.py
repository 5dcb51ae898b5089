"""What the runtime tells (its hooks), routed to the connections of a server that hold
each session.

Over stdio a connection listens to the runtime's hooks itself: it is the only one.
A server's connections, each listening so, would each be told every event of every
session and look up whether it holds that session: a prompt would cost every
connection of the server (2,100 Python calls with no other client, 14,700 with 300
idle ones). `SessionRoutes` listens once for all of them and tells each event only to
the connections that hold its session (`Watch.hold`): a connection holds a session
from the request that starts it to its end there (`table.SessionTable`), and a
sub-agent's session while it follows it (`progress.SubagentProgress`).

A listener that raises is logged and the others are told, as `Hooks.emit` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from greenroom.actors.events import AGENT_STATUS, AGENT_TOOL_PROGRESS, SUBAGENT_STARTED
from greenroom.actors.types import Agent
from greenroom.hooks import Hooks
from greenroom.protocol.events import SessionEvent, StatusName, ToolProgress
from greenroom.protocol.mcp import McpStatus
from greenroom.session import SESSION_EVENT, Session
from greenroom.supervisor import Scope
from greenroom.tools.mcp import MCP_PROMPTS, MCP_STATUS, McpPrompts

__all__ = ["Listener", "SessionRoutes", "Unrouted", "Watch", "subscribe"]

logger = logging.getLogger("greenroom.acp")


class Listener(Protocol):
    """What a connection does with what the runtime tells of a session it holds."""

    def on_event(self, session: Session, event: SessionEvent) -> None: ...

    def on_server(self, agent: Agent, status: McpStatus) -> None: ...

    def on_subagent(self, parent: Agent, call_id: str, child: Agent) -> None: ...

    def on_status(self, agent: Agent, status: StatusName) -> None: ...

    def on_progress(self, agent: Agent, progress: ToolProgress) -> None: ...

    def on_prompts(self, agent: Agent, prompts: McpPrompts) -> None: ...


class Watch(Protocol):
    """A connection's sessions, as its routes know them: `hold` a session to be told of
    it, `let_go` to be told no more (once for each `hold`)."""

    def hold(self, session_id: str) -> None: ...

    def let_go(self, session_id: str) -> None: ...


def subscribe(hooks: Hooks, listener: Listener, scope: Scope) -> None:
    """`listener` is told of every session (until `scope` closes): the one connection of
    stdio, which holds every session it hears of, or a server's `SessionRoutes`."""
    hooks.on(SESSION_EVENT, listener.on_event, scope=scope)
    hooks.on(MCP_STATUS, listener.on_server, scope=scope)
    hooks.on(SUBAGENT_STARTED, listener.on_subagent, scope=scope)
    hooks.on(AGENT_STATUS, listener.on_status, scope=scope)
    hooks.on(AGENT_TOOL_PROGRESS, listener.on_progress, scope=scope)
    hooks.on(MCP_PROMPTS, listener.on_prompts, scope=scope)


class Unrouted:
    """The `Watch` of a connection that listens to the hooks itself: nothing to route."""

    __slots__ = ()

    def hold(self, session_id: str) -> None:
        pass

    def let_go(self, session_id: str) -> None:
        pass


class SessionRoutes:
    """The connections of one server, by the sessions each holds (see the module
    docstring). Listens once `subscribe` is called with it; `watch` gives a connection
    its `Watch`."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        #: By session id: the listeners holding it, each with how many holds it has.
        self._held: dict[str, dict[Listener, int]] = {}

    def watch(self, listener: Listener) -> Watch:
        return _Routed(self, listener)

    def hold(self, session_id: str, listener: Listener) -> None:
        held = self._held.setdefault(session_id, {})
        held[listener] = held.get(listener, 0) + 1

    def let_go(self, session_id: str, listener: Listener) -> None:
        held = self._held.get(session_id)
        if held is None or listener not in held:
            return
        if held[listener] > 1:
            held[listener] -= 1
        elif len(held) > 1:
            del held[listener]
        else:
            del self._held[session_id]

    def _told(self, session_id: str) -> list[Listener]:
        held = self._held.get(session_id)
        return list(held) if held else []  # as in on_event

    def on_event(self, session: Session, event: SessionEvent) -> None:
        # Each event of every session comes here: the lookup is inline, no call per event.
        held = self._held.get(session.id)
        if held is None:
            return
        for listener in list(held):  # a listener may let go while it is told
            try:
                listener.on_event(session, event)
            except Exception:
                logger.exception("ACP listener %r raised", listener)

    def on_server(self, agent: Agent, status: McpStatus) -> None:
        for listener in self._told(agent.session.id):
            _call(listener.on_server, agent, status)

    def on_subagent(self, parent: Agent, call_id: str, child: Agent) -> None:
        for listener in self._told(parent.session.id):
            _call(listener.on_subagent, parent, call_id, child)

    def on_status(self, agent: Agent, status: StatusName) -> None:
        for listener in self._told(agent.session.id):
            _call(listener.on_status, agent, status)

    def on_progress(self, agent: Agent, progress: ToolProgress) -> None:
        for listener in self._told(agent.session.id):
            _call(listener.on_progress, agent, progress)

    def on_prompts(self, agent: Agent, prompts: McpPrompts) -> None:
        for listener in self._told(agent.session.id):
            _call(listener.on_prompts, agent, prompts)


class _Routed:
    __slots__ = ("_listener", "_routes")

    def __init__(self, routes: SessionRoutes, listener: Listener) -> None:
        self._routes = routes
        self._listener = listener

    def hold(self, session_id: str) -> None:
        self._routes.hold(session_id, self._listener)

    def let_go(self, session_id: str) -> None:
        self._routes.let_go(session_id, self._listener)


def _call(handler: Callable[..., object], *args: object) -> None:
    try:
        handler(*args)
    except Exception:
        logger.exception("ACP listener %r raised", handler)
