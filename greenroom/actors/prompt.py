"""`Prompt`: one message sent to an agent, as a value: its `Answer`, its turn's events, its fate.

`send` and `steer` make a `Prompt` synchronously; the agent's inbox holds it
until a turn takes it. From then on its fate is the fate of one turn (the
turn whose ``user/message`` or ``steering/message`` carries its id), or, if
no turn ever takes it, of the verb that dropped it (a cancel, a withdraw, a
dispose). The agent settles every prompt exactly once, whether or not
anyone awaits it, and keeps nothing of it afterwards: a settled prompt
nobody holds is garbage. The `Answer` is made when someone first reads it,
from the session's log; the prompts of one turn share it.

Beside `Prompt`: `Answer` (what became of it: its turn, text, tool calls, usage, output,
stop reason) and `PromptEvents` (a reader of one prompt's turn, `Prompt.events`).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeAlias, TypeVar

import msgspec
import trio

from greenroom.actors.limits import Limits
from greenroom.parking import Parking
from greenroom.protocol.content import Content, ContentBlock, checked, text_of
from greenroom.protocol.events import (
    USER,
    Aborted,
    AssistantChunk,
    AssistantMessage,
    Compacted,
    CompactionStart,
    Completed,
    DecisionRequested,
    Disposed,
    Errored,
    Guarded,
    LimitReached,
    MaxTokens,
    MessageSource,
    ModelRetry,
    Refused,
    StepEnd,
    ToolCall,
    ToolProgress,
    ToolResult,
    ToolStart,
    TurnEnd,
    TurnEndReason,
    TurnStart,
)
from greenroom.protocol.model import ReasoningDelta, TextDelta, Usage

if TYPE_CHECKING:
    from greenroom.session import Session

T = TypeVar("T")

logger = logging.getLogger("greenroom.actors")

#: How a prompt ended: its turn's end reason, or, for one no turn took, what dropped it.
StopReason: TypeAlias = Literal[
    "completed",
    "aborted",
    "error",
    "disposed",
    "max-tokens",
    "refusal",
    "limit",
    "guarded",
    "requires-action",
    "withdrawn",
]

#: What `Prompt.events` yields: the turn's text and reasoning deltas (``assistant/chunk``),
#: its tool calls as they are logged, start and end, its model retries (``model/retry``), its
#: compactions' starts and ends, its step ends and its end; and, between a call's start
#: and end, what it has shown so far (`ToolProgress`, never logged).
PromptEvent: TypeAlias = (
    AssistantChunk
    | ModelRetry
    | ToolCall
    | ToolStart
    | ToolProgress
    | ToolResult
    | CompactionStart
    | Compacted
    | StepEnd
    | TurnEnd
)

#: The tool a turn asked for a structured output offers the model (`greenroom.actors.output`);
#: its calls are the output's attempts, not tool calls of the answer.
OUTPUT_TOOL = "final_answer"


class ToolCallRecord(msgspec.Struct, frozen=True, gc=False):
    """One tool call of a turn and its result (every call gets one, a cancelled one too)."""

    call_id: str
    name: str
    arguments: str  # the JSON text the model wrote
    result: str
    is_error: bool = False


class Answer(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """What became of a prompt.

    ``turn`` is the turn it joined (None if none took it); ``reason`` the
    cancel reason or the error text; ``text`` the turn's last assistant text;
    ``tool_calls`` its calls with their results; ``usage`` the tokens of all
    its steps (None if the model reported none) and what they cost (``usage.cost``,
    USD; None when unknown); ``output`` the validated structured output, when the
    prompt asked for one and the turn gave it; ``decisions`` what its turn waits
    for, when it answers ``requires-action`` (the turn parked: its end comes
    later, as a carried-on turn's does).
    """

    stop_reason: StopReason
    reason: str | None = None
    turn: int | None = None
    text: str = ""
    tool_calls: tuple[ToolCallRecord, ...] = ()
    usage: Usage | None = None
    output: T | None = None
    decisions: tuple[DecisionRequested, ...] = ()


class PromptOwner(Protocol):
    """The agent a prompt was sent to: what `Prompt.cancel` asks."""

    def cancel_prompt(self, prompt: Prompt[Any], reason: str | None) -> None: ...


class TurnOutcome:
    """The end of one turn, shared by the prompts it took; their `Answer` is made from the
    log at the first read (``start`` and ``end`` are the seqs of its ``turn/start`` and
    ``turn/end``), then kept here. ``structured``: the turn was asked for an output, so
    its calls of `OUTPUT_TOOL` were the output's attempts, not calls of the answer."""

    __slots__ = ("_answer", "end", "output", "reason", "start", "structured", "turn")

    def __init__(
        self,
        turn: int,
        reason: TurnEndReason,
        start: int,
        end: int,
        *,
        structured: bool = False,
        output: object = None,
    ) -> None:
        self.turn = turn
        self.reason = reason
        self.start = start
        self.end = end
        self.structured = structured
        self.output = output
        self._answer: Answer[object] | None = None

    def answer(self, session: Session) -> Answer[object]:
        if self._answer is None:
            self._answer = _read_answer(session, self)
        return self._answer


class Prompt(Generic[T]):
    """A prompt sent to an agent (made by `Agent.send` / `Agent.steer`, never directly).

    ``id`` is its message id, as logged. ``await prompt`` returns its `Answer`
    once it is settled (at once if it is); a cancelled awaiter stops waiting
    and nothing else: the prompt stays the agent's (stop it with `cancel` or
    `withdraw`, or its own `cancel`). Awaiting again returns the same answer.
    `events` follows its turn as the log grows.
    """

    __slots__ = (
        "_on_settled",
        "_outcome",
        "_owner",
        "_readers",
        "_session",
        "_turn",
        "_waiters",
        "blocks",
        "content",
        "id",
        "limits",
        "output",
        "source",
    )

    def __init__(
        self,
        session: Session,
        content: str,
        source: MessageSource,
        message_id: str,
        output: type[T] | None,
        blocks: tuple[ContentBlock, ...] = (),
        limits: Limits | None = None,
        owner: PromptOwner | None = None,
    ) -> None:
        self.id = message_id
        #: Its text (a prompt sent as blocks: its text blocks'), and its blocks as sent.
        self.content = content
        self.blocks = blocks
        self.source = source
        #: The type the final answer must validate as, or None for a plain answer.
        self.output = output
        #: The limits its turn is held to beside the agent's (the stricter of each wins).
        self.limits = limits
        self._session = session
        self._turn: int | None = None  # the turn that took it
        self._outcome: TurnOutcome | Answer[T] | None = None
        self._waiters: Parking | None = None  # made by the first awaiter
        self._readers: Parking | None = None  # readers waiting for a turn to take it
        self._on_settled: Callable[[Answer[T]], None] | None = None
        self._owner = owner  # the agent it was sent to (None: one `cancel` cannot reach)

    def __repr__(self) -> str:
        state = "settled" if self._outcome is not None else "pending"
        return f"<Prompt {self.id!r} {state}>"

    @property
    def turn(self) -> int | None:
        """The number of the turn that took it (its ``turn/start``'s), None while queued or
        if it settled without one (withdrawn)."""
        return self._turn

    @property
    def pending(self) -> list[DecisionRequested]:
        """The decisions its turn waits for now (a permission, a question), oldest first,
        each once the log holds it: empty while no turn took it, or its turn waits for
        none."""
        turn = self._turn
        if turn is None:
            return []
        session = self._session
        return [d for d in session.logged_decisions() if d.turn == turn]

    @property
    def settled(self) -> bool:
        """True once its fate is known (awaiting it then returns without waiting)."""
        return self._outcome is not None

    def __await__(self) -> Generator[Any, Any, Answer[T]]:
        return self._wait().__await__()

    def on_settled(self, callback: Callable[[Answer[T]], None]) -> None:
        """Call `callback` with the `Answer` synchronously when the prompt is settled (at
        once if it is), before its awaiters run and before the agent does anything else:
        for a prompt a turn took, before the turn's end is reported and so before the next
        turn starts; under ``sync="always"`` only once the turn's end is fsynced, as for an
        awaiter. What an answer is sent from without a task per prompt.

        One callback per prompt (a second call raises `RuntimeError`). It runs in the
        agent's task and must not block; an exception it raises is logged and dropped, so
        the agent's bookkeeping is never cut short by it.
        """
        if self._on_settled is not None:
            raise RuntimeError(f"{self!r} already has a settle callback")
        if self._outcome is None:
            self._on_settled = callback
        else:
            _call(callback, self._answer())

    def cancel(self, reason: str | None = None) -> None:
        """Stop this prompt, and only it. Still queued (no turn took it), it is taken back
        and settles ``withdrawn`` with `reason`; taken by the running turn, that turn is
        cancelled as `Agent.cancel` cancels it (it ends ``aborted`` with `reason`, default
        ``"cancelled"``, and so do the prompts it took), and what is queued behind it stays
        queued. A no-op once it is settled. Synchronous: it never checkpoints."""
        if self._outcome is None and self._owner is not None:
            self._owner.cancel_prompt(self, reason)

    def _answer(self) -> Answer[T]:
        """Its answer, once settled (read from the log at the first call, then kept)."""
        outcome = self._outcome
        assert outcome is not None
        if isinstance(outcome, TurnOutcome):  # the turn's answer, kept instead of its outcome
            outcome = self._outcome = outcome.answer(self._session)  # type: ignore[assignment]
        return outcome  # type: ignore[return-value]

    async def _wait(self) -> Answer[T]:
        if self._outcome is None:  # parked until `settle` wakes it
            waiters = self._waiters
            if waiters is None:
                waiters = self._waiters = Parking()
            await waiters.park()
        else:
            await trio.lowlevel.checkpoint()
        return self._answer()

    def events(self) -> PromptEvents:
        """Follow this prompt's turn from now on: each `PromptEvent` it logs, in log order,
        until its ``turn/end`` (the last one yielded).

        It reads the session's log at a position of its own, so a slow reader
        never slows the turn and nothing is buffered for it; any number may
        follow one prompt. Events logged before the call are not yielded: a
        turn that ended before the call yields nothing, and so does a prompt
        no turn takes (the iterator ends when it is settled). A cancelled
        reader loses nothing: the next ``__anext__`` goes on from its position.

        A running call's progress is yielded once the reader has read the log up
        to its end: the call's latest notice not yet yielded, so a slow reader
        sees fewer, later ones (each stands for the earlier), never one after the
        call's ``tool/result``, and none published before the call.
        """
        session = self._session
        live = session.live
        seen = live.version if live is not None else 0
        return PromptEvents(self, session.next_seq, session.open_turn, seen)

    def text(self) -> PromptText:
        """Follow this prompt's turn's text from now on: each text delta the model streams
        (``async for text in prompt.text(): print(text, end="")``), until its turn ends.
        `events` with everything but the text left out: the same positions, the same rules
        for a cancelled reader (it loses nothing) and for a prompt no turn takes."""
        return PromptText(self.events())


class PromptText:
    """The iterator `Prompt.text` returns: the text deltas among its turn's events."""

    __slots__ = ("_events",)

    def __init__(self, events: PromptEvents) -> None:
        self._events = events

    def __aiter__(self) -> PromptText:
        return self

    async def __anext__(self) -> str:
        async for event in self._events:
            if type(event) is AssistantChunk and type(event.chunk) is TextDelta:
                return event.chunk.text
        raise StopAsyncIteration


class PromptEvents:
    """The iterator `Prompt.events` returns: a position in the log and the turn it is in."""

    __slots__ = ("_current", "_finished", "_position", "_prompt", "_seen")

    def __init__(self, prompt: Prompt[Any], position: int, current: int | None, seen: int) -> None:
        self._prompt = prompt
        self._position = position
        self._current = current  # the turn the log has open at the position
        self._seen = seen  # the version of the latest progress notice yielded (`LiveCalls`)
        self._finished = False

    def __aiter__(self) -> PromptEvents:
        return self

    async def __anext__(self) -> PromptEvent:
        prompt = self._prompt
        session = prompt._session
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancel lands before any event is read
        while not self._finished:
            turn = prompt._turn
            if turn is None:  # until a turn takes it, what it will be is unknown: park
                if prompt._outcome is not None:  # no turn took it
                    break
                readers = prompt._readers
                if readers is None:
                    readers = prompt._readers = Parking()
                await readers.park()  # until `take` or `settle`
                continue
            event = self._next_of(session, turn)
            if event is None and self._current == turn:
                event = self._progress_of(session)
            if event is not None:
                await trio.lowlevel.cancel_shielded_checkpoint()  # read: it is returned
                return event
            if prompt._outcome is not None:  # its end is behind the call
                break
            await session.wait_for_append(self._position)
        self._finished = True
        raise StopAsyncIteration

    def _next_of(self, session: Session, turn: int) -> PromptEvent | None:
        """The next event of `turn` the log holds past the position, if any (moving past it)."""
        events = session.events
        while self._position < len(events):
            event = events[self._position]
            self._position += 1
            if isinstance(event, TurnStart):
                self._current = event.turn
            if self._current != turn:
                continue
            if isinstance(event, TurnEnd):
                self._current = None
                self._finished = True
                return event
            if isinstance(event, AssistantChunk):
                if isinstance(event.chunk, TextDelta | ReasoningDelta):
                    return event
            elif isinstance(
                event,
                ToolCall
                | ToolStart
                | ToolResult
                | CompactionStart
                | Compacted
                | StepEnd
                | ModelRetry,
            ):
                return event
        return None

    def _progress_of(self, session: Session) -> ToolProgress | None:
        """The next progress notice of the session's running calls not yet yielded."""
        live = session.live
        entry = live.after(self._seen) if live is not None else None
        if entry is None:
            return None
        self._seen, progress = entry
        return progress


_PROCESS = secrets.token_hex(4)
_counter = itertools.count(1)


def new_message_id() -> str:
    """A message id unique across processes (with overwhelming probability)."""
    return f"msg-{_PROCESS}-{next(_counter)}"


def new_prompt(
    agent_id: str,
    session: Session,
    content: Content,
    source: MessageSource | None,
    output: type[T] | None,
    limits: Limits | None = None,
    owner: PromptOwner | None = None,
) -> Prompt[T]:
    """A prompt `owner` (agent `agent_id`) queues for its session: `content` is text, or
    content blocks (`greenroom.protocol.content`), checked here. A bad block, one past the
    limits, or text that is not text or is blank raises `TypeError` or `ValueError` naming
    the agent (and a block's index); `limits` that are not `Limits`, a `TypeError`."""
    if limits is not None and type(limits) is not Limits:
        raise TypeError(f"agent {agent_id!r}: limits must be Limits, got {type(limits).__name__}")
    if isinstance(content, str):
        text = checked_text(agent_id, content)
        return Prompt(session, text, source or USER, new_message_id(), output, (), limits, owner)
    try:
        blocks = checked(content)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"agent {agent_id!r}: {exc}") from None
    message_id = new_message_id()
    return Prompt(
        session, text_of(blocks), source or USER, message_id, output, blocks, limits, owner
    )


