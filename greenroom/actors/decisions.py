"""`Decisions`: what one agent's turn waits for a person, or an embedder, to decide.

A tool call's permission and an ``ask_user`` question are decisions. Each
is logged (``decision/requested``) and written ahead before anyone is asked;
then the turn waits, parked: the agent's status is ``waiting``, no model
call runs, no tool runs. The first answer wins, from whoever gives it: the
asker the session has (an ACP client, the runtime's policy), or `decide`
(the embedder's `Agent.decide`, a runtime's `decide` routed here). The
answer is logged (``decision/made``, naming who gave it) and the turn goes
on. A turn whose agent is disposed, or whose process dies, while a decision
is open stays parked in the log: repair leaves it open, and the session's
next holder asks again, the same decision (`ask` finds it by its call).

A decision waits at most ``decision_wait`` (`AgentOptions`). A log's open decisions are
`open_decisions` (`open_in`: one by id; `OpenDecision`: one of a stored session); a stored
session's decision is answered by `decide_stored`, and a store's open ones listed by
`stored_decisions`, as `Runtime.decide` and `Runtime.decisions` (and ``greenroom sessions
decide|decisions``) do.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol

import msgspec
import trio

from greenroom.actors.marker import CancelMarker, cancelled_in
from greenroom.actors.status import AgentStatus
from greenroom.actors.step import write_ahead
from greenroom.actors.types import AskerGone, NamedAnswer
from greenroom.parking import Parking
from greenroom.protocol.events import (
    DecisionKind,
    DecisionMade,
    DecisionRequested,
    SessionEvent,
    TurnEnd,
)
from greenroom.session import Session
from greenroom.session.persistence import Persistence, SessionNotFound

#: Who answered when the embedder did (`Agent.decide` without a name of its own).
EMBEDDER: Final = "embedder"

logger = logging.getLogger(__name__)

_PROCESS = secrets.token_hex(4)
_counter = itertools.count(1)


class DecisionRefused(ValueError):
    """An answer to a decision was refused: no such open decision, one answered already
    (naming who answered), or an answer it does not offer."""


class _Waiting:
    """One decision this process waits for: its request, and its answer once given."""

    __slots__ = ("answer", "by", "parked", "request", "scope")

    def __init__(self, request: DecisionRequested) -> None:
        self.request = request
        self.answer: str | None = None
        self.by = ""
        self.scope: trio.CancelScope | None = None  # the asker's, called off by `decide`
        self.parked: Parking | None = None  # who waits when no one is asked


class _Driver(Protocol):
    """What a deadline that passes tells: the turn driver (`TurnDriver.requires_action`)."""

    def requires_action(self) -> None: ...


class Decisions:
    """One agent's decisions (see the module docstring).

    `parked` is true once a disposal (or the owner's cancel) cut a turn that
    waited on one: the turn driver then leaves the turn open in the log. A
    user's cancel is not a disposal: the decision dies with its turn.

    `wait` is how long a decision may wait before the turn's prompts are
    settled ``requires-action`` (`driver`'s ``requires_action``): the turn
    stays parked, and waits on (None: no deadline, the prompts wait too).

    An agent that never asks holds no table: `_open` is made at the first
    decision this life asks or is answered.
    """

    __slots__ = ("_asking", "_marker", "_open", "_session", "_status", "driver", "parked", "wait")

    def __init__(
        self,
        session: Session,
        status: AgentStatus,
        marker: CancelMarker,
        wait: float | None = None,
    ) -> None:
        self._session = session
        self._status = status
        self._marker = marker
        self.wait = wait
        self.driver: _Driver | None = None
        #: By id: the decisions asked now, and those answered before any turn asked them
        #: (kept by the store while stored, or given by `decide` at a resume).
        self._open: dict[str, _Waiting] | None = None
        self._asking = 0  # asks in flight: the agent waits while any is
        self.parked = False

    @property
    def pending(self) -> Sequence[DecisionRequested]:
        """The decisions the open turn waits for now, oldest first, once logged."""
        return self._session.logged_decisions()

    def answered(self, decision_id: str, answer: str, by: str) -> None:
        """An answer the store kept for `decision_id` (a runtime's `decide` while no one
        held the session): the turn that asks it takes it at once. One for no open
        decision, or not among its options, is dropped (a log line says so)."""
        if decision_id not in self._session.decisions:
            return  # logged as made already, or its turn ended
        try:
            self.decide(decision_id, answer, by)
        except DecisionRefused as refused:
            logger.warning("session %r: a kept answer dropped: %s", self._session.id, refused)

    async def ask(
        self,
        call_id: str,
        kind: DecisionKind,
        asker: Callable[[], Awaitable[str | NamedAnswer]] | None,
        asker_name: str,
        *,
        tool: str = "",
        title: str = "",
        arguments: str = "",
        options: Sequence[str] = (),
        question: str = "",
        choices: Sequence[str] = (),
        free_text: bool = False,
    ) -> tuple[str, str]:
        """Log the decision (or find the one a cut turn left open for `call_id`), wait for
        its first answer, log it; returns (the answer, who gave it). `asker` asks whoever
        the session has (None: no one, the answer comes from `decide`); what it returns is
        the answer `asker_name` gave, or a `NamedAnswer` naming who gave it. A cancel ends
        the wait (the decision dies with the turn, or, on a disposal, stays open, parked in
        the log)."""
        session = self._session
        turn = session.open_turn or session.last_turn
        request = None
        if session.decisions:
            request = next((d for d in session.decisions.values() if d.call_id == call_id), None)
        if request is None:
            request = session.append(
                DecisionRequested(
                    turn=turn,
                    decision_id=f"dec-{_PROCESS}-{next(_counter)}",
                    call_id=call_id,
                    kind=kind,
                    tool=tool,
                    title=title,
                    arguments=arguments,
                    options=list(options),
                    question=question,
                    choices=list(choices),
                    free_text=free_text,
                )
            )
            if session.persistent:  # logged before anyone is asked
                await write_ahead(session, "asking")
        table = self._open
        if table is None:
            table = self._open = {}
        waiting = table.get(request.decision_id)
        if waiting is None:
            waiting = table[request.decision_id] = _Waiting(request)
        status = self._status
        self._asking += 1
        status.set("waiting")
        try:
            if waiting.answer is None:
                if self.wait is None and asker is None:
                    # No one to ask: the turn parks here, in this frame, as it does until
                    # `decide`; what it parks holds its task's frames (``bench agents``).
                    while waiting.answer is None:
                        if waiting.parked is None:
                            waiting.parked = Parking()
                        await waiting.parked.park()
                elif self.wait is None:
                    await _answer(waiting, asker, asker_name)
                else:  # the asker asks on past the deadline; the prompts are settled at it
                    async with trio.open_nursery() as asking:
                        asking.start_soon(_answer, waiting, asker, asker_name)
                        with trio.move_on_after(self.wait):
                            await _answered(waiting)
                        if waiting.answer is None and self.driver is not None:
                            self.driver.requires_action()
        except BaseException as exc:
            if self._marker.reason is None and cancelled_in(exc) is not None:
                self.parked = True  # not the user's cancel: a disposal, the owner's
            raise
        finally:
            del table[request.decision_id]
            self._asking -= 1
            if not self._asking:
                status.set("running")
        assert waiting.answer is not None
        answer, by = waiting.answer, waiting.by
        session.append(
            DecisionMade(turn=request.turn, decision_id=request.decision_id, answer=answer, by=by)
        )
        return answer, by

    def decide(self, decision_id: str, answer: str, by: str = EMBEDDER) -> None:
        """Answer the open decision `decision_id`: a permission with one of its options,
        a question with text (one of its choices, unless it takes free text; empty:
        declined). The first answer wins. Raises `DecisionRefused` for an id no turn
        waits for, one answered already (naming who answered), an answer not offered."""
        if not isinstance(answer, str):
            raise TypeError(f"decision {decision_id!r}: the answer must be text, got {answer!r}")
        table = self._open
        waiting = table.get(decision_id) if table is not None else None
        if waiting is None:  # open in the log, asked by no turn yet: kept for the one that asks
            request = self._session.decisions.get(decision_id)
            if request is None:
                raise DecisionRefused(f"no open decision {decision_id!r} in this session")
            _check(request, answer)
            if table is None:
                table = self._open = {}
            waiting = table[decision_id] = _Waiting(request)
            waiting.answer, waiting.by = answer, by
            return
        if waiting.answer is not None:
            raise DecisionRefused(f"decision {decision_id!r} was answered already, by {waiting.by}")
        _check(waiting.request, answer)
        waiting.answer, waiting.by = answer, by
        if waiting.scope is not None:
            waiting.scope.cancel(reason=f"answered by {by}")
        if waiting.parked is not None:
            waiting.parked.wake()


async def _answer(
    waiting: _Waiting, asker: Callable[[], Awaitable[str | NamedAnswer]] | None, asker_name: str
) -> None:
    """Wait for `waiting`'s first answer: the asker's (`decide` calls it off), or, with no
    one to ask, `decide`'s."""
    if asker is not None:
        with trio.CancelScope() as waiting.scope:
            try:
                answer = await asker()
            except AskerGone:  # no one there to answer now: it waits for `decide`
                pass
            else:
                if waiting.answer is None:
                    if isinstance(answer, NamedAnswer):
                        waiting.answer, waiting.by = answer.answer, answer.by
                    else:
                        waiting.answer, waiting.by = answer, asker_name
                    if waiting.parked is not None:
                        waiting.parked.wake()
    if waiting.answer is None:  # no call more when the asker answered
        await _answered(waiting)


async def _answered(waiting: _Waiting) -> None:
    """Park until `waiting` has its answer."""
    while waiting.answer is None:
        if waiting.parked is None:
            waiting.parked = Parking()
        await waiting.parked.park()


class OpenDecision(msgspec.Struct, frozen=True, gc=False):
    """A decision a stored or live session's parked turn waits for (`Runtime.decisions`):
    its session, and its request as logged."""

    session_id: str
    request: DecisionRequested


async def decide_stored(
    store: Persistence, session_id: str, decision_id: str, answer: str, by: str
) -> None:
    """Answer decision `decision_id` of a stored session: its log is read (never written)
    to check the decision is open and offers `answer`, and the answer is kept beside the
    log (`Persistence.put_answer`, first answer wins). Raises `DecisionRefused` as
    `Runtime.decide` says, `SessionNotFound` for a session `store` does not hold."""
    _, events = await store.load(session_id)
    check_answer(open_in(events, decision_id), answer)
    kept, kept_by = await store.put_answer(session_id, decision_id, answer, by)
    if (kept, kept_by) != (answer, by):
        raise DecisionRefused(f"decision {decision_id!r} was answered already, by {kept_by}")


async def stored_decisions(store: Persistence, skip: set[str]) -> list[OpenDecision]:
    """The open decisions of every session `store` holds but those in `skip`, oldest
    first within each, less those answered beside the log and not yet taken. Reads each
    log: its cost grows with the store's size."""
    found: list[OpenDecision] = []
    for stored in await store.list():
        session_id = stored.header.id
        if session_id in skip:
            continue
        try:
            _, events = await store.load(session_id)
        except SessionNotFound:  # deleted since it was listed
            continue
        waiting = open_decisions(events)
        if waiting:
            kept = await store.read_answers(session_id)
            found += [OpenDecision(session_id, r) for r in waiting if r.decision_id not in kept]
    return found


def open_in(events: Sequence[SessionEvent], decision_id: str) -> DecisionRequested:
    """The open decision `decision_id` of a session's log (as a reader loads it); raises
    `DecisionRefused` naming why it is not open: none such, answered (by whom), or its
    turn ended without an answer."""
    ended: set[int] = set()  # the turns that ended after the events read so far
    for event in reversed(events):
        if type(event) is TurnEnd:
            ended.add(event.turn)
        elif type(event) is DecisionMade and event.decision_id == decision_id:
            raise DecisionRefused(f"decision {decision_id!r} was answered already, by {event.by}")
        elif type(event) is DecisionRequested and event.decision_id == decision_id:
            if event.turn in ended:
                raise DecisionRefused(
                    f"decision {decision_id!r} is void: its turn ended unanswered"
                )
            return event
    raise DecisionRefused(f"no decision {decision_id!r} in this session")


def open_decisions(events: Sequence[SessionEvent]) -> list[DecisionRequested]:
    """The decisions the turn a log has open waits for (none when no turn is open)."""
    waiting: dict[str, DecisionRequested] = {}
    for event in events:
        if type(event) is DecisionRequested:
            waiting[event.decision_id] = event
        elif type(event) is DecisionMade:
            waiting.pop(event.decision_id, None)
        elif type(event) is TurnEnd:
            waiting.clear()
    return list(waiting.values())


def check_answer(request: DecisionRequested, answer: str) -> None:
    """Refuse (`DecisionRefused`) an answer `request` does not offer."""
    if not isinstance(answer, str):
        raise TypeError(
            f"decision {request.decision_id!r}: the answer must be text, got {answer!r}"
        )
    _check(request, answer)


def _check(request: DecisionRequested, answer: str) -> None:
    """Refuse an answer `request` does not offer."""
    if request.kind == "permission":
        if answer not in request.options:
            offered = ", ".join(request.options)
            raise DecisionRefused(
                f"decision {request.decision_id!r}: {answer!r} is not an option (offered:"
                f" {offered})"
            )
    elif answer and request.choices and not request.free_text and answer not in request.choices:
        raise DecisionRefused(
            f"decision {request.decision_id!r}: {answer!r} is none of the choices"
            f" ({', '.join(request.choices)})"
        )
