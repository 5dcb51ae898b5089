"""`LoopAgent`: the turn driver, and the cancel marker it checks.

One agent is one Trio task running `LoopAgent.drive` inside its `AgentLife`.
Its loop parks on the inbox, then runs one turn at a time; a turn runs steps
(one model call plus its tool calls each) until nothing asks for another.
Everything that stops work goes through two objects:

* the **cancel marker** (``_cancel_reason``), armed by `cancel` only when
  something is running or pending, and read, always through `_take_cancel`,
  at every turn-decision point: window 1 after the wake-up, window 2 after
  the status flips to running, window 3 before each step, window 4 after the
  continuation decision (a cancel that lands after a turn's last window is
  taken at window 1 of the next wake-up, where it drops nothing sent after it);
* the **turns' scope**, one `trio.CancelScope` around every turn from the
  first wake-up with work on (and the idle waits between them), which
  `cancel` cancels with the caller's reason while a turn runs, so an
  in-flight model call or tool call stops at its next checkpoint; the turn
  it cuts ends ``aborted`` and raises the `Cancelled` on up, the scope
  catches it, and the next wake-up enters a new one. A turn has no scope of
  its own: entering and leaving one was the largest cost of a turn, and an
  agent that never had work holds none.

Disposal is `stop` (from `AgentHandle.dispose`: the inbox is closed, which
wakes a parked loop, and the turns' scope of a turn in flight is cancelled with
reason ``"disposed"``) or the owner's cancel reaching the task: either way the
turn in flight ends ``disposed``, its closing events are appended and the
flush runs shielded, and `drive` returns (on `stop`) or unwinds (re-raising
the owner's cancel).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Generator, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar, overload

import trio

from greenroom.actors.compaction import DEFAULT_POLICY, CompactionPolicy, Compactor
from greenroom.actors.events import (
    AGENT_ERROR,
    AGENT_QUEUED,
    AGENT_REQUEST,
    AGENT_STATUS,
    AGENT_STEERING,
    AGENT_STEP_END,
    AGENT_STEP_RESULT,
    AGENT_STEP_START,
    AGENT_STREAM_CHUNK,
    AGENT_TOOL_PROGRESS,
    AGENT_TURN_CONTINUATION,
    AGENT_TURN_END,
    AGENT_TURN_START,
)
from greenroom.actors.inbox import Inbox, new_message_id
from greenroom.actors.life import AgentLife
from greenroom.actors.output import OutputTools, OutputTurn, output_spec
from greenroom.actors.prompt import (
    Answer,
    Prompt,
    StopReason,
    TurnOutcome,
    dropped,
    settle,
    take,
)
from greenroom.actors.types import (
    MODES,
    AgentDisposed,
    AgentOptions,
    SessionClient,
    ToolExecutor,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.hooks import Hooks
from greenroom.models.base import ContextOverflow, ModelAdapter, ModelError
from greenroom.models.usage import turn_usage
from greenroom.parking import Parking
from greenroom.protocol.content import Content, Part, checked, stored, text_of
from greenroom.protocol.events import (
    COMPLETED,
    DISPOSED,
    MAX_TOKENS,
    REFUSED,
    USER,
    Aborted,
    AssistantChunk,
    AssistantMessage,
    CompactionTrigger,
    ConfigSet,
    ConfigTrigger,
    ContextMessage,
    Errored,
    InjectionTrigger,
    MessageSource,
    MessageTrigger,
    ModelRetry,
    PluginSource,
    SessionEvent,
    StatusName,
    SteeringMessage,
    StepEnd,
    StepStart,
    ToolCall,
    ToolProgress,
    ToolResult,
    ToolStart,
    TurnAnswered,
    TurnEnd,
    TurnEndReason,
    TurnResumed,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import (
    THOUGHT_LEVELS,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    Retry,
    TextDelta,
    Thought,
    ToolCallChunk,
    Usage,
)
from greenroom.session import Session
from greenroom.session.history import HistoryEntry, history_of
from greenroom.session.persistence import PersistenceError

logger = logging.getLogger("greenroom.agent")

#: The grace an agent's supervisor gives it to stop (its last flush, its owned processes);
#: past it the supervisor records it ``killed`` and moves on.
CLOSING_GRACE: Final = 10.0

DEFAULT_CANCEL_REASON: Final = "cancelled"
#: The reason of the turns' scope's cancel when the agent is disposed (`LoopAgent.stop`).
DISPOSED_REASON: Final = "disposed"

#: Who tells the model its final answer did not validate (a ``context/message``).
OUTPUT_SOURCE: Final = PluginSource("output")
#: The error code of a turn whose structured output never validated.
INVALID_OUTPUT: Final = "invalid-output"
#: The error code of a step whose write-ahead failed, and of the answer of a turn whose
#: closing events the store did not take.
PERSISTENCE: Final = "persistence"

T = TypeVar("T")


class StepFailed(Exception):
    """A step could not finish: the model raised, yielded garbage, or finished with an error."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class LoopAgent:
    """An agent whose turns run in its own Trio task (see the module docstring)."""

    __slots__ = (
        "_cancel_reason",
        "_client",
        "_compactor",
        "_held",
        "_hooks",
        "_id",
        "_idle_waiters",
        "_inbox",
        "_life",
        "_models",
        "_open_step",
        "_options",
        "_resumed",
        "_session",
        "_status",
        "_tools",
        "_turn_scope",
        "_turns",
        "_unflushed",
    )

    def __init__(
        self,
        agent_id: str,
        session: Session,
        *,
        life: AgentLife,
        models: Mapping[str, ModelAdapter],
        tools: ToolExecutor,
        hooks: Hooks,
        options: AgentOptions | None = None,
        client: SessionClient | None = None,
        compaction: CompactionPolicy = DEFAULT_POLICY,
        resumed: Prompt[None] | None = None,
    ) -> None:
        self._id = agent_id
        self._session = session
        self._life = life
        self._options = options or AgentOptions()
        self._models = models  # by id; the first is the default
        self._client = client
        self._tools = tools
        self._hooks = hooks
        self._inbox = Inbox()
        self._status: StatusName = "idle"
        self._cancel_reason: str | None = None  # the turn-scoped cancel marker
        self._turns: trio.CancelScope | None = None  # held from a wake-up with work on
        self._turn_scope: trio.CancelScope | None = None  # the turns' scope while a turn runs
        self._open_step = 0  # the step the log has opened and not closed, 0 if none
        self._unflushed = False  # the last flush failed
        self._held: list[ContextMessage] | None = None  # injected while tools run
        self._compactor = Compactor(session, self._options.compaction or compaction)
        self._idle_waiters: list[_Wait] | None = None  # made by the first wait
        self._resumed = resumed  # the cut turn to carry on first (`continued_prompt`)

    def __repr__(self) -> str:
        return f"<LoopAgent {self._id!r} {self.status}>"

    # -- the Agent interface -------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def options(self) -> AgentOptions:
        return self._options

    @property
    def session(self) -> Session:
        return self._session

    @property
    def client(self) -> SessionClient | None:
        return self._client

    @property
    def status(self) -> StatusName:
        """``disposed`` from the moment its dispose began; the ``agent/status`` emit follows
        when the loop has stopped."""
        return "disposed" if self._life.disposing else self._status

    @property
    def inbox(self) -> Inbox:
        """The agent's inbox, for observers (queue depths); writers use send/steer."""
        return self._inbox

    @overload
    def send(self, content: Content, *, source: MessageSource | None = None) -> Prompt[None]: ...

    @overload
    def send(
        self, content: Content, *, source: MessageSource | None = None, output: type[T]
    ) -> Prompt[T]: ...

    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
    ) -> Prompt[Any]:
        """Queue a prompt; the next turn takes it with everything queued beside it (that
        asks for the same `output`). With `output`, the turn's final answer must validate
        as that type (a msgspec Struct, say): `Answer.output` is the value; a type whose
        JSON form is not an object is a `TypeError`, naming it.

        `content` is text, or a sequence of content blocks (`greenroom.protocol.content`:
        `Text`, `Image`, `Resource`), checked here: a bad block, or one past the limits
        (`MAX_IMAGE_BYTES`, `MAX_PROMPT_BYTES`), is a `ValueError` or `TypeError` naming
        its index, and nothing is queued."""
        return self._queue(content, source, output)

    def steer(self, content: str, *, source: MessageSource | None = None) -> Prompt[None]:
        """Join the running turn before its next step (its answer is that turn's); while
        not running, `send`."""
        if self.status != "running":
            return self.send(content, source=source)
        prompt: Prompt[None] = self._prompt(content, source, None)
        self._inbox.push_steering(prompt)
        if AGENT_QUEUED in self._hooks.listened:
            self._hooks.emit(AGENT_QUEUED, self, prompt.id, True)
        return prompt

    @overload
    async def run(
        self, content: Content, *, source: MessageSource | None = None
    ) -> Answer[None]: ...

    @overload
    async def run(
        self, content: Content, *, source: MessageSource | None = None, output: type[T]
    ) -> Answer[T]: ...

    async def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
    ) -> Answer[Any]:
        """`send`, then await the prompt's `Answer`. A cancelled caller stops waiting and
        nothing else: the prompt stays queued or running (`cancel` stops it)."""
        return await self._queue(content, source, output)

    def withdraw(self, message_id: str) -> bool:
        """Take back a prompt `send` queued that no turn has taken yet; True if it was still
        queued (its prompt settles ``withdrawn``). The rest of the queue and the running
        turn are untouched (`cancel` stops those). A prompt a turn took, or one steered
        into a running turn, is not withdrawn. Withdrawing the last thing an idle agent had
        queued releases its `when_idle`."""
        prompt = self._inbox.withdraw(message_id)
        if prompt is None:
            return False
        settle((prompt,), dropped("withdrawn"))
        if self._status == "idle" and not self._inbox.queued:
            self._release_idle_waiters()
        return True

    def inject(self, content: str, *, source: MessageSource | None = None) -> str:
        """Add context without running the model; returns its message id.

        Into the turn the log has open, if any; otherwise as a one-shot
        ``injection`` turn of its own, so every event stays inside a turn.
        """
        content, source = self._checked(content, source)
        message = ContextMessage(content=content, source=source, message_id=new_message_id())
        if self._held is not None:  # tool calls are running: after their results
            self._held.append(message)
            return message.message_id
        if self._session.open_turn is not None:
            self._session.append(message)
            return message.message_id
        turn = self._session.last_turn + 1
        self._session.append(TurnStart(turn=turn, trigger=InjectionTrigger(source)))
        self._session.append(message)
        self._session.append(TurnEnd(turn=turn, reason=COMPLETED))
        self._inbox.request_flush()
        return message.message_id

    def compact(self, instructions: str | None = None) -> None:
        """Compact the history (a summary of its older part, docs/semantics.md
        "Compaction"), with `instructions` for the summary if given: before the running
        turn's next step, or, while idle or when that turn ends without another step, as
        a one-shot ``compaction`` turn of its own (`when_idle` waits for it). A `cancel`
        withdraws it. Nothing is logged when there is nothing old enough to summarize.
        Instructions past `compaction.MAX_INSTRUCTIONS` characters are a `ValueError` naming it.
        """
        if self.status == "disposed":
            raise AgentDisposed(self._id)
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(
                f"agent {self._id!r}: compaction instructions must be text (str),"
                f" got {type(instructions).__name__}"
            )
        self._compactor.request(instructions.strip() or None if instructions else None)
        # Wakes the task when idle; when a running turn ends before another step, the
        # task finds it on its way back and runs the one-shot turn then.
        self._inbox.request_flush()

    def cancel(self, reason: str | None = None) -> None:
        """Stop all pending work: the single public stop verb.

        Clears both FIFOs (their prompts settle ``aborted`` with the reason),
        cancels the running turn's scope with `reason` (default
        ``"cancelled"``), and arms the cancel marker, but only when something
        is running or pending: an idle no-op cancel never strands the next
        prompt. Every child of the agent is cancelled the same way, busy or
        not. A no-op on a disposed agent.
        """
        if self.status == "disposed":
            return
        reason = reason or DEFAULT_CANCEL_REASON
        self._life.cancel_children(reason)
        pending = (
            self._status == "running"
            or self._inbox.queued
            or self._inbox.steering
            or self._compactor.requested
        )
        self._compactor.withdraw()
        if not pending:
            return
        self._drop_queued("aborted", reason)
        self._cancel_reason = reason
        if self._turn_scope is not None:
            self._turn_scope.cancel(reason=reason)

    def stop(self) -> None:
        """The life's stop (`AgentLife.stop` has set ``disposing``): close the inbox, so
        that `drive` returns at its next wake-up, and cancel the turn in flight (it ends
        ``disposed``). Never checkpoints; idempotent."""
        self._inbox.close()
        if self._turn_scope is not None:
            self._turn_scope.cancel(reason=DISPOSED_REASON)

    def configure(self, key: str, value: str) -> None:
        """Change a setting of the session: ``mode`` (one of `MODES`), ``model`` (an id
        of the runtime's models) or ``thought_level`` (one of `THOUGHT_LEVELS`: how hard
        the model thinks). It is logged (``config/set``): into the turn the log has open,
        else as a one-shot ``config`` turn of its own; a new model or thought level answers
        from the next step on. Raises `ValueError` naming an unknown key or value.
        """
        if self.status == "disposed":
            raise AgentDisposed(self._id)
        known = {"mode": MODES, "model": self._models, "thought_level": THOUGHT_LEVELS}.get(key)
        if known is None:
            raise ValueError(
                f"agent {self._id!r}: unknown setting {key!r} (known: mode, model, thought_level)"
            )
        if value not in known:
            raise ValueError(
                f"agent {self._id!r}: unknown {key} {value!r} (known: {', '.join(known)})"
            )
        if self._session.open_turn is not None:
            self._session.append(ConfigSet(key=key, value=value))
            return
        turn = self._session.last_turn + 1
        self._session.append(TurnStart(turn=turn, trigger=ConfigTrigger(USER)))
        self._session.append(ConfigSet(key=key, value=value))
        self._session.append(TurnEnd(turn=turn, reason=COMPLETED))
        self._inbox.request_flush()

    @property
    def model(self) -> str:
        """The id of the model that answers the next step."""
        chosen = self._session.config.get("model")
        if chosen is not None and chosen in self._models:
            return chosen
        return next(iter(self._models))

    def when_idle(self) -> Awaitable[None]:
        """Wait for quiescence; the wait is registered now, at the call.

        Resolves at once when idle with nothing queued; otherwise on the next
        transition out of running, or when a cancel leaves nothing to run.
        On a disposed agent it resolves once the agent's task has exited
        (after its unregister and session detach).
        """
        if self._status == "disposed" or self._life.disposing:
            return _Wait(self._life, released=True)
        if self._status == "idle" and not self._inbox.queued and not self._compactor.requested:
            return _Wait(None, released=True)
        waiter = _Wait(self._life)
        if self._idle_waiters is None:
            self._idle_waiters = []
        self._idle_waiters.append(waiter)
        return waiter

    def history(self) -> list[HistoryEntry]:
        return history_of(self._session.events)

    # -- the task --------------------------------------------------------------

    async def drive(self) -> None:
        """Run turns until `stop` (then it returns) or the owner's cancel (re-raised).

        A turn a crash cut (``resumed``) is carried on first, before any prompt.

        Whatever an earlier drain failed to write, or an idle inject the cancel
        overtook, gets a last flush on the way out; prompts still queued settle
        ``disposed``.
        """
        inbox = self._inbox
        try:
            while True:
                if self._resumed is None:  # a fresh agent parks outside any scope: none held
                    await inbox.wait()
                    if inbox.closed:  # stopped: the life goes on with its teardown
                        return
                # The turns' scope: one for every turn from here on, and the idle waits
                # between them, until a cancel uses it up (its `Cancelled` raised out of
                # the turn it cut, or at the next wait). One per turn cost more than
                # anything else a turn does. Inline, not a method: no frame more to hold.
                with trio.CancelScope() as scope:
                    self._turns = scope
                    if self._resumed is not None:
                        resumed, self._resumed = self._resumed, None
                        turn, start = _open_turn_of(self._session)
                        self._set_status("running")
                        await self._turn(turn, start, resumed)
                        self._after_turn()
                    else:
                        await self._wake()
                    while True:
                        await inbox.wait()
                        if inbox.closed:
                            break
                        await self._wake()
                self._turns = None
                if scope.cancelled_caught:  # a cancel or `stop` cut a turn short
                    self._after_turn()
                if inbox.closed:
                    return
        finally:
            self._turns = None
            self._set_status("disposed")
            self._drop_queued("disposed")
            if inbox.flush_requested or self._unflushed:
                await self._flush(0)

    async def _wake(self) -> None:
        """What one wake-up of the loop does: a flush asked for, a compaction asked for
        while nothing is queued, or the next turn, past cancel windows 1 and 2."""
        inbox = self._inbox
        if inbox.flush_requested:
            inbox.flush_requested = False
            await self._flush(0)
        if self._compactor.requested and not inbox.queued:
            await self._compaction_turn(self._session.last_turn + 1)
            return
        # Each window looks at the marker before it takes it: no call while it is not armed.
        if (
            self._cancel_reason is not None and self._cancelled_before_turn()
        ) or not inbox.queued:  # window 1: since the wake
            return
        self._set_status("running")
        if self._cancel_reason is not None and self._cancelled_before_turn():  # window 2
            return  # (a cancel from an agent/status listener)
        if not inbox.queued:  # ... or it withdrew everything: no turn to run
            self._set_status("idle")
            return
        await self._turn(self._session.last_turn + 1, self._session.next_seq)
        self._after_turn()

    def _after_turn(self) -> None:
        """Steering left leads the queued work; with none left, the agent is idle."""
        self._inbox.requeue_steering()
        if not self._inbox.queued and not self._compactor.requested:
            self._set_status("idle")

    def _drop_queued(self, stop_reason: StopReason, reason: str | None = None) -> None:
        """Empty both FIFOs; their prompts settle `stop_reason` (no turn took them)."""
        cleared = self._inbox.clear()
        if cleared:
            settle(cleared, dropped(stop_reason, reason))

    def _take_cancel(self) -> str | None:
        """Read and clear the cancel marker: the reason of a cancel since the last read."""
        reason, self._cancel_reason = self._cancel_reason, None
        return reason

    def _cancelled_before_turn(self) -> bool:
        """Windows 1 and 2: a cancel since the wake-up drops the turn about to start.

        What was sent after the cancel is still queued and runs; with nothing
        queued the agent settles idle and its `when_idle` waiters are released.
        """
        if self._take_cancel() is None or self._inbox.queued:
            return False
        if self._status == "running":  # a turn ended with work queued behind it
            self._set_status("idle")
        else:
            self._release_idle_waiters()
        return True

    async def _turn(self, turn: int, start: int, carried: Prompt[None] | None = None) -> None:
        """Run turn `turn` (its events from seq `start` on): a new one over the queued
        burst, or, given `carried` (`continued_prompt`), the turn a crash cut, carried on
        from where its log stops. Its `TurnEnd` is always written, with the reason it ends
        with whatever happens (a cancel, a failure, disposal), and every prompt it took
        (steering too) settles with it. It runs in the turns' scope. The body is inline,
        not a closure: a turn's frames are the larger part of its cost."""
        output: OutputTurn | None = None
        if carried is None:
            prompts = self._inbox.drain()
            kind = prompts[0].output
            if kind is not None:
                output = OutputTurn(output_spec(kind))
        else:
            prompts = [carried]
        take(prompts, turn)
        reason: TurnEndReason = COMPLETED
        self._turn_scope = self._turns
        try:
            if carried is None:
                session = self._session
                session.append(TurnStart(turn=turn, trigger=MessageTrigger(prompts[0].source)))
                messages, blobs = _user_messages(prompts)
                try:
                    if blobs or session.blobs_wanted:
                        await session.hold_blobs(blobs)
                finally:  # logged whatever happened: a blob the store lacks is shown as missing
                    for message in messages:
                        session.append(message)
                if AGENT_TURN_START in self._hooks.listened:
                    self._hooks.emit(AGENT_TURN_START, self, turn)
                reason = await self._steps(turn, prompts, output)
            else:
                reason = await self._carry_on(turn, start, carried)
        except Exception as exc:  # a waterfall handler failed: the turn fails with it
            reason = Errored(step=self._open_step, message=str(exc) or type(exc).__name__)
            self._hooks.emit(AGENT_ERROR, self, turn, self._open_step, exc)
        except BaseException as exc:
            reason, raised = await self._cut(exc, turn, self._open_step)
            if raised is exc:
                raise
            raise raised from None
        finally:
            self._turn_scope = None
            await self._close_turn(turn, reason, prompts, start, output)

    async def _carry_on(self, turn: int, start: int, prompt: Prompt[None]) -> TurnEndReason:
        """The steps of the turn a crash cut (`_turn` with ``carried``), from where its log
        stops."""
        self._hooks.emit(AGENT_TURN_START, self, turn)
        if self._session.blobs_wanted:  # its prompt's images, for the model
            await self._session.hold_blobs({})
        step = await self._mend_cut_step(turn, start)
        if step is None:  # its last reply was logged whole, and nothing asked for more
            return COMPLETED
        return await self._steps(turn, [prompt], None, step)

    async def _cut(
        self, exc: BaseException, turn: int, step: int
    ) -> tuple[TurnEndReason, BaseException]:
        """How a turn raising `exc` (no `Exception`) ends, and what it raises on.

        A cancel of the turns' scope (`cancel`, whose marker it takes, or else
        `stop`) ends it ``aborted`` or ``disposed``; the owner's cancel ends it
        ``disposed``; a disposed turn's children end first (their closing
        ``turn/end``s come before its own). Errors beside the scope's cancel (in
        one group) fail the turn, as they did when the turn had a scope of its
        own, and only the cancel goes on up, for the turns' scope to catch.
        """
        if cancelled_in(exc) is None:  # KeyboardInterrupt and the like: not the turn's
            return COMPLETED, exc
        scope = self._turns
        if scope is None or not scope.cancel_called:  # the owner's cancel: disposal
            await self._life.end_children()
            return DISPOSED, exc
        if isinstance(exc, BaseExceptionGroup):
            cancels, errors = exc.split(trio.Cancelled)
            if cancels is not None and isinstance(errors, Exception):
                self._hooks.emit(AGENT_ERROR, self, turn, step, errors)
                return Errored(step=step, message=str(errors) or type(errors).__name__), cancels
        cancelled = self._take_cancel()
        if cancelled is not None or not self._life.disposing:
            return Aborted(cancelled or DEFAULT_CANCEL_REASON), exc
        await self._life.end_children()
        return DISPOSED, exc

    async def _mend_cut_step(self, turn: int, start: int) -> int | None:
        """Log `TurnResumed` and mend the step the crash cut; returns the step after which
        the turn goes on, or None when it was done but for its ``turn/end``.

        A step whose reply was not fully logged is closed as it stands, and
        the next step asks the model again; a reply logged whole is never
        asked for again. A call of it with no result is run again when it had
        been logged (so may have run) and its tool is safe to repeat
        (``read``, or idempotent), given an ``interrupted`` result when it is
        not, and run when the log never reached it (it had not run). A
        steering message logged after the last reply asks for another step.
        """
        cut = _cut_step(self._session.events[start:])
        message = cut.message
        if message is None or not message.tool_calls:
            self._session.append(
                TurnResumed(turn=turn, step=cut.step, requested=cut.open and message is None)
            )
            if cut.open:
                self._open_step = cut.step
                self._close_step(turn)
            done = message is not None or (cut.step > 0 and not cut.open)
            return None if done and not cut.steered else cut.step
        calls = [call for call in message.tool_calls if call.call_id not in cut.answered]
        views = [self._tools.describe(call.name, call.arguments) for call in calls]
        safe = {
            call.call_id
            for call, view in zip(calls, views, strict=True)
            if view.kind == "read" or view.idempotent
        }
        started = [call.call_id for call in calls if call.call_id in cut.logged]
        self._session.append(
            TurnResumed(
                turn=turn,
                step=cut.step,
                rerun=[call_id for call_id in started if call_id in safe],
                interrupted=[call_id for call_id in started if call_id not in safe],
            )
        )
        self._open_step = cut.step
        logged, results = cut.logged, set(cut.answered)
        try:
            for call, view in zip(calls, views, strict=True):
                if call.call_id in logged and call.call_id not in safe:
                    self._log_result(turn, cut.step, call, CUT_CALL)
                    results.add(call.call_id)
                    continue
                if call.call_id not in logged:
                    self._log_call(turn, cut.step, call, view)
                    logged.add(call.call_id)
                if self._session.persistent:
                    await self._write_ahead(f"tool call {call.name!r}")
                await self._run_call(turn, cut.step, call, results, self._tools)
        except BaseException as exc:  # every call gets a result: the history stays valid
            cancel = cancelled_in(exc)
            unrun = (
                ToolOutcome.failed(f"not run: {exc}", "not-run", "NotRun")
                if cancel is None
                else ToolOutcome.failed(
                    f"aborted: {cancel.reason or DEFAULT_CANCEL_REASON}", "aborted", "Cancelled"
                )
            )
            for call, view in zip(calls, views, strict=True):
                if call.call_id not in logged:
                    self._log_call(turn, cut.step, call, view)
                if call.call_id not in results:
                    self._log_result(turn, cut.step, call, unrun)
            raise
        self._close_step(turn)
        return cut.step

    async def _compaction_turn(self, turn: int) -> None:
        """`compact` while idle: a turn of one step that only compacts (the turn ends
        ``aborted`` on a cancel, the log as before it started)."""
        if self._cancelled_before_turn():
            return
        self._set_status("running")
        start = self._session.next_seq
        reason: TurnEndReason = COMPLETED
        self._turn_scope = self._turns
        try:
            self._session.append(TurnStart(turn=turn, trigger=CompactionTrigger(USER)))
            self._open_step = 1
            self._session.append(StepStart(turn=turn, step=1))
            await self._compactor.fit(self._request(self._tools), *self._model_now(), turn, 1)
        except Exception as exc:
            reason = Errored(step=1, message=str(exc) or type(exc).__name__)
            self._hooks.emit(AGENT_ERROR, self, turn, 1, exc)
        except BaseException as exc:
            reason, raised = await self._cut(exc, turn, 1)
            if raised is exc:
                raise
            raise raised from None
        finally:
            self._turn_scope = None
            await self._close_turn(turn, reason, [], start, None)
        if not self._inbox.queued:
            self._set_status("idle")

    async def _steps(
        self, turn: int, prompts: list[Prompt[Any]], output: OutputTurn | None, step: int = 0
    ) -> TurnEndReason:
        """The turn's steps after `step`; steering they take joins `prompts`. With
        `output`, the turn ends once a step gave a valid final answer, and fails at the
        second invalid one."""
        tools = self._tools if output is None else OutputTools(self._tools, output)
        reason: TurnEndReason = COMPLETED
        while True:
            step += 1
            steered = self._inbox.drain_steering()
            if steered:
                take(steered, turn)
                prompts += steered
            for steering in steered:
                self._session.append(
                    SteeringMessage(
                        turn=turn,
                        content=steering.content,
                        source=steering.source,
                        message_id=steering.id,
                    )
                )
                if AGENT_STEERING in self._hooks.listened:
                    self._hooks.emit(AGENT_STEERING, self, turn, steering.content)
            if self._cancel_reason is not None:  # window 3: before the step
                return Aborted(self._take_cancel() or DEFAULT_CANCEL_REASON)
            self._open_step = step
            self._session.append(StepStart(turn=turn, step=step))
            if AGENT_STEP_START in self._hooks.listened:
                self._hooks.emit(AGENT_STEP_START, self, turn, step)
            try:
                called_tools, finish, text = await self._step(turn, step, tools)
            except StepFailed as failure:
                self._hooks.emit(AGENT_ERROR, self, turn, step, failure)
                return Errored(step=step, message=str(failure), code=failure.code)
            self._close_step(turn)
            if finish == "max-tokens":
                reason = MAX_TOKENS
            go_on = False
            if finish == "refusal":  # no step follows a refusal, whatever is waiting
                reason = REFUSED
            elif (
                output is not None
                and finish != "max-tokens"
                and (verdict := output.judge(called_tools, text)) != "working"
            ):  # "done": the final answer ends the turn (steering waits for the next one)
                if verdict == "failed":
                    reason = Errored(step=step, message=output.error, code=INVALID_OUTPUT)
                elif verdict == "retry":
                    go_on = True
                    if not called_tools:  # it answered in text: tell it in the history
                        self._session.append(
                            ContextMessage(
                                content=output.feedback(),
                                source=OUTPUT_SOURCE,
                                message_id=new_message_id(),
                            )
                        )
            else:
                go_on = called_tools or self._inbox.steering > 0
                if AGENT_TURN_CONTINUATION in self._hooks.listened:
                    go_on = await self._hooks.waterfall(AGENT_TURN_CONTINUATION, go_on, self, turn)
                    go_on = go_on or self._inbox.steering > 0  # waiting steering forces a step
            if self._cancel_reason is not None:  # window 4: the continuation
                return Aborted(self._take_cancel() or DEFAULT_CANCEL_REASON)
            if not go_on:
                if output is not None and not output.given and reason is COMPLETED:
                    return Errored(
                        step=step,
                        message=f"the turn ended without a final answer ({output.spec.name})",
                        code=INVALID_OUTPUT,
                    )
                return reason

    async def _step(
        self, turn: int, step: int, tools: ToolExecutor
    ) -> tuple[bool, FinishReason | None, str]:
        """One model call and its tool calls. Returns (called tools, how the model finished,
        its text)."""
        request = self._request(tools)
        model, model_id = self._model_now()
        if self._compactor.due(request, model, model_id):
            request = await self._compactor.fit(request, model, model_id, turn, step)
        if AGENT_REQUEST in self._hooks.listened:
            request = await self._hooks.waterfall(AGENT_REQUEST, request, self, turn, step)
        if self._session.persistent:  # the prompt, steering: before the model sees them
            await self._write_ahead("the model call")
        try:
            try:
                reply = await self._stream(request, turn, step)
            except ContextOverflow as overflow:  # compact (learning the window), try once more
                now = self._model_now()
                request = await self._compactor.fit(request, *now, turn, step, overflow=overflow)
                reply = await self._stream(request, turn, step)
        except (StepFailed, trio.Cancelled):
            raise
        except ModelError as exc:
            raise StepFailed(str(exc), exc.code) from exc
        except Exception as exc:
            raise StepFailed(f"model adapter raised {type(exc).__name__}: {exc}") from exc
        if reply.usage is not None:  # before its message is logged: see `Compactor.observe`
            self._compactor.observe(request, reply.usage, model_id)
        finish = reply.finish
        if finish is not None and finish.reason in ("error", "aborted"):
            raise StepFailed(
                finish.message or f"model finished with {finish.reason}", finish.reason
            )
        reason = None if finish is None else finish.reason
        cut = reason in ("max-tokens", "refusal")  # a cut-off call must not run
        message = AssistantMessage(
            turn=turn,
            step=step,
            content="".join(reply.text),
            reasoning="".join(reply.reasoning),
            tool_calls=[] if cut else reply.calls,
            usage=reply.usage,
            thoughts=reply.thoughts,
        )
        if AGENT_STEP_RESULT in self._hooks.listened:
            message = await self._hooks.waterfall(AGENT_STEP_RESULT, message, self, turn, step)
        if message.content or message.reasoning or message.tool_calls or message.usage:
            self._session.append(message)
        if not message.tool_calls:
            return False, reason, message.content
        self._held = []
        try:
            await self._run_tools(turn, step, message.tool_calls, tools)
        finally:
            # Context injected while the tools ran goes after their results: a model
            # API wants a call's result right after the call.
            held, self._held = self._held or [], None
            for context in held:
                self._session.append(context)
        return True, reason, message.content

    def _request(self, tools: ToolExecutor) -> ModelRequest:
        return ModelRequest(
            messages=self._session.messages(),
            model=self._options.model,
            system=self._options.system_prompt,
            tools=tools.schemas(),
            output=tools.output if isinstance(tools, OutputTools) else None,
            thought_level=self._session.config.get("thought_level"),
            blobs=self._session.blobs,
            session_id=self._session.id,
        )

    def _model_now(self) -> tuple[ModelAdapter, str]:
        """The adapter that answers the next step, and its id."""
        model = self.model
        return self._models[model], model

    async def _run_tools(
        self, turn: int, step: int, calls: list[ToolCallChunk], tools: ToolExecutor
    ) -> None:
        """Run the step's calls in order; a run of calls whose tools are concurrent runs at once.

        Every call gets a result, so the history stays valid for the next
        request: a call its write-ahead could not log is ``not run`` (and so
        is every later one); a cancel gives each call without a result yet,
        and every later one, an ``aborted`` result.
        """
        views = [tools.describe(call.name, call.arguments) for call in calls]
        done = 0
        while done < len(calls):
            end = done + 1
            while views[done].concurrent and end < len(calls) and views[end].concurrent:
                end += 1
            batch = calls[done:end]
            for call, view in zip(batch, views[done:end], strict=True):
                self._log_call(turn, step, call, view)
            results: set[str] = set()
            try:
                names = ", ".join(repr(call.name) for call in batch)
                if self._session.persistent:
                    await self._write_ahead(f"tool call {names}")  # the calls: before they run
                if len(batch) == 1:
                    await self._run_call(turn, step, batch[0], results, tools)
                else:
                    async with trio.open_nursery() as running:
                        for call in batch:
                            running.start_soon(self._run_call, turn, step, call, results, tools)
            except StepFailed as failure:
                unrun = ToolOutcome.failed(f"not run: {failure}", "not-run", "NotRun")
                self._settle_rest(turn, step, calls, views, done, end, results, unrun)
                raise
            except BaseException as exc:
                cancel = cancelled_in(exc)
                if cancel is None:
                    raise
                aborted = ToolOutcome.failed(
                    f"aborted: {cancel.reason or DEFAULT_CANCEL_REASON}", "aborted", "Cancelled"
                )
                self._settle_rest(turn, step, calls, views, done, end, results, aborted)
                raise
            done = end

    async def _run_call(
        self,
        turn: int,
        step: int,
        call: ToolCallChunk,
        results: set[str],
        tools: ToolExecutor,
    ) -> None:
        outcome = await tools.execute(
            ToolInvocation(
                call.call_id,
                call.name,
                call.arguments,
                self,
                self._turn_scope,
                self._client,
                partial(self._log_start, turn, step, call.call_id),
                self._life.spawn,
                partial(self._show_progress, turn, step, call.call_id),
            )
        )
        self._log_result(turn, step, call, outcome)
        results.add(call.call_id)

    def _settle_rest(
        self,
        turn: int,
        step: int,
        calls: list[ToolCallChunk],
        views: list[ToolView],
        done: int,
        end: int,
        results: set[str],
        outcome: ToolOutcome,
    ) -> None:
        """Give `outcome` to the batch's calls without a result, then log and settle the rest."""
        for call in calls[done:end]:
            if call.call_id not in results:
                self._log_result(turn, step, call, outcome)
        for call, view in zip(calls[end:], views[end:], strict=True):
            self._log_call(turn, step, call, view)
            self._log_result(turn, step, call, outcome)

    def _log_call(self, turn: int, step: int, call: ToolCallChunk, view: ToolView) -> None:
        self._session.append(
            ToolCall(
                turn=turn,
                step=step,
                call_id=call.call_id,
                name=call.name,
                arguments=call.arguments,
                kind=view.kind,
                title=view.title,
                locations=view.locations,
            )
        )

    def _log_start(self, turn: int, step: int, call_id: str) -> None:
        self._session.append(ToolStart(turn=turn, step=step, call_id=call_id))

    def _show_progress(self, turn: int, step: int, call_id: str, output: str, total: int) -> None:
        progress = ToolProgress(turn=turn, step=step, call_id=call_id, output=output, total=total)
        self._session.show_progress(progress)
        if AGENT_TOOL_PROGRESS in self._hooks.listened:
            self._hooks.emit(AGENT_TOOL_PROGRESS, self, progress)

    def _log_result(self, turn: int, step: int, call: ToolCallChunk, outcome: ToolOutcome) -> None:
        self._session.append(
            ToolResult(
                turn=turn,
                step=step,
                call_id=call.call_id,
                content=outcome.content,
                is_error=outcome.is_error,
                error=outcome.error,
                diffs=outcome.diffs,
            )
        )

    async def _stream(self, request: ModelRequest, turn: int, step: int) -> _Reply:
        """Log and emit each chunk of the model's reply as it arrives."""
        reply = _Reply()
        stream = self._models[self.model].stream(request)
        append, listened = self._session.append, self._hooks.listened
        try:
            async for chunk in stream:
                # Told apart by exact type: a class pattern, or an isinstance, of a Struct
                # class that fails costs a slow subclass check each.
                if type(chunk) is TextDelta:
                    reply.text.append(chunk.text)
                elif type(chunk) is Finish:
                    reply.finish = chunk
                elif type(chunk) is ToolCallChunk:
                    reply.calls.append(chunk)
                elif type(chunk) is ReasoningDelta:
                    reply.reasoning.append(chunk.text)
                elif type(chunk) is Usage:
                    reply.usage = chunk
                elif type(chunk) is Retry:  # no part of the reply: the adapter tries again
                    append(
                        ModelRetry(
                            turn=turn,
                            step=step,
                            attempt=chunk.attempt,
                            wait=chunk.wait,
                            error=chunk.error,
                            code=chunk.code,
                        )
                    )
                    continue
                elif type(chunk) is Thought:  # kept whole on the step's message, not as a chunk
                    reply.thoughts.append(chunk)
                    continue
                else:
                    break
                append(AssistantChunk(turn=turn, step=step, chunk=chunk))
                if AGENT_STREAM_CHUNK in listened:
                    self._hooks.emit(AGENT_STREAM_CHUNK, self, turn, step, chunk)
            else:
                return reply  # run to its end: a generator is closed already
        except BaseException:
            await _close(stream)
            raise
        await _close(stream)
        raise StepFailed(f"model yielded an invalid chunk: {chunk!r:.200}")

    def _close_step(self, turn: int) -> None:
        step, self._open_step = self._open_step, 0
        self._session.append(StepEnd(turn=turn, step=step))
        if AGENT_STEP_END in self._hooks.listened:
            self._hooks.emit(AGENT_STEP_END, self, turn, step)

    async def _close_turn(
        self,
        turn: int,
        reason: TurnEndReason,
        prompts: list[Prompt[Any]],
        start: int,
        output: OutputTurn | None,
    ) -> None:
        """Append the turn's closing events (no checkpoint: nothing can cut them), flush,
        settle the turn's prompts, then report the end (``agent/turn-end``): under
        ``sync="always"`` both only once it is fsynced.

        What is reported is what the store holds: when the flush fails (within the
        store's deadline), the prompts are answered an error naming the store instead,
        and that answer is logged after the ``turn/end`` (``turn/answered``), to be
        written with it by the next write that gets through."""
        session = self._session
        if self._open_step:
            self._close_step(turn)
        if (usage := turn_usage(session.events, start, turn)) is not None:
            session.append(usage)
        end = session.append(TurnEnd(turn=turn, reason=reason)).seq
        try:
            if session.persistent and (failure := await self._flush(turn)) is not None:
                reason = Errored(
                    step=0,
                    message=f"the turn's end was not stored: {failure}",
                    code=PERSISTENCE,
                )
                session.append(TurnAnswered(turn=turn, reason=reason))
        finally:
            structured = output is not None
            value = output.value if output is not None and output.given else None
            outcome = TurnOutcome(turn, reason, start, end, structured=structured, output=value)
            settle(prompts, outcome)
        if type(reason) is Errored:  # an embedder who reads no answer still sees it
            logger.warning(
                "agent %r (session %r): turn %d failed: %s",
                self.id,
                self._session.id,
                turn,
                reason.message,
            )
        if AGENT_TURN_END in self._hooks.listened:
            self._hooks.emit(AGENT_TURN_END, self, turn, reason)

    async def _write_ahead(self, before: str) -> None:
        """Get the log to the OS before `before` happens; a failure fails the step.

        Nothing the outside world may act on goes ahead of its log: a crash
        after it leaves the log holding it (repair closes it ``interrupted``).
        Only for a session with a sink: the callers check `Session.persistent` first,
        which spares a coroutine per step without one.
        """
        try:
            await self._session.write_ahead()
        except PersistenceError as exc:
            raise StepFailed(
                f"the session log could not be written before {before}: {exc}", PERSISTENCE
            ) from exc

    async def _flush(self, turn: int) -> Exception | None:
        """End the turn through the session's sink; report a failure, and return it.

        A cancel cannot cut it: a sink shields whatever it waits for (a
        write in a worker thread can only be abandoned, never interrupted).
        A failure is an ``agent/error`` (and a log line); the sink keeps the
        events, and the next flush (the next turn's, or the log's close at
        the end of the life) writes them. Without a sink it returns at once
        (`Session.flush` has nothing to do).
        """
        try:
            await self._session.flush()
        except Exception as exc:
            self._unflushed = True
            logger.exception("flush of session %r failed", self._session.id)
            self._hooks.emit(AGENT_ERROR, self, turn, 0, exc)
            return exc
        self._unflushed = False
        return None

    # -- status -----------------------------------------------------------------

    def _set_status(self, status: StatusName) -> None:
        """Move to `status`, deduplicated; once the life is stopping, every move is to
        ``disposed``, and nothing moves out of it.

        Idle waiters are released before the emit, so a listener that sends
        again cannot hold them.
        """
        if self._status == "disposed":
            return
        if self._life.disposing:
            status = "disposed"
        if status == self._status:
            return
        leaving_running = self._status == "running"
        self._status = status
        if leaving_running or status == "disposed":
            self._release_idle_waiters()
        if AGENT_STATUS in self._hooks.listened:
            self._hooks.emit(AGENT_STATUS, self, status)

    def _release_idle_waiters(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters or (), None
        for waiter in waiters:
            waiter.release()

    def _queue(
        self, content: Content, source: MessageSource | None, output: type[T] | None
    ) -> Prompt[T]:
        if output is not None:
            output_spec(output)
        if isinstance(content, str):
            text, source = self._checked(content, source)
            prompt = Prompt(self._session, text, source, new_message_id(), output)
        else:
            prompt = self._blocks_prompt(content, source, output)
        self._inbox.push(prompt)
        if AGENT_QUEUED in self._hooks.listened:
            self._hooks.emit(AGENT_QUEUED, self, prompt.id, False)
        return prompt

    def _prompt(
        self, content: str, source: MessageSource | None, output: type[T] | None
    ) -> Prompt[T]:
        content, source = self._checked(content, source)
        return Prompt(self._session, content, source, new_message_id(), output)

    def _blocks_prompt(
        self, content: object, source: MessageSource | None, output: type[T] | None
    ) -> Prompt[T]:
        if self.status == "disposed":
            raise AgentDisposed(self._id)
        try:
            blocks = checked(content)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"agent {self._id!r}: {exc}") from None
        return Prompt(
            self._session, text_of(blocks), source or USER, new_message_id(), output, blocks
        )

    def _checked(self, content: str, source: MessageSource | None) -> tuple[str, MessageSource]:
        if self._status == "disposed" or self._life.disposing:  # `status`, without its call
            raise AgentDisposed(self._id)
        if not isinstance(content, str):
            raise TypeError(
                f"agent {self._id!r}: content must be text (str), got {type(content).__name__}"
            )
        if not content.strip():
            raise ValueError(f"agent {self._id!r}: content must be non-empty text")
        return content, source or USER


