"""The persistence seam, its typed errors, and crash repair (shared by every backend).

The seams: `Persistence` (where logs live between processes: create, open, load, list, delete),
`SessionLog` (a live session's write path: a `SessionSink` with a hold, let go by
`close`) and `HandOff` (a persistence whose holders hear other nodes: `notices`); the sync
policies (`SyncPolicy`: ``turn``, ``always``, ``os``); the typed errors
(`PersistenceError` and its kinds: `SessionLocked`, `LeaseLost`, `OperationTimeout`,
`SessionNotFound`, ...); `repair` (a torn tail dropped, an open final turn closed
``interrupted``, unless `Interruption` ``"continue"`` leaves it open, or it is `parked`
on a decision); the answers kept for a stored session's decisions (`put_answer`,
`read_answers`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Final, Literal, Protocol, TypeAlias, runtime_checkable

import msgspec
from msgspec.structs import force_setattr

from greenroom.protocol.events import (
    DecisionMade,
    DecisionRequested,
    Interrupted,
    SessionEvent,
    SessionHeader,
    StepEnd,
    StepStart,
    ToolCall,
    ToolError,
    ToolResult,
    ToolStart,
    TurnEnd,
    TurnStart,
)
from greenroom.session.session import SessionSink

#: Seconds a store operation (an fsync, a commit, a statement) may take by default before
#: its caller stops waiting (`OperationTimeout`); each persistence takes its own.
DEADLINE: Final = 5.0
#: Seconds a PostgreSQL lease lasts unless renewed (a paused holder is taken over after this).
LEASE_TTL: Final = 10.0

INTERRUPTED_RESULT = "interrupted: the process stopped before this tool call finished"

#: What opening a session does with a final turn a crash left open (no ``turn/end``):
#: ``"close"`` ends it ``interrupted`` (`repair`); ``"continue"`` leaves it open as it was
#: logged, for the agent that takes the session to carry on (docs/semantics.md).
Interruption: TypeAlias = Literal["close", "continue"]
INTERRUPTIONS: Final = ("close", "continue")


class PersistenceError(Exception):
    """A session could not be read or written; the message names the session and where."""


class SessionNotFound(PersistenceError):
    pass


class SessionExists(PersistenceError):
    pass


class NotASessionLog(PersistenceError):
    pass


class UnsupportedVersion(PersistenceError):
    pass


class CorruptLog(PersistenceError):
    """A line that does not decode, or breaks the seq order, before the log's last ``turn/end``."""


class SeqMismatch(PersistenceError):
    """An append whose first seq is not the stored next seq (a gap, or a double write)."""


class Holder(msgspec.Struct, frozen=True, gc=False):
    """Who holds a session live: the process, and the machine it runs on."""

    pid: int
    host: str


class SessionLocked(PersistenceError):
    """The session is live in another process (or another runtime of this one).

    ``holder`` names it as far as the backend knows.
    """

    def __init__(self, session_id: str, holder: Holder | None, where: str) -> None:
        held = f"pid {holder.pid} on host {holder.host}" if holder else "another process"
        super().__init__(f"session {session_id!r} is live in {held} ({where})")
        self.session_id = session_id
        self.holder = holder


class OperationTimeout(PersistenceError):
    """A store operation passed its deadline: its caller stopped waiting.

    What it did is unknown: one its worker had begun may still land (a later
    write of the same log finds it stored and skips it); one not begun never
    runs.
    """


class LeaseLost(PersistenceError):
    """Another holder took the session over: this life may not write to it any more."""


#: When a session log makes what it was given durable (see docs/semantics.md):
#: ``"turn"``: written to the OS before each side effect, one fsync per turn after the turn's
#: end is reported, off the agent's path (the next turn does not wait; dispose and close do);
#: ``"always"``: as ``"turn"``, but a turn's end is reported only after its fsync;
#: ``"os"``: written to the OS, never fsynced (survives the process, not the machine).
SyncPolicy: TypeAlias = Literal["turn", "always", "os"]
SYNC_POLICIES: Final = ("turn", "always", "os")


class StoredSession(msgspec.Struct, frozen=True, gc=False):
    """A stored session as a list shows it: its header, its title, when it last changed.

    ``title`` comes from the first prompt (None before one); ``updated_at`` is
    wall-clock seconds; ``holder`` is who holds it live now, where the store keeps
    that (PostgreSQL's lease: taken, handed off and released), else None.
    """

    header: SessionHeader
    title: str | None
    updated_at: float
    holder: Holder | None = None