def checked_text(agent_id: str, content: object) -> str:
    """`content` if it is non-blank text, else a `TypeError` or `ValueError` naming the
    agent."""
    if not isinstance(content, str):
        raise TypeError(
            f"agent {agent_id!r}: content must be text (str), got {type(content).__name__}"
        )
    if not content.strip():
        raise ValueError(f"agent {agent_id!r}: content must be non-empty text")
    return content


def adopt(prompt: Prompt[Any], owner: PromptOwner) -> None:
    """`owner` holds `prompt`, made without it (a cut turn's, carried on): its `cancel`
    asks `owner`."""
    prompt._owner = owner


def take(prompts: Sequence[Prompt[Any]], turn: int) -> None:
    """`prompts` joined `turn` (the agent logs their messages next); their readers go on
    reading the log."""
    for prompt in prompts:
        prompt._turn = turn
        if prompt._readers is not None:
            prompt._readers.wake()


def settle(prompts: Sequence[Prompt[Any]], outcome: TurnOutcome | Answer[Any]) -> None:
    """Give each prompt of `prompts` its fate, call its settle callback, wake its awaiters
    and the readers no turn let in. Once per prompt: the agent settles a prompt as it takes
    it out of the one place it was (a FIFO of the inbox, or the turn that took it). The
    readers of a turn's prompts need no wake: its ``turn/end`` was appended before."""
    for prompt in prompts:
        prompt._outcome = outcome
        callback, prompt._on_settled = prompt._on_settled, None
        if callback is not None:
            _call(callback, prompt._answer())
        if prompt._waiters is not None:
            prompt._waiters.wake()
        if prompt._readers is not None:
            prompt._readers.wake()