def _user_messages(prompts: list[Prompt[Any]]) -> tuple[list[UserMessage], dict[str, bytes]]:
    """The ``user/message`` of each prompt, and the blobs their parts name."""
    messages: list[UserMessage] = []
    blobs: dict[str, bytes] = {}
    for prompt in prompts:
        parts: list[Part] = []
        if prompt.blocks:
            parts, theirs = stored(prompt.blocks)
            blobs.update(theirs)
        messages.append(
            UserMessage(
                content=prompt.content, source=prompt.source, message_id=prompt.id, parts=parts
            )
        )
    return messages, blobs


async def _close(stream: object) -> None:
    """Close a model stream left before its end (an async generator's ``aclose``)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


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
    _, start = _open_turn_of(session)
    events = session.events
    opened = events[start]
    if not isinstance(opened, TurnStart) or type(opened.trigger) is not MessageTrigger:
        return None
    for event in events[start + 1 :]:
        if type(event) is UserMessage:
            return Prompt(session, event.content, event.source, event.message_id, None)
    return None


def _open_turn_of(session: Session) -> tuple[int, int]:
    """The turn the log has open and the seq of its ``turn/start``."""
    events = session.events
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if isinstance(event, TurnStart):
            return event.turn, index
    raise ValueError(f"session {session.id!r} has no open turn")


class _Cut:
    """Where a cut turn's log stops: its last step, that step's reply, its calls."""

    __slots__ = ("answered", "logged", "message", "open", "steered", "step")

    def __init__(self) -> None:
        self.step = 0  # the last step started, 0 if none
        self.open = False  # that step has no step/end
        self.message: AssistantMessage | None = None  # that step's reply, if logged whole
        self.logged: set[str] = set()  # its calls logged (so they may have run)
        self.answered: set[str] = set()  # its calls with a result
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
            case ToolResult(call_id=call_id):
                cut.answered.add(call_id)
            case SteeringMessage():
                cut.steered = True
    return cut


class _Reply:
    """One model reply, assembled from its chunks."""

    __slots__ = ("calls", "finish", "reasoning", "text", "thoughts", "usage")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCallChunk] = []
        self.thoughts: list[Thought] = []
        self.usage: Usage | None = None
        self.finish: Finish | None = None


class _Wait:
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
