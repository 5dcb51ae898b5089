"""`CancelMarker`: the turn-scoped cancel marker, and the turns' scope a cancel reaches.

Everything that stops an agent's work goes through this one object:

* the **marker** (``reason``), armed by `Agent.cancel` only when something is
  running or pending, and read, always through `take`, at every
  turn-decision point: window 1 after the wake-up, window 2 after the status
  flips to running, window 3 before each step, window 4 after the
  continuation decision (a cancel that lands after a turn's last window is
  taken at window 1 of the next wake-up, where it drops nothing sent after
  it);
* the **turns' scope** (``turns``), one `trio.CancelScope` around every turn
  from the agent's first wake-up with work on (and the idle waits between
  them), cancelled with the caller's reason while a turn runs (``running``),
  so an in-flight model call or tool call stops at its next checkpoint; the
  turn it cuts ends ``aborted`` and raises the `Cancelled` on up, the scope
  catches it, and the next wake-up enters a new one. A turn has no scope of
  its own: entering and leaving one was the largest cost of a turn, and an
  agent that never had work holds none.
"""

from __future__ import annotations

from typing import Final

import trio

DEFAULT_CANCEL_REASON: Final = "cancelled"
#: The reason of the turns' scope's cancel when the agent is disposed (`LoopAgent.stop`).
DISPOSED_REASON: Final = "disposed"


class CancelMarker:
    """One agent's cancel marker and the turns' scope (see the module docstring).

    The agent's loop sets ``turns`` around its turns; the turn driver sets
    ``running`` to it while a turn runs. Nothing here checkpoints.
    """

    __slots__ = ("reason", "running", "turns")

    def __init__(self) -> None:
        #: The reason of a cancel since the last `take`: armed while not None.
        self.reason: str | None = None
        #: The turns' scope, held from a wake-up with work on (None before the first).
        self.turns: trio.CancelScope | None = None
        #: The turns' scope while a turn runs in it, else None.
        self.running: trio.CancelScope | None = None

    def arm(self, reason: str) -> None:
        """Arm the marker with `reason`, and cancel the running turn, if any, with it."""
        self.reason = reason
        if self.running is not None:
            self.running.cancel(reason=reason)

    def take(self) -> str | None:
        """Read and clear the marker: the reason of a cancel since the last take."""
        reason, self.reason = self.reason, None
        return reason

    def cut(self, reason: str) -> None:
        """Cancel the running turn, if any, without arming the marker (a disposal)."""
        if self.running is not None:
            self.running.cancel(reason=reason)

    @property
    def turns_cancelled(self) -> bool:
        """True once the turns' scope was cancelled (by `arm` or `cut`), so a `Cancelled`
        reaching a turn is the agent's own, not its owner's."""
        return self.turns is not None and self.turns.cancel_called


def cancelled_in(exc: BaseException) -> trio.Cancelled | None:
    """The `trio.Cancelled` in `exc`: bare, or inside the group a nursery wraps it in."""
    if isinstance(exc, trio.Cancelled):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = cancelled_in(inner)
            if found is not None:
                return found
    return None
