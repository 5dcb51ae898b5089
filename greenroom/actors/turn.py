"""`TurnDriver`: **the turn driver**, one turn at a time for one agent.

A turn runs steps (one model call plus its tool calls each) until nothing
asks for another. Its ``turn/end`` is always written, with the reason it
ends with whatever happens (a cancel, a failure, disposal), and every prompt
it took (steering too) settles with it. The agent's loop (`LoopAgent`)
decides when a turn runs; the driver runs it, in the turns' scope of the
`CancelMarker`, whose marker it reads before each step (window 3) and after
the continuation decision (window 4).

It also logs the one-shot events of an injected message or a setting (`one_shot`: into the
turn the log has open, else as a turn of its own), and runs the turn of one step that only
compacts (`Agent.compact` while idle).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeAlias

import trio

from greenroom.actors.calls import ToolCalls
from greenroom.actors.compaction import Compactor
from greenroom.actors.decisions import Decisions
from greenroom.actors.events import (
    AGENT_ERROR,
    AGENT_REQUEST,
    AGENT_STEERING,
    AGENT_STEP_END,
    AGENT_STEP_RESULT,
    AGENT_STEP_START,
    AGENT_STREAM_CHUNK,
    AGENT_TURN_CONTINUATION,
    AGENT_TURN_END,
    AGENT_TURN_START,
)
from greenroom.actors.inbox import Inbox
from greenroom.actors.life import AgentLife
from greenroom.actors.limits import NO_LIMITS, Budget, Limits
from greenroom.actors.marker import DEFAULT_CANCEL_REASON, CancelMarker, cancelled_in
from greenroom.actors.output import OutputTools, OutputTurn
from greenroom.actors.prompt import Answer, Prompt, TurnOutcome, new_message_id, settle, take
from greenroom.actors.request import Requests
from greenroom.actors.step import PERSISTENCE, StepFailed, TurnStopped, retried, write_ahead
from greenroom.actors.types import Agent, ToolExecutor
from greenroom.hooks import Hooks
from greenroom.models.base import ContextOverflow, ModelAdapter, ModelError
from greenroom.models.usage import turn_usage
from greenroom.protocol.content import Part, stored
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
    ContextMessage,
    Errored,
    MessageTrigger,
    PluginSource,
    SessionEvent,
    SteeringMessage,
    StepEnd,
    StepStart,
    TurnAnswered,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    TurnTrigger,
    UserMessage,
)
from greenroom.protocol.model import (
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

logger = logging.getLogger("greenroom.agent")

#: Who tells the model its final answer did not validate (a ``context/message``).
OUTPUT_SOURCE: Final = PluginSource("output")
#: The error code of a turn whose structured output never validated.
INVALID_OUTPUT: Final = "invalid-output"

#: What a turn runs instead of the steps of a fresh prompt (a carried-on turn, a
#: compaction turn): called with the turn and the seq of its start, it returns how the
#: turn ends.
TurnBody: TypeAlias = Callable[[int, int], Awaitable[TurnEndReason]]


class TurnDriver:
    """Runs one agent's turns (see the module docstring).

    What it keeps of the turn in flight is its own: the step the log has
    opened (``open_step``), the context injected while tools run (``held``,
    a list while they run), whether the last flush failed (``unflushed``).
    """

    __slots__ = (
        "_agent",
        "_compactor",
        "_decisions",
        "_hooks",
        "_inbox",
        "_life",
        "_marker",
        "_prompts",
        "_session",
        "budget",
        "calls",
        "held",
        "limits",
        "open_step",
        "requests",
        "tools",
        "unflushed",
    )

    def __init__(
        self,
        agent: Agent,
        session: Session,
        *,
        inbox: Inbox,
        marker: CancelMarker,
        life: AgentLife,
        requests: Requests,
        tools: ToolExecutor,
        hooks: Hooks,
        compactor: Compactor,
        calls: ToolCalls,
        decisions: Decisions,
        limits: Limits | None = None,
    ) -> None:
        self._agent = agent
        self._session = session
        self._inbox = inbox
        self._marker = marker
        self._life = life
        self._hooks = hooks
        self._compactor = compactor
        self._decisions = decisions
        decisions.driver = self
        #: The running turn's prompts not settled yet (None between turns).
        self._prompts: list[Prompt[Any]] | None = None
        #: What the agent's model is asked, and which model answers.
        self.requests = requests
        self.tools = tools
        #: How the step's tool calls are run and logged.
        self.calls = calls
        #: The step the log has opened and not closed, 0 if none.
        self.open_step = 0
        #: Context injected while tool calls run, logged after their results.
        self.held: list[ContextMessage] | None = None
        #: The last flush failed: the next one (or the loop's last) writes what it kept.
        self.unflushed = False
        #: The agent's limits, and its counts against them (made at the first limited turn).
        self.limits = limits
        self.budget: Budget | None = None

    async def run(
        self,
        turn: int,
        start: int,
        prompts: list[Prompt[Any]],
        output: OutputTurn | None = None,
        body: TurnBody | None = None,
    ) -> None:
        """Run turn `turn` (its events from seq `start` on): the steps of the queued burst
        `prompts` (with `output`, their structured output), or, given `body`, what it does
        instead (`carry.carried_on`, `compaction`). Its ``turn/end`` is always written
        and its prompts settled (`close`). The fresh turn's opening is inline, not a
        body: a turn's frames are the larger part of its cost."""
        take(prompts, turn)
        self._prompts = prompts
        reason: TurnEndReason = COMPLETED
        cut = False  # a cancel or a crash ends it, no turn/end of its own
        marker = self._marker
        marker.running = marker.turns
        if self.limits is not None or self.budget is not None:
            budget = self.budget
            if budget is None:  # the first limited turn: the session's counts read once
                budget = self.budget = Budget(NO_LIMITS, self._session.events)
            budget.turn(self.limits, prompts)
        try:
            if body is None:
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
                    self._hooks.emit(AGENT_TURN_START, self._agent, turn)
                reason = await self.steps(turn, prompts, output)
            else:
                reason = await body(turn, start)
        except TurnStopped as stop:  # a limit, a guard: its calls have their results
            reason = stop.reason(self.open_step)
            if (event := stop.event(turn)) is not None:
                self._session.append(event)
        except Exception as exc:  # a waterfall handler failed: the turn fails with it
            reason = Errored(step=self.open_step, message=str(exc) or type(exc).__name__)
            self._hooks.emit(AGENT_ERROR, self._agent, turn, self.open_step, exc)
        except BaseException as exc:
            cut = True
            reason, raised = await self._cut(exc, turn, self.open_step)
            if raised is exc:
                raise
            raise raised from None
        finally:
            marker.running = self._prompts = None
            if cut and self.parked:  # disposed while it waited: left open, parked
                waits = tuple(self._session.logged_decisions())
                settle(prompts, Answer(stop_reason="requires-action", turn=turn, decisions=waits))
            else:
                # Not cut: a call's failure, not a disposal, cut the asks of those beside it.
                self._decisions.parked = False
                await self._close(turn, reason, prompts, start, output)

    @property
    def parked(self) -> bool:
        """Whether a disposal cut the running turn while it waited on a decision: it is left
        open in the log, parked (`Decisions.parked`)."""
        return self._decisions.parked

    def requires_action(self) -> None:
        """Settle the running turn's prompts ``requires-action`` with the decisions it waits
        for (`Decisions.wait` passed): the turn waits on, parked, and its end settles only
        the prompts that join it later (steering)."""
        prompts = self._prompts
        if prompts:
            turn = self._session.open_turn
            settle(
                prompts,
                Answer(
                    stop_reason="requires-action",
                    turn=turn,
                    decisions=tuple(self._session.logged_decisions()),
                ),
            )
            prompts.clear()

    def one_shot(self, trigger: TurnTrigger, event: SessionEvent) -> None:
        """Log `event` into the turn the log has open, else as a turn of its own (every
        event stays inside a turn), which the agent's task flushes. Never checkpoints."""
        session = self._session
        if session.open_turn is not None:
            session.append(event)
            return
        turn = session.last_turn + 1
        session.append(TurnStart(turn=turn, trigger=trigger))
        session.append(event)
        session.append(TurnEnd(turn=turn, reason=COMPLETED))
        self._inbox.request_flush()

    async def compaction(self, turn: int, start: int) -> TurnEndReason:
        """The body of a turn of one step that only compacts (`Agent.compact` while idle);
        a cancel ends it ``aborted``, the log as before it started."""
        session = self._session
        session.append(TurnStart(turn=turn, trigger=CompactionTrigger(USER)))
        self.open_step = 1
        session.append(StepStart(turn=turn, step=1))
        requests = self.requests
        model_id = requests.model_id
        await self._compactor.fit(
            requests.build(self.tools), requests.models[model_id], model_id, turn, 1
        )
        return COMPLETED

    async def _cut(
        self, exc: BaseException, turn: int, step: int
    ) -> tuple[TurnEndReason, BaseException]:
        """How a turn raising `exc` (no `Exception`) ends, and what it raises on.

        A cancel of the turns' scope (`Agent.cancel`, whose marker it takes,
        or else `stop`) ends it ``aborted`` or ``disposed``; the owner's
        cancel ends it ``disposed``; a disposed turn's children end first
        (their closing ``turn/end``s come before its own). Errors beside the
        scope's cancel (in one group) fail the turn, as they did when the turn
        had a scope of its own, and only the cancel goes on up, for the turns'
        scope to catch.
        """
        if cancelled_in(exc) is None:  # KeyboardInterrupt and the like: not the turn's
            return COMPLETED, exc
        if not self._marker.turns_cancelled:  # the owner's cancel: disposal
            await self._life.end_children()
            return DISPOSED, exc
        if isinstance(exc, BaseExceptionGroup):
            cancels, errors = exc.split(trio.Cancelled)
            if cancels is not None and isinstance(errors, Exception):
                self._hooks.emit(AGENT_ERROR, self._agent, turn, step, errors)
                return Errored(step=step, message=str(errors) or type(errors).__name__), cancels
        cancelled = self._marker.take()
        if cancelled is not None or not self._life.disposing:
            return Aborted(cancelled or DEFAULT_CANCEL_REASON), exc
        await self._life.end_children()
        return DISPOSED, exc

    async def steps(
        self, turn: int, prompts: list[Prompt[Any]], output: OutputTurn | None, step: int = 0
    ) -> TurnEndReason:
        """The turn's steps after `step`; steering they take joins `prompts`. With
        `output`, the turn ends once a step gave a valid final answer, and fails at the
        second invalid one."""
        tools = self.tools if output is None else OutputTools(self.tools, output)
        marker = self._marker
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
                    self._hooks.emit(AGENT_STEERING, self._agent, turn, steering.content)
            if marker.reason is not None:  # window 3: before the step
                return Aborted(marker.take() or DEFAULT_CANCEL_REASON)
            budget = self.budget
            if budget is not None and (reached := budget.request()) is not None:
                return reached
            self.open_step = step
            self._session.append(StepStart(turn=turn, step=step))
            if AGENT_STEP_START in self._hooks.listened:
                self._hooks.emit(AGENT_STEP_START, self._agent, turn, step)
            try:
                called_tools, finish, text = await self._step(turn, step, tools)
            except StepFailed as failure:
                self._hooks.emit(AGENT_ERROR, self._agent, turn, step, failure)
                return Errored(step=step, message=str(failure), code=failure.code)
            self.close_step(turn)
            if budget is not None and budget.crossed is not None:
                return budget.crossed
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
                    go_on = await self._hooks.waterfall(
                        AGENT_TURN_CONTINUATION, go_on, self._agent, turn
                    )
                    go_on = go_on or self._inbox.steering > 0  # waiting steering forces a step
            if marker.reason is not None:  # window 4: the continuation
                return Aborted(marker.take() or DEFAULT_CANCEL_REASON)
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
        agent, session, hooks = self._agent, self._session, self._hooks
        requests = self.requests
        request = requests.build(tools)
        model_id = requests.model_id
        model = requests.models[model_id]
        if self._compactor.due(request, model, model_id):
            request = await self._compactor.fit(request, model, model_id, turn, step)
        if AGENT_REQUEST in self._hooks.listened:
            request = await self._hooks.waterfall(AGENT_REQUEST, request, self._agent, turn, step)
        if self._session.persistent:  # the prompt, steering: before the model sees them
            await write_ahead(self._session, "the model call")
        try:
            try:
                reply = await _stream(model, request, agent, session, hooks, turn, step)
            except ContextOverflow as overflow:  # compact (learning the window), try once more
                model_id = requests.model_id
                model = requests.models[model_id]
                request = await self._compactor.fit(
                    request, model, model_id, turn, step, overflow=overflow
                )
                reply = await _stream(model, request, agent, session, hooks, turn, step)
        except (StepFailed, trio.Cancelled):
            raise
        except ModelError as exc:
            raise StepFailed(str(exc), exc.code) from exc
        except Exception as exc:
            raise StepFailed(f"model adapter raised {type(exc).__name__}: {exc}") from exc
        if reply.usage is not None:  # before its message is logged: see `Compactor.observe`
            reply.usage = requests.priced(reply.usage, request, model)
            self._compactor.observe(request, reply.usage, model_id)
            if self.budget is not None:  # a crossing ends the turn after this step
                self.budget.spend(reply.usage)
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
            message = await self._hooks.waterfall(
                AGENT_STEP_RESULT, message, self._agent, turn, step
            )
        if message.content or message.reasoning or message.tool_calls or message.usage:
            self._session.append(message)
        if not message.tool_calls:
            return False, reason, message.content
        del request, reply  # not held while the tools run, nor while a decision waits
        self.held = []
        try:
            await self.calls.run(turn, step, message.tool_calls, tools, self.budget)
        finally:
            # Context injected while the tools ran goes after their results: a model
            # API wants a call's result right after the call.
            held, self.held = self.held or [], None
            for context in held:
                self._session.append(context)
        return True, reason, message.content

    def close_step(self, turn: int) -> None:
        """Log the end of the open step."""
        step, self.open_step = self.open_step, 0
        self._session.append(StepEnd(turn=turn, step=step))
        if AGENT_STEP_END in self._hooks.listened:
            self._hooks.emit(AGENT_STEP_END, self._agent, turn, step)

    async def _close(
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
        if self.open_step:
            self.close_step(turn)
        if (usage := turn_usage(session.events, start, turn)) is not None:
            session.append(usage)
        end = session.append(TurnEnd(turn=turn, reason=reason)).seq
        try:
            if session.persistent and (failure := await self.flush(turn)) is not None:
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
                self._agent.id,
                session.id,
                turn,
                reason.message,
            )
        if AGENT_TURN_END in self._hooks.listened:
            self._hooks.emit(AGENT_TURN_END, self._agent, turn, reason)

    async def flush(self, turn: int) -> Exception | None:
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
            self.unflushed = True
            logger.exception("flush of session %r failed", self._session.id)
            self._hooks.emit(AGENT_ERROR, self._agent, turn, 0, exc)
            return exc
        self.unflushed = False
        return None


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


async def _stream(
    model: ModelAdapter,
    request: ModelRequest,
    agent: Agent,
    session: Session,
    hooks: Hooks,
    turn: int,
    step: int,
) -> _Reply:
    """Log and emit each chunk of the model's reply as it arrives."""
    reply = _Reply()
    stream = model.stream(request)
    append, listened = session.append, hooks.listened
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
                append(retried(chunk, turn, step))
                continue
            elif type(chunk) is Thought:  # kept whole on the step's message, not as a chunk
                reply.thoughts.append(chunk)
                continue
            else:
                break
            append(AssistantChunk(turn=turn, step=step, chunk=chunk))
            if AGENT_STREAM_CHUNK in listened:
                hooks.emit(AGENT_STREAM_CHUNK, agent, turn, step, chunk)
        else:
            return reply  # run to its end: a generator is closed already
    except BaseException:
        await _close(stream)
        raise
    await _close(stream)
    raise StepFailed(f"model yielded an invalid chunk: {chunk!r:.200}")


async def _close(stream: object) -> None:
    """Close a model stream left before its end (an async generator's ``aclose``)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


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
