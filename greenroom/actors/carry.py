"""Carrying on a turn a crash cut: the session's next holder goes on where its log stops.

`AgentFactory.resume(..., interrupted="continue")` makes the agent with the
`continued_prompt` of the turn the log has open; the agent's first turn is
`carried_on`'s body, run by the `TurnDriver`: it logs ``turn/resumed``,
mends the step the crash cut (docs/semantics.md, "Durable turns"), and goes
on with the turn's steps.

`CarriedOn` is that first turn's body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from greenroom.actors.events import AGENT_TURN_START
from greenroom.actors.marker import DEFAULT_CANCEL_REASON, cancelled_in
from greenroom.actors.prompt import Prompt
from greenroom.actors.step import write_ahead
from greenroom.actors.turn import TurnDriver
from greenroom.actors.types import Agent, ToolOutcome
from greenroom.hooks import Hooks
from greenroom.protocol.events import (
    COMPLETED,
    AssistantMessage,
    MessageTrigger,
    SessionEvent,
    SteeringMessage,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    ToolStart,
    TurnEndReason,
    TurnResumed,
    TurnStart,
    UserMessage,
)
from greenroom.session import Session

#: The result of a call a crash cut after it was logged, whose tool is not safe to repeat.
CUT_CALL: Final = ToolOutcome.failed(
    "interrupted: the process stopped while this tool call was running, so it may or may"
    " not have taken effect; check before running it again",
    "interrupted",
    "Interrupted",
)


def continued_prompt(session: Session) -> Prompt[None] | None:
    """The prompt of the turn the log has open, to carry it on (`LoopAgent(resumed=...)`):
    made of its first ``user/message``. None when no turn is open, or the open one is not
    a prompt's (an injection, a setting, a compaction: `repair` closes those)."""
    if session.open_turn is None:
        return None
    _, start = open_turn_of(session)
    events = session.events
    opened = events[start]
    if not isinstance(opened, TurnStart) or type(opened.trigger) is not MessageTrigger:
        return None
    for event in events[start + 1 :]:
        if type(event) is UserMessage:
            return Prompt(session, event.content, event.source, event.message_id, None)
    return None


def open_turn_of(session: Session) -> tuple[int, int]:
    """The turn the log has open and the seq of its ``turn/start``."""
    events = session.events
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if isinstance(event, TurnStart):
            return event.turn, index
    raise ValueError(f"session {session.id!r} has no open turn")