#: A session's log, as stores read it whole.
Events: TypeAlias = list[SessionEvent]
#: The sessions a store lists.
Stored: TypeAlias = list[StoredSession]


class SessionLog(SessionSink, Protocol):
    """One live session's write path (the `SessionSink` its `Session` writes through),
    and its hold: no other process may write it meanwhile.

    The sink's contract holds (`append` never blocks or raises; `write_ahead`
    returns once everything appended has reached the OS; `flush` ends a turn
    the way the policy says; a failure is a `PersistenceError`, and the
    events stay with the log for the next call). After `LeaseLost` nothing
    more is written. Every wait is bounded by the persistence's deadline (a
    store that stopped answering fails it with `OperationTimeout`). `close`
    writes and syncs what is left and lets the session go: idempotent, and it
    runs to its end even when its caller is cancelled, within that deadline:
    past it, it lets the session go without its last write (the lock
    released, or the lease left to expire), and the next open repairs what
    the store holds as after a crash.
    """

    async def close(self) -> None: ...


class Persistence(Protocol):
    """Where session logs live between processes.

    * `check_session_id` raises `ValueError` naming the limit for an id the
      backend cannot store (checked before anything is created).
    * `create` stores a header (atomically; a stored id raises
      `SessionExists`) and returns the session's `SessionLog`, held.
    * `open` takes a stored session live: held, loaded and repaired (the
      closers it adds are stored before it returns), with its `SessionLog`;
      with ``interrupted="continue"`` an open final turn stays open (a torn
      last line is still cut).
    * Either raises `SessionLocked` while the session is live elsewhere; the
      hold dies with its holder's process.
    * `load` reads a session, repaired in memory, and writes nothing (so it
      is safe on a session live elsewhere).
    * `list` returns every stored session, most recently changed first.
    * `delete` removes a stored session (a missing one is no error), its
      blobs too; one live anywhere is refused with `SessionLocked`.
    * `put_blobs` stores a session's blobs (the bytes of its prompts' images
      and blob resources, by SHA-256 in hex; one stored already is kept as it
      is), durably unless the policy is ``"os"``, before it returns: the
      ``user/message`` naming them is appended after. `read_blobs` returns
      those of `digests` it holds and leaves out the rest (a reader shows a
      missing one as such); it writes nothing.
    * `put_answer` keeps an answer to one of a session's decisions given while
      no one holds it (`Runtime.decide`), beside its log, never in it: the
      first answer kept wins, and is returned (the answer, who gave it), so a
      second caller learns it lost. `read_answers` returns what is kept, by
      decision id; the session's next holder logs each as ``decision/made`` (its
      live holder, told where the store can tell it: `HandOff.notices`).
    """

    def check_session_id(self, session_id: str) -> None: ...

    async def create(self, header: SessionHeader) -> SessionLog: ...

    async def open(
        self, session_id: str, *, interrupted: Interruption = "close"
    ) -> tuple[SessionHeader, list[SessionEvent], SessionLog]: ...

    async def load(self, session_id: str) -> tuple[SessionHeader, list[SessionEvent]]: ...

    async def list(self) -> list[StoredSession]: ...

    async def delete(self, session_id: str) -> None: ...

    async def put_blobs(self, session_id: str, blobs: Mapping[str, bytes]) -> None: ...

    async def read_blobs(self, session_id: str, digests: Sequence[str]) -> dict[str, bytes]: ...

    async def put_answer(
        self, session_id: str, decision_id: str, answer: str, by: str
    ) -> tuple[str, str]: ...

    async def read_answers(self, session_id: str) -> dict[str, tuple[str, str]]: ...


@runtime_checkable
class ReleaseAsked(Protocol):
    """Another node asked this one to let `session_id` go (`HandOff.notices`)."""

    session_id: str

    async def refuse(self, reason: str) -> None: ...


class AnswerKept(Protocol):
    """Another node kept an answer to decision `decision_id` of `session_id`, live here
    (`HandOff.notices`): it is in the store (`read_answers`), for the holder to log."""

    @property
    def session_id(self) -> str: ...

    @property
    def decision_id(self) -> str: ...


