"""`ReleaseDesk`: where other nodes' notices about this node's live sessions are heard.

With a `HandOff` persistence (PostgreSQL), a node that wants a session live
here asks for it (`resume(..., take_over="ask")`); the desk disposes the
session's agent, which frees its lease as its log closes: at once when idle,
after its turn when busy, or it refuses (``keep_busy``). A node that kept an
answer to a decision of a session live here says so; the desk reads it from
the store and gives it to the agent (`Agent.decide`), which logs it. It
starts listening at the first session the factory takes live, as a temporary
child of the default owner, so it ends with the runtime.
"""

from __future__ import annotations

import logging
from contextlib import aclosing

import trio

from greenroom.actors.decisions import DecisionRefused
from greenroom.actors.events import AGENT_DISPOSED
from greenroom.actors.life import AgentHandle, Owner
from greenroom.actors.types import Agent
from greenroom.hooks import Hooks
from greenroom.session.persistence import AnswerKept, HandOff, PersistenceError, ReleaseAsked
from greenroom.supervisor import ChildSpec, Supervisor

logger = logging.getLogger("greenroom.agent")


class ReleaseDesk:
    """The handle of each session live here, and the task that answers release requests."""

    __slots__ = ("_answering", "_handles", "_owner", "_persistence")

    def __init__(self, hooks: Hooks, persistence: HandOff, owner: Owner) -> None:
        self._persistence = persistence
        self._owner = owner
        self._handles: dict[str, AgentHandle] = {}
        self._answering = False
        hooks.on(AGENT_DISPOSED, self._forget)

    async def open(self) -> None:
        """Start answering, once (a no-op after the first call)."""
        if self._answering:
            return
        self._answering = True
        owner = self._owner
        if isinstance(owner, Supervisor):
            await owner.start_child(ChildSpec("hand-off", self._answer, restart="temporary"))
        else:
            await owner.start(self._answer)

    def hold(self, session_id: str, handle: AgentHandle) -> None:
        """`handle`'s agent is the live holder of `session_id` here."""
        self._handles[session_id] = handle

    def _forget(self, agent: Agent) -> None:
        handle = self._handles.get(agent.session.id)
        if handle is not None and handle.agent is agent:
            del self._handles[agent.session.id]

    async def _answer(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        persistence = self._persistence
        async with trio.open_nursery() as nursery, aclosing(persistence.notices()) as notices:
            task_status.started()
            async for notice in notices:
                if isinstance(notice, ReleaseAsked):
                    nursery.start_soon(self._let_go, notice, persistence.keep_busy)
                else:
                    nursery.start_soon(self._take_answer, notice)

    async def _let_go(self, request: ReleaseAsked, keep_busy: bool) -> None:
        """Dispose the asked session's agent here (its lease freed by the close) at once
        when idle, after its turn when busy, or, with `keep_busy`, refuse. A session not
        live here is left alone: its asker sees the lease as it is."""
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

    async def _take_answer(self, notice: AnswerKept) -> None:
        """Give the agent live here the answer another node kept (the first kept: the
        store's). One its turn no longer waits for, or answered here first, is dropped."""
        handle = self._handles.get(notice.session_id)
        if handle is None:
            return
        try:
            kept = await self._persistence.read_answers(notice.session_id)
            answer = kept.get(notice.decision_id)
            if answer is not None and handle.agent.session.decisions.get(notice.decision_id):
                handle.agent.decide(notice.decision_id, *answer)
        except (DecisionRefused, PersistenceError) as exc:
            logger.info("answer to %r not taken: %s", notice.decision_id, exc)
