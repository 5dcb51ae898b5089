"""What a supervisor is told (child specs) and what it tells (exit
records, the tree).

Specs hold functions, so they are plain frozen dataclasses checked at
construction; records and trees are msgspec Structs, so they can go on a wire
or into a log as they are.

`ChildSpec` (a child: its name, start, restart type, shutdown grace, and ``stop`` for a
child asked to stop rather than cancelled), `ExitRecord` (one exit of one child),
`SupervisorTree` (a supervisor's children as a value), `SupervisorEscalation` (past the
restart intensity).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeAlias

import msgspec
import trio

Restart: TypeAlias = Literal["permanent", "transient", "temporary"]
Strategy: TypeAlias = Literal["one_for_one", "one_for_all", "rest_for_one"]
Shutdown: TypeAlias = float | Literal["brutal", "infinity"]
Outcome: TypeAlias = Literal["normal", "error", "cancelled", "shutdown", "killed"]
ChildState: TypeAlias = Literal["starting", "running", "stopping", "exited", "terminated"]

RESTARTS: Final = frozenset({"permanent", "transient", "temporary"})
STRATEGIES: Final = frozenset({"one_for_one", "one_for_all", "rest_for_one"})


class ChildStart(Protocol):
    """A child's body: ``async def start(*, task_status)``.

    It calls ``task_status.started(value)`` once it is up (the value is what
    `Supervisor.start_child` returns), then runs until it returns, raises, or
    is cancelled by its supervisor.
    """

    def __call__(self, *, task_status: trio.TaskStatus[Any]) -> Awaitable[object]: ...


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to start one child, when to restart it, and how long it may take to stop.

    * ``restart``: ``"permanent"`` (always restarted), ``"transient"``
      (restarted only after an abnormal exit: an error, or a kill), or
      ``"temporary"`` (never restarted; forgotten once it exits).
    * ``shutdown``: the grace in seconds the child gets to finish its cleanup
      after its cancel, ``"brutal"`` (no grace: its cleanup scopes are cut off
      at once), or ``"infinity"`` (the supervisor waits as long as it takes;
      the default for nested supervisors).
    * ``stop``: for a child that ends on its own when asked (an agent's life).
      The supervisor then stops it by calling ``stop()`` (it must not
      checkpoint) instead of cancelling it, and runs it without a cancel scope
      of its own (~700 B less per child), shielded with the other such
      children in one scope of the supervisor's. Its grace bounds the wait,
      not its cleanup: `cleanup_scope` is not cut off in it, and the only
      cancel it sees is the one at the supervisor's very end, if it still runs.

    Raises `ValueError` naming the child and the field when a value is out of range.
    """

    name: str
    start: ChildStart
    restart: Restart = "permanent"
    shutdown: Shutdown = 5.0
    stop: Callable[[], object] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ChildSpec.name must be a non-empty string, got {self.name!r}")
        if not callable(self.start):
            raise TypeError(f"child {self.name!r}: start must be an async callable")
        if self.stop is not None and not callable(self.stop):
            raise TypeError(f"child {self.name!r}: stop must be a callable or None")
        if self.restart not in RESTARTS:
            raise ValueError(
                f"child {self.name!r}: unknown restart type {self.restart!r}"
                f" (expected one of {sorted(RESTARTS)})"
            )
        shutdown = self.shutdown
        if shutdown in ("brutal", "infinity"):
            return
        if (
            isinstance(shutdown, bool)
            or not isinstance(shutdown, int | float)
            or not math.isfinite(shutdown)
            or shutdown < 0
        ):
            raise ValueError(
                f"child {self.name!r}: shutdown must be a grace >= 0 seconds,"
                f' "brutal" or "infinity", got {shutdown!r}'
            )


class ExitRecord(msgspec.Struct, frozen=True):
    """One child exit, as the supervisor saw it.

    ``outcome``: ``normal`` (returned), ``error`` (raised, or failed to
    start), ``cancelled`` (stopped by the restart strategy because a sibling
    failed), ``shutdown`` (stopped by its supervisor closing or by
    `stop_child`/`restart_child`, within its grace), ``killed`` (stopped, but
    still running when its grace ran out). ``restarts`` is how often this
    child had been restarted before this exit; ``time`` is `trio.current_time()`.
    """

    child: str
    outcome: Outcome
    restarts: int
    time: float
    supervisor: str
    exception: str | None = None


class ChildNode(msgspec.Struct, frozen=True):
    """One child in a `SupervisorTree`."""

    name: str
    state: ChildState
    restart: Restart
    restarts: int
    supervisor: SupervisorTree | None = None


class SupervisorTree(msgspec.Struct, frozen=True):
    """A snapshot of a live supervision tree: `Supervisor.tree()`."""

    name: str
    strategy: Strategy
    intensity: int
    period: float
    closed: bool
    children: list[ChildNode]

    def render(self) -> str:
        """The tree as indented text, one line per supervisor and child."""
        lines = [self._headline()]
        self._render_children(lines, "")
        return "\n".join(lines)

    def _headline(self) -> str:
        state = "closed" if self.closed else "up"
        return (
            f"{self.name} [{self.strategy}, {self.intensity} restarts in {self.period:g}s, {state}]"
        )

    def _render_children(self, lines: list[str], prefix: str) -> None:
        for index, child in enumerate(self.children):
            last = index == len(self.children) - 1
            branch, indent = ("└── ", "    ") if last else ("├── ", "│   ")
            text = f"{child.name}  {child.state}  {child.restart}  restarts={child.restarts}"
            if child.supervisor is not None:
                text += "  " + child.supervisor._headline()
            lines.append(prefix + branch + text)
            if child.supervisor is not None:
                child.supervisor._render_children(lines, prefix + indent)


class SupervisorEscalation(Exception):
    """A supervisor gave up: more restarts than its intensity allows.

    Raised out of the supervisor's ``async with`` after every child has been
    stopped in reverse start order. ``exits`` holds the exit records inside
    the intensity window that led to it, oldest first. A parent supervisor
    counts it as one failure of the child that ran this supervisor.
    """

    def __init__(self, supervisor: str, intensity: int, period: float, exits: list[ExitRecord]):
        self.supervisor = supervisor
        self.exits = exits
        super().__init__(
            f"supervisor {supervisor!r} exceeded {intensity} restarts in {period:g}s;"
            f" last exit: {exits[-1].child!r} ({exits[-1].outcome})"
            if exits
            else f"supervisor {supervisor!r} exceeded {intensity} restarts in {period:g}s"
        )
