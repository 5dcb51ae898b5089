"""What a step may fail with (a step's failure, a guard's trip), the write-ahead that
comes before its side effects, and the log's record of a model call retried.

`StepFailed` is a step that could not finish (the model raised, yielded garbage, or finished
with an error; or its write-ahead failed); `TurnStopped` (`LimitStop`, `GuardTrip`) ends a
turn from inside a step, its calls closed first.
"""

from __future__ import annotations

from typing import Final

from greenroom.protocol.events import (
    Errored,
    Guarded,
    GuardTripped,
    LimitReached,
    ModelRetry,
    SessionEvent,
    TurnEndReason,
)
from greenroom.protocol.model import Retry
from greenroom.session import Session
from greenroom.session.persistence import PersistenceError

#: The error code of a step whose write-ahead failed, and of the answer of a turn whose
#: closing events the store did not take.
PERSISTENCE: Final = "persistence"


class StepFailed(Exception):
    """A step could not finish: the model raised, yielded garbage, or finished with an error."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


async def write_ahead(session: Session, before: str) -> None:
    """Get `session`'s log to the OS before `before` happens; a failure fails the step.

    Nothing the outside world may act on goes ahead of its log: a crash after
    it leaves the log holding it (repair closes it ``interrupted``). Only for
    a session with a sink: the callers check `Session.persistent` first, which
    spares a coroutine per step without one.
    """
    try:
        await session.write_ahead()
    except PersistenceError as exc:
        raise StepFailed(
            f"the session log could not be written before {before}: {exc}", PERSISTENCE
        ) from exc


class TurnStopped(Exception):
    """Something the agent was given to hold a turn to stopped it: raised out of a step,
    through its tool calls (each given a result first), to the turn driver, which ends
    the turn with `reason` and logs `event`, if any."""

    def reason(self, step: int) -> TurnEndReason:
        raise NotImplementedError

    def event(self, turn: int) -> SessionEvent | None:
        return None


class LimitStop(TurnStopped):
    """A count of the agent's `Limits` would pass its limit: `reached` says which."""

    def __init__(self, reached: LimitReached) -> None:
        super().__init__(f"the {reached.limit} limit ({reached.allowed}) was reached")
        self.reached = reached

    def reason(self, step: int) -> LimitReached:
        return self.reached


class GuardTrip(TurnStopped):
    """A `Guard` of the agent stopped the turn: raised by its check, out of the waterfall
    it runs in (``agent/request``, ``tools/execute``, ``agent/step-result``). `raised`:
    the check raised instead of answering (the turn then ends ``error`` naming it, and
    nothing is logged of a trip)."""

    def __init__(
        self,
        guard: str,
        at: str,
        message: str,
        *,
        call_id: str | None = None,
        raised: bool = False,
    ) -> None:
        super().__init__(f"guard {guard!r} at the {at.replace('_', ' ')}: {message}")
        self.guard = guard
        self.at = at
        self.message = message
        self.call_id = call_id
        self.raised = raised

    def reason(self, step: int) -> Guarded | Errored:
        """How the turn ends: ``guarded`` with the message, or ``error`` (code ``guard``)."""
        if self.raised:
            return Errored(step=step, message=f"{self} (it raised)", code="guard")
        return Guarded(guard=self.guard, at=self.at, message=self.message)

    def event(self, turn: int) -> GuardTripped | None:
        """What the log says of it."""
        if self.raised:
            return None
        return GuardTripped(
            turn=turn, guard=self.guard, at=self.at, message=self.message, call_id=self.call_id
        )


def retried(chunk: Retry, turn: int, step: int) -> ModelRetry:
    """The ``model/retry`` a step's (or a side call's) model call logs for `chunk`."""
    return ModelRetry(
        turn=turn,
        step=step,
        attempt=chunk.attempt,
        wait=chunk.wait,
        error=chunk.error,
        code=chunk.code,
    )