class CarriedOn:
    """The body of the turn a crash cut (`TurnDriver.run(..., body=...)`), carried on
    from where its log stops with `prompt`, its `continued_prompt`."""

    __slots__ = ("_agent", "_driver", "_hooks", "_prompt", "_session")

    def __init__(
        self, agent: Agent, session: Session, hooks: Hooks, driver: TurnDriver, prompt: Prompt[None]
    ) -> None:
        self._agent = agent
        self._session = session
        self._hooks = hooks
        self._driver = driver
        self._prompt = prompt

    async def __call__(self, turn: int, start: int) -> TurnEndReason:
        self._hooks.emit(AGENT_TURN_START, self._agent, turn)
        if self._session.blobs_wanted:  # its prompt's images, for the model
            await self._session.hold_blobs({})
        step = await self._mend(turn, start)
        if step is None:  # its last reply was logged whole, and nothing asked for more
            return COMPLETED
        return await self._driver.steps(turn, [self._prompt], None, step)

    async def _mend(self, turn: int, start: int) -> int | None:
        """Log `TurnResumed` and mend the step the crash cut; returns the step after which
        the turn goes on, or None when it was done but for its ``turn/end``.

        A step whose reply was not fully logged is closed as it stands, and
        the next step asks the model again; a reply logged whole is never
        asked for again. A call of it with no result is run again when it had
        been logged (so may have run) and its tool is safe to repeat
        (``read``, or idempotent), given an ``interrupted`` result when it is
        not, and run when the log never reached it (it had not run). A call
        that waited on an open decision (a parked turn's) is run, its decision
        asked again: a permission's call had not started, and an ``ask_user``
        call only asks. A steering message logged after the
        last reply asks for another step.
        """
        session, driver = self._session, self._driver
        cut = _cut_step(session.events[start:])
        message = cut.message
        if message is None or not message.tool_calls:
            session.append(
                TurnResumed(turn=turn, step=cut.step, requested=cut.open and message is None)
            )
            if cut.open:
                driver.open_step = cut.step
                driver.close_step(turn)
            done = message is not None or (cut.step > 0 and not cut.open)
            return None if done and not cut.steered else cut.step
        tools, calls_log = driver.tools, driver.calls
        calls = [call for call in message.tool_calls if call.call_id not in cut.answered]
        views = [tools.describe(call.name, call.arguments) for call in calls]
        safe = {
            call.call_id
            for call, view in zip(calls, views, strict=True)
            if view.kind == "read" or view.idempotent
        }
        # A call waiting on an open decision is asked again, never cut: a permission's had
        # not started; an ask_user call does nothing but ask.
        waits = {
            request.call_id
            for request in session.decisions.values()
            if request.kind == "question" or request.call_id not in cut.started
        }
        safe |= waits
        started = [call.call_id for call in calls if call.call_id in cut.logged]
        session.append(
            TurnResumed(
                turn=turn,
                step=cut.step,
                rerun=[call_id for call_id in started if call_id in safe - waits],
                interrupted=[call_id for call_id in started if call_id not in safe],
                waiting=[call_id for call_id in started if call_id in waits],
            )
        )
        driver.open_step = cut.step
        logged, results = cut.logged, list(cut.answered)
        try:
            for call, view in zip(calls, views, strict=True):
                if call.call_id in logged and call.call_id not in safe:
                    calls_log.log_result(turn, cut.step, call, CUT_CALL)
                    results.append(call.call_id)
                    continue
                if call.call_id not in logged:
                    calls_log.log_call(turn, cut.step, call, view)
                    logged.add(call.call_id)
                if session.persistent:
                    await write_ahead(session, f"tool call {call.name!r}")
                await calls_log.run_one(turn, cut.step, call, results, tools)
        except BaseException as exc:  # every call gets a result: the history stays valid
            cancel = cancelled_in(exc)
            if cancel is not None and self._driver.parked:
                raise  # disposed while asked again: parked in the log as it stands
            unrun = ToolOutcome.failed(f"not run: {exc}", "not-run", "NotRun")
            aborted = unrun
            if cancel is not None:
                reason = cancel.reason or DEFAULT_CANCEL_REASON
                unrun = ToolOutcome.failed(
                    f"not run: the turn was cancelled ({reason}) before it started",
                    "not-run",
                    "NotRun",
                )
                aborted = ToolOutcome.failed(f"aborted: {reason}", "aborted", "Cancelled")
            ran_calls = calls_log.started(turn, cut.step)
            for call, view in zip(calls, views, strict=True):
                if call.call_id not in logged:
                    calls_log.log_call(turn, cut.step, call, view)
                if call.call_id not in results:
                    ran = call.call_id in ran_calls
                    calls_log.log_result(turn, cut.step, call, aborted if ran else unrun)
            raise
        driver.close_step(turn)
        return cut.step


class _Cut:
    """Where a cut turn's log stops: its last step, that step's reply, its calls."""

    __slots__ = ("answered", "logged", "message", "open", "started", "steered", "step")

    def __init__(self) -> None:
        self.step = 0  # the last step started, 0 if none
        self.open = False  # that step has no step/end
        self.message: AssistantMessage | None = None  # that step's reply, if logged whole
        self.logged: set[str] = set()  # its calls logged (so they may have run)
        self.answered: set[str] = set()  # its calls with a result
        self.started: set[str] = set()  # its calls that started (``tool/start``)
        self.steered = False  # a steering message since its reply


def _cut_step(events: Sequence[SessionEvent]) -> _Cut:
    """Read a cut turn's events (from its ``turn/start`` on)."""
    cut = _Cut()
    for event in events:
        match event:
            case StepStart(step=step):
                cut = _Cut()
                cut.step, cut.open = step, True
            case StepEnd():
                cut.open = False
            case AssistantMessage():
                cut.message, cut.steered = event, False
            case ToolCall(call_id=call_id):
                cut.logged.add(call_id)
            case ToolStart(call_id=call_id):
                cut.started.add(call_id)
            case ToolResult(call_id=call_id):
                cut.answered.add(call_id)
            case SteeringMessage():
                cut.steered = True
    return cut
