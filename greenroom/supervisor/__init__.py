"""Floor 2: generic structured concurrency (no agent vocabulary here).

`Scope` is an ordered LIFO chain of disposers; `Supervisor` runs children
under OTP strategies with ordered, graced shutdown; `cleanup_scope` is the
shielded scope a child's cleanup runs in, cut off when its grace runs out.
"""

from greenroom.backoff import Backoff
from greenroom.supervisor.scope import Scope
from greenroom.supervisor.spec import (
    ChildNode,
    ChildSpec,
    ChildStart,
    ExitRecord,
    Outcome,
    Restart,
    Shutdown,
    Strategy,
    SupervisorEscalation,
    SupervisorTree,
)
from greenroom.supervisor.supervisor import Supervisor, cleanup_scope, supervisor_child

__all__ = [
    "Backoff",
    "ChildNode",
    "ChildSpec",
    "ChildStart",
    "ExitRecord",
    "Outcome",
    "Restart",
    "Scope",
    "Shutdown",
    "Strategy",
    "Supervisor",
    "SupervisorEscalation",
    "SupervisorTree",
    "cleanup_scope",
    "supervisor_child",
]