def _call(callback: Callable[[Answer[T]], None], answer: Answer[T]) -> None:
    try:
        callback(answer)
    except Exception:  # the settling goes on for the other prompts and the turn
        logger.exception("a prompt's settle callback raised")


def dropped(stop_reason: StopReason, reason: str | None = None) -> Answer[object]:
    """The answer of prompts no turn took: ``aborted`` by a cancel, ``withdrawn``, ``disposed``."""
    return Answer(stop_reason=stop_reason, reason=reason)


def _stop(reason: TurnEndReason) -> tuple[StopReason, str | None]:
    match reason:
        case Completed():
            return "completed", None
        case Aborted(reason=why):
            return "aborted", why
        case Errored(message=message):
            return "error", message
        case Disposed():
            return "disposed", None
        case MaxTokens():
            return "max-tokens", None
        case Refused():
            return "refusal", None
        case LimitReached(limit=limit, allowed=allowed, reached=None):
            return "limit", f"{limit} limit ({allowed}) reached: the cost is unknown (no price)"
        case LimitReached(limit=limit, allowed=allowed, reached=reached):
            return "limit", f"{limit} limit reached: {reached} of {allowed}"
        case Guarded(guard=guard, at=at, message=message):
            return "guarded", f"guard {guard!r} tripped at the {at.replace('_', ' ')}: {message}"
    return "error", "interrupted"  # crash repair's reason, never a live turn's


