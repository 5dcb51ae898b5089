"""`AgentStatus`: an agent's status (idle, running, waiting, disposed) and who waits for it.

Each wait for it to settle is an `IdleWait`, parked on a `Parking`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any

import trio

from greenroom.actors.events import AGENT_STATUS
from greenroom.actors.life import AgentLife
from greenroom.hooks import Hooks
from greenroom.parking import Parking
from greenroom.protocol.events import StatusName


class AgentStatus:
    """The status the agent's loop moves through, told (``agent/status``) as it moves, and
    the `when_idle` waits it releases.

    ``name`` is the loop's own view; `Agent.status` reads ``disposed`` from the
    moment a dispose began (the life's ``disposing``), before the loop has stopped.
    """

    __slots__ = ("_hooks", "_life", "_waits", "name")

    def __init__(self, life: AgentLife, hooks: Hooks) -> None:
        self._life = life  # and through it, its agent
        self._hooks = hooks
        self.name: StatusName = "idle"
        self._waits: list[IdleWait] | None = None  # made by the first wait

    def set(self, status: StatusName) -> None:
        """Move to `status`, deduplicated; once the life is stopping, every move is to
        ``disposed``, and nothing moves out of it.

        Idle waits are released before the emit, so a listener that sends
        again cannot hold them.
        """
        if self.name == "disposed":
            return
        if self._life.disposing:
            status = "disposed"
        if status == self.name:
            return
        self.name = status
        if status == "idle" or status == "disposed":  # not waiting: a turn waits on a decision
            self.release()
        if AGENT_STATUS in self._hooks.listened:
            self._hooks.emit(AGENT_STATUS, self._life.agent, status)

    def when_idle(self, pending: bool) -> Awaitable[None]:
        """A wait registered now: released at once when idle with nothing `pending`;
        otherwise at the next move to idle (not to ``waiting``: a turn parked on a
        decision is not idle), or a `release` (a cancel or a withdraw left nothing to
        run). Once the agent is disposed (or disposing), it
        returns after the life's task has exited."""
        if self.name == "disposed" or self._life.disposing:
            return IdleWait(self._life, released=True)
        if self.name == "idle" and not pending:
            return IdleWait(None, released=True)
        wait = IdleWait(self._life)
        if self._waits is None:
            self._waits = []
        self._waits.append(wait)
        return wait

    def release(self) -> None:
        """Release every wait registered so far."""
        waits, self._waits = self._waits or (), None
        for wait in waits:
            wait.release()


class IdleWait:
    """What `when_idle` returns: awaited, returns once released (at once if it is), then
    after the life's exit if the agent was disposed by then. Any number of tasks may
    await it, any number of times; a cancelled awaiter leaves nothing behind.

    Not a coroutine: the wait is in every ``send`` + ``when_idle`` turn, and a parked
    awaiter holds no frame of ours."""

    __slots__ = ("_life", "_parked", "_released")

    def __init__(self, life: AgentLife | None, *, released: bool = False) -> None:
        self._life = life
        self._released = released
        self._parked: Parking | None = None  # made by the first to park

    def release(self) -> None:
        self._released = True
        if self._parked is not None:
            self._parked.wake()

    def __await__(self) -> Generator[Any, Any, None]:
        if self._released:
            yield from trio.lowlevel.checkpoint().__await__()  # noqa: ASYNC105 (awaited: yield from)
        else:
            if self._parked is None:
                self._parked = Parking()
            yield from self._parked.park().__await__()
        if self._life is not None and self._life.disposing:
            yield from self._life.wait_exited().__await__()