@runtime_checkable
class HandOff(Protocol):
    """A persistence whose holders hear other nodes (PostgreSQL's): let a session go when
    another node asks, take an answer another node kept.

    * `open_handed_off` is `open`, asking the live holder, if any, to let the session
      go, and waiting up to `wait` seconds for it: past that, or at a refusal,
      `SessionLocked` naming the holder.
    * `notices` yields what other nodes tell this one, as it comes: requests to let a
      session go (`ReleaseAsked`), which the runtime answers (`ReleaseDesk`): an idle
      session is disposed at once (its lease freed), a busy one after its turn, or,
      with `keep_busy`, refused; and answers kept for a decision of a session live
      here (`AnswerKept`, sent by `put_answer` to the holder the session's row names),
      which the runtime reads (`read_answers`) and gives the agent.
    """

    keep_busy: bool

    def notices(self) -> AsyncGenerator[ReleaseAsked | AnswerKept, None]: ...

    async def open_handed_off(
        self, session_id: str, *, interrupted: Interruption = "close", wait: float
    ) -> tuple[SessionHeader, list[SessionEvent], SessionLog]: ...

    async def read_answers(self, session_id: str) -> dict[str, tuple[str, str]]: ...


def parked(turn_events: Sequence[SessionEvent]) -> bool:
    """Whether a turn the log has open (its events from its ``turn/start`` on) is parked:
    it waits on a decision (a ``decision/requested`` without its ``decision/made``), and
    every call of it without a result is one such decision's: a permission's call not
    started, or the ``ask_user`` call whose question it is (asking is all that call
    does). Nothing was in flight but the wait, so the turn goes on where it stopped,
    asked again."""
    open_calls: dict[str, str] = {}  # decision id -> its call
    questions: set[str] = set()  # the calls that are questions, safe to ask again
    answered: set[str] = set()
    started: set[str] = set()
    logged: set[str] = set()
    for event in turn_events:
        if isinstance(event, DecisionRequested):
            open_calls[event.decision_id] = event.call_id
            if event.kind == "question":
                questions.add(event.call_id)
        elif isinstance(event, DecisionMade):
            open_calls.pop(event.decision_id, None)
        elif isinstance(event, ToolCall):
            logged.add(event.call_id)
        elif isinstance(event, ToolStart):
            started.add(event.call_id)
        elif isinstance(event, ToolResult):
            answered.add(event.call_id)
    waiting = set(open_calls.values())
    unanswered = logged - answered
    return bool(waiting) and bool(unanswered) and unanswered <= waiting - (started - questions)


def repair(
    events: Sequence[SessionEvent], interrupted: Interruption = "close"
) -> list[SessionEvent]:
    """The closers of an open final turn: what a crash mid-turn left unsaid.

    For each tool call of that turn without a result, an error ``tool/result``
    (code ``interrupted``); then ``step/end`` if a step is open; then
    ``turn/end {interrupted}``. Empty when the log ends between turns, and
    with ``interrupted="continue"`` (the turn is the next holder's to carry
    on). The closers carry the seqs that follow the log.
    """
    if interrupted == "continue":
        return []
    start = None
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if isinstance(event, TurnEnd):
            return []
        if isinstance(event, TurnStart):
            start = index
            break
    if start is None:
        return []
    turn_events = events[start:]
    if parked(turn_events):  # waiting on a person: the next holder asks again
        return []
    turn = turn_events[0].turn  # type: ignore[union-attr]
    answered = {e.call_id for e in turn_events if isinstance(e, ToolResult)}
    closers: list[SessionEvent] = [
        ToolResult(
            turn=turn,
            step=call.step,
            call_id=call.call_id,
            content=INTERRUPTED_RESULT,
            is_error=True,
            error=ToolError(name="Interrupted", code="interrupted"),
        )
        for call in turn_events
        if isinstance(call, ToolCall) and call.call_id not in answered
    ]
    open_step = 0
    for event in turn_events:
        if isinstance(event, StepStart):
            open_step = event.step
        elif isinstance(event, StepEnd):
            open_step = 0
    if open_step:
        closers.append(StepEnd(turn=turn, step=open_step))
    closers.append(TurnEnd(turn=turn, reason=Interrupted()))
    now = time.time()
    for offset, closer in enumerate(closers):
        force_setattr(closer, "seq", len(events) + offset)
        force_setattr(closer, "time", now)
    return closers