def _read_answer(session: Session, outcome: TurnOutcome) -> Answer[object]:
    """The turn's answer, read off its events in the log."""
    text = ""
    calls: list[ToolCall] = []
    results: dict[str, ToolResult] = {}
    usage: Usage | None = None
    for event in session.events[outcome.start : outcome.end + 1]:
        kind = type(event)
        if kind is AssistantMessage:
            assert isinstance(event, AssistantMessage)
            if event.content:
                text = event.content
            if event.usage is not None:
                usage = event.usage if usage is None else usage + event.usage
        elif kind is ToolCall:
            assert isinstance(event, ToolCall)
            if not (outcome.structured and event.name == OUTPUT_TOOL):
                calls.append(event)
        elif kind is ToolResult:
            assert isinstance(event, ToolResult)
            results[event.call_id] = event
    stop_reason, why = _stop(outcome.reason)
    return Answer(
        stop_reason=stop_reason,
        reason=why,
        turn=outcome.turn,
        text=text,
        tool_calls=tuple(_record(call, results.get(call.call_id)) for call in calls)
        if calls
        else (),
        usage=usage,
        output=outcome.output,
    )


def _record(call: ToolCall, result: ToolResult | None) -> ToolCallRecord:
    if result is None:  # the log holds a result for every call; a torn log may not
        return ToolCallRecord(call.call_id, call.name, call.arguments, "", is_error=True)
    return ToolCallRecord(
        call.call_id, call.name, call.arguments, result.content, is_error=result.is_error
    )
