"""What a step may fail with, and the write-ahead that comes before its side effects."""

from __future__ import annotations

from typing import Final

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
