"""Compaction: when a turn shrinks what the model is sent, and the step that does it.

A compaction is one ``context/compacted`` event in the log (`Compacted`): a
summary standing for the older part of the history, and which events after it
stay verbatim. `Session.messages` reads it (docs/semantics.md, "Compaction");
no event leaves the log. This module decides when one is due (`Compactor.fit`,
before each model call) and writes it: a model call that summarizes the old
part, or, when that call fails, a truncation that never fails.

The estimate of a request's input tokens is the latest reply's reported usage
(its input and output tokens) plus `BYTES_PER_TOKEN` per UTF-8 byte of what the
history gained since; with no usage reported since the last compaction, the
system prompt and the tool schemas are counted by the same rule.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import msgspec
import trio

from greenroom.models.base import ModelAdapter
from greenroom.protocol.events import (
    AssistantMessage,
    Compacted,
    Cut,
    SessionEvent,
    SteeringMessage,
    ToolCall,
    ToolResult,
    TurnStart,
)
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    ModelRequest,
    TextDelta,
    ToolSchema,
    ToolTurn,
    UserTurn,
)
from greenroom.session.session import Session, message_of, message_size, summary_text
from greenroom.spill import cut

logger = logging.getLogger("greenroom.compaction")

#: The estimate's rule where no tokenizer is at hand: 4 UTF-8 bytes per token (English text
#: and code run 3.5 to 4.5; CJK text about 1 token per character, 3 bytes: an underestimate,
#: which the provider's overflow error and the next reported usage correct).
BYTES_PER_TOKEN: Final = 4
#: Characters a truncated tool output keeps, or a cut message at the least.
KEPT_CHARS: Final = 500
#: Characters of one entry of the old part shown to the summarizing model.
ENTRY_CHARS: Final = 2_000
#: The part of the window the summarizing request's transcript may take.
TRANSCRIPT_SHARE: Final = 0.5
#: The tool whose results are sub-agents' answers: never truncated, shown whole to the summary.
TASK_TOOL: Final = "task"

SUMMARY_SYSTEM: Final = """\
You write the summary that replaces the older part of a conversation between a user and \
an AI agent that uses tools. The agent will continue from your summary and the most recent \
messages only, so keep everything it needs: the user's goals and requests, in their words \
where it matters; decisions made and why; facts learned (file paths, names, commands, \
errors and their fixes); the results of sub-agent tasks; work finished and work still \
open; what the agent was doing last. Leave out pleasantries and dead ends that taught \
nothing. Write plain prose and lists, no preamble."""


class CompactionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When a turn compacts, and how much recent context stays verbatim.

    Before a model call whose estimated input passes `threshold` of the model's context
    window, the turn runs a compaction step first; the events kept verbatim after the
    summary take at most `keep` of the window (their newest whole steps; a single
    message larger than that is cut, with a marker). `ValueError` unless
    0 < keep < threshold <= 1.
    """

    threshold: float = 0.8
    keep: float = 0.3

    def __post_init__(self) -> None:
        if not 0 < self.keep < self.threshold <= 1:
            raise ValueError(
                "compaction needs 0 < keep < threshold <= 1 (fractions of the context window),"
                f" got threshold={self.threshold!r}, keep={self.keep!r}"
            )


DEFAULT_POLICY: Final = CompactionPolicy()


class Compactor:
    """One agent's compaction: the estimate, a compaction asked for, the compaction step.

    Not shared between agents: a sub-agent has its own, over its own session.
    """

    __slots__ = ("_instructions", "_policy", "_schemas", "_session", "requested")

    def __init__(self, session: Session, policy: CompactionPolicy) -> None:
        self._session = session
        self._policy = policy
        #: True while a compaction asked for (`request`) has not run yet (read-only: an
        #: attribute, not a property, since the agent reads it at every wake-up and turn end).
        self.requested = False
        self._instructions: str | None = None
        self._schemas: tuple[list[ToolSchema], int] | None = None  # the last tools' bytes

    def request(self, instructions: str | None) -> None:
        """Compact before the next model call (the last instructions asked for win)."""
        self.requested = True
        self._instructions = instructions

    def withdraw(self) -> None:
        """Forget a compaction asked for and not run yet (a cancel)."""
        self.requested, self._instructions = False, None

    def estimate(self, request: ModelRequest) -> int:
        """The input tokens of `request` as the module docstring's rule counts them."""
        session = self._session
        added = session.added_bytes
        if not session.reported_tokens:
            added += len((request.system or "").encode()) + self._schema_bytes(request.tools)
        return session.reported_tokens + -(-added // BYTES_PER_TOKEN)

    def due(self, request: ModelRequest, model: ModelAdapter) -> bool:
        """Whether `fit` would compact before `request` (it was asked for, or the estimate
        passes the threshold of `model`'s window). Never checkpoints: a step that needs no
        compaction, nearly every one, need not enter `fit` at all."""
        if self.requested:
            return True
        window = _window_of(model)
        return bool(window) and self.estimate(request) > self._policy.threshold * window

    async def fit(
        self,
        request: ModelRequest,
        model: ModelAdapter,
        model_id: str,
        turn: int,
        step: int,
        *,
        overflowed: bool = False,
    ) -> ModelRequest:
        """`request`, or, when a compaction is due, the same request over the history the
        compaction left (its ``context/compacted`` appended first).

        Due: one was asked for, the provider refused `request` as too long
        (`overflowed`: the window is taken to be at most the estimate, and the verbatim
        part is halved, since the estimate was wrong), or the
        estimate passes the policy's threshold of the model's ``context_window`` (a
        model without one is compacted only in the first two cases). A cancel during
        the summarizing call appends nothing: the log is as it was.
        """
        if not overflowed and not self.due(request, model):
            return request
        window = _window_of(model)
        estimate = self.estimate(request)
        if overflowed:  # the provider refused `estimate` tokens (as counted here): less fits
            window = min(window, estimate) if window else estimate
        elif not window:  # asked for, of a model with no window: measure against what is there
            window = estimate
        keep = self._policy.keep / 2 if overflowed else self._policy.keep
        instructions = self._instructions
        try:
            event = await self._compact(
                request, model, model_id, turn, step, max(window, 1), keep, estimate
            )
        except trio.Cancelled:
            raise
        except Exception:  # a fault here must not fail every later step: send as it is
            logger.exception("session %r: the compaction failed", self._session.id)
            event = None
        self.requested, self._instructions = False, None
        if event is None:
            return request
        if instructions is not None:
            event = msgspec.structs.replace(event, instructions=instructions)
        self._session.append(event)
        return msgspec.structs.replace(request, messages=self._session.messages())

    async def _compact(
        self,
        request: ModelRequest,
        model: ModelAdapter,
        model_id: str,
        turn: int,
        step: int,
        window: int,
        keep: float,
        estimate: int,
    ) -> Compacted | None:
        """The compaction due now, or None when there is nothing to summarize or cut."""
        session = self._session
        events = session.events
        previous = session.compaction
        start = previous.kept_seq if previous is not None else 0
        budget = int(keep * window * BYTES_PER_TOKEN)
        verbatim = budget  # what the verbatim part is planned to fit
        if self.requested:  # asked for: summarize at least two thirds of what is there
            verbatim = min(budget, _bytes_from(events, start, {}) // 3)
        kept_seq, kept_bytes = _plan(events, start, verbatim)
        carried = [c for c in previous.cuts if c.seq >= kept_seq] if previous else []
        cuts, kept_bytes = _fit_kept(events, kept_seq, carried, kept_bytes, budget)
        if kept_seq == start:  # nothing new to summarize: only what is too large is cut
            if cuts == carried:
                return None
            summary = previous.summary if previous is not None else ""
            model_name = previous.model if previous is not None else ""
        else:
            try:
                summary = await self._summarize(request, model, events, start, kept_seq, window)
            except trio.Cancelled:
                raise
            except Exception as exc:
                degraded = f"the summary could not be written: {exc}"[:500]
                logger.warning("session %r: %s; truncating instead", session.id, degraded)
                return self._truncated(request, turn, step, budget, estimate, degraded, carried)
            model_name = model_id
        return self._event(
            request, turn, step, summary, kept_seq, cuts, model_name, estimate, kept_bytes
        )

    def _event(
        self,
        request: ModelRequest,
        turn: int,
        step: int,
        summary: str,
        kept_seq: int,
        cuts: list[Cut],
        model_name: str,
        estimate: int,
        kept_bytes: int,
        degraded: str | None = None,
    ) -> Compacted:
        events = self._session.events
        previous = self._session.compaction
        event = Compacted(
            turn=turn,
            step=step,
            summary=summary,
            first_seq=previous.first_seq if previous is not None else 0,
            kept_seq=kept_seq,
            first_turn=previous.first_turn if previous is not None else _turn_at(events, 0),
            last_turn=_turn_at(events, max(kept_seq - 1, 0)),
            model=model_name,
            tokens_before=estimate,
            tokens_after=0,
            cuts=cuts,
            degraded=degraded,
        )
        after = len((request.system or "").encode()) + self._schema_bytes(request.tools)
        after += kept_bytes + (len(summary_text(event).encode()) if summary else 0)
        return msgspec.structs.replace(event, tokens_after=-(-after // BYTES_PER_TOKEN))

    def _truncated(
        self,
        request: ModelRequest,
        turn: int,
        step: int,
        budget: int,
        estimate: int,
        degraded: str,
        cuts: list[Cut],
    ) -> Compacted:
        """What a failed summary leaves: tool outputs cut to `KEPT_CHARS`, oldest turn first
        and within a turn largest first (a sub-agent's answer never), until the history
        fits `budget`; if that is not enough, the part before the verbatim one dropped, a
        marker in the summary's place saying which turns and why."""
        events = self._session.events
        previous = self._session.compaction
        start = previous.kept_seq if previous is not None else 0
        known = {c.seq: c.kept for c in cuts}
        total = _bytes_from(events, start, known)
        names = _tool_names(events, start)
        outputs = sorted(
            (e.turn, -len(e.content), e.seq)
            for e in events[start:]
            if type(e) is ToolResult
            and len(e.content) > KEPT_CHARS
            and e.seq not in known
            and names.get(e.call_id) != TASK_TOOL
        )
        for *_, seq in outputs:
            if total <= budget:
                break
            before = _event_bytes(events[seq])
            known[seq] = KEPT_CHARS
            total -= before - _event_bytes(events[seq], KEPT_CHARS)
        kept_seq = start
        summary = previous.summary if previous is not None else ""
        if total > budget:
            kept_seq, _ = _plan(events, start, budget)
            known = {seq: kept for seq, kept in known.items() if seq >= kept_seq}
            total = _bytes_from(events, kept_seq, known)
            fitted, total = _fit_kept(
                events, kept_seq, [Cut(seq, kept) for seq, kept in known.items()], total, budget
            )
            known = {c.seq: c.kept for c in fitted}
            first = previous.first_turn if previous is not None else _turn_at(events, 0)
            last = _turn_at(events, max(kept_seq - 1, 0))
            summary = (
                f"[The conversation before this point (turns {first}-{last}) was dropped to"
                f" fit the model's context window: {degraded}. The session's log holds it.]"
            )
        kept = [Cut(seq, chars) for seq, chars in sorted(known.items())]
        return self._event(
            request, turn, step, summary, kept_seq, kept, "", estimate, total, degraded
        )

    async def _summarize(
        self,
        request: ModelRequest,
        model: ModelAdapter,
        events: Sequence[SessionEvent],
        start: int,
        end: int,
        window: int,
    ) -> str:
        """The model's summary of the previous summary and events ``start`` to `end`; raises
        when the call fails or says nothing."""
        previous = self._session.compaction
        budget = int(TRANSCRIPT_SHARE * window * BYTES_PER_TOKEN)
        text = _transcript(events, start, end, previous.summary if previous else "", budget)
        ask = "Summarize this conversation so far."
        if self._instructions:
            ask += f"\nThe user asks of this summary: {self._instructions}"
        summary_request = ModelRequest(
            messages=[UserTurn(f"{text}\n\n{ask}")], model=request.model, system=SUMMARY_SYSTEM
        )
        parts: list[str] = []
        stream = model.stream(summary_request)
        try:
            async for chunk in stream:
                if type(chunk) is TextDelta:
                    parts.append(chunk.text)
                elif type(chunk) is Finish and chunk.reason in ("error", "aborted", "refusal"):
                    raise RuntimeError(chunk.message or f"the model finished {chunk.reason}")
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        summary = "".join(parts).strip()
        if not summary:
            raise RuntimeError("the model's summary was empty")
        return summary

    def _schema_bytes(self, tools: list[ToolSchema]) -> int:
        """UTF-8 bytes of `tools` as JSON, remembered for the same list."""
        if not tools:
            return 0
        known = self._schemas
        if known is not None and known[0] is tools:
            return known[1]
        size = len(msgspec.json.encode(tools))
        self._schemas = (tools, size)
        return size


def _window_of(model: ModelAdapter) -> int:
    window = getattr(model, "context_window", 0)
    return window if isinstance(window, int) and window > 0 else 0


def _event_bytes(event: SessionEvent, kept: int | None = None) -> int:
    message = message_of(event, kept)
    return 0 if message is None else message_size(message)


def _bytes_from(events: Sequence[SessionEvent], start: int, cuts: dict[int, int]) -> int:
    return sum(_event_bytes(e, cuts.get(e.seq)) for e in events[start:])


def _plan(events: Sequence[SessionEvent], start: int, budget: int) -> tuple[int, int]:
    """Where the verbatim part begins, and its bytes: the earliest turn or step start after
    `start` whose events to the end fit `budget`; when none fits, the latest one (the
    current step's inputs stay, cut to fit later). `start` itself if none is after it.

    A cut point is a ``turn/start``, a ``steering/message`` or an ``assistant/message``:
    before each, every tool call has its result, so a call and its result always stay
    on the same side.
    """
    size = 0
    best, best_size = len(events), 0
    latest: tuple[int, int] | None = None
    for index in range(len(events) - 1, start, -1):
        event = events[index]
        size += _event_bytes(event)
        if type(event) in _CUT_POINTS:
            if latest is None:
                latest = (index, size)
            if size > budget:
                break
            best, best_size = index, size
    if best < len(events):
        return best, best_size
    if latest is not None:
        return latest
    return start, _bytes_from(events, start, {})


_CUT_POINTS: Final = frozenset({TurnStart, SteeringMessage, AssistantMessage})


def _fit_kept(
    events: Sequence[SessionEvent], kept_seq: int, cuts: list[Cut], size: int, budget: int
) -> tuple[list[Cut], int]:
    """Cut the largest verbatim texts until the verbatim part fits `budget` (each keeps at
    least `KEPT_CHARS`): a single message larger than the window never reaches the model.
    A sub-agent's answer is cut last, only when cutting every other text was not enough."""
    if size <= budget:
        return cuts, size
    known = {c.seq: c.kept for c in cuts}
    names = _tool_names(events, kept_seq)
    sizes = sorted(
        (
            type(e) is ToolResult and names.get(e.call_id) == TASK_TOOL,
            -_event_bytes(e),
            e.seq,
        )
        for e in events[kept_seq:]
        if e.seq not in known
    )
    for _, minus, seq in sizes:
        whole = -minus
        if size <= budget or whole <= KEPT_CHARS:
            break
        kept = max(KEPT_CHARS, whole - (size - budget))
        known[seq] = kept
        size -= whole - _event_bytes(events[seq], kept)
    return [Cut(seq, kept) for seq, kept in sorted(known.items())], size


def _turn_at(events: Sequence[SessionEvent], index: int) -> int:
    """The turn the event at `index` belongs to (the latest ``turn/start`` at or before it)."""
    for position in range(min(index, len(events) - 1), -1, -1):
        event = events[position]
        if type(event) is TurnStart:
            return event.turn
    return 0


def _tool_names(events: Sequence[SessionEvent], start: int) -> dict[str, str]:
    return {e.call_id: e.name for e in events[start:] if type(e) is ToolCall}


def _transcript(
    events: Sequence[SessionEvent], start: int, end: int, previous: str, budget: int
) -> str:
    """The old part as text for the summarizing model: each entry at most `ENTRY_CHARS`
    (a sub-agent's answer whole), the newest entries first to go in when all do not fit
    `budget`, and a line saying how many older ones were left out."""
    names = _tool_names(events, start)
    entries: list[str] = []
    for event in events[start:end]:
        message = message_of(event)
        if message is None:
            continue
        turn = getattr(event, "turn", None)
        where = f"[turn {turn}] " if turn is not None else ""
        match message:
            case UserTurn(content=content):
                entries.append(f"{where}user: {cut(content, ENTRY_CHARS, 'left out')}")
            case AssistantTurn(content=content, tool_calls=calls):
                if content:
                    entries.append(f"{where}agent: {cut(content, ENTRY_CHARS, 'left out')}")
                for call in calls:
                    arguments = cut(call.arguments, ENTRY_CHARS, "left out")
                    entries.append(f"{where}agent called {call.name} {arguments}")
            case ToolTurn(call_id=call_id, content=content, is_error=is_error):
                name = names.get(call_id, "a tool")
                limit = budget // 4 if name == TASK_TOOL else ENTRY_CHARS
                kind = "error" if is_error else "result"
                entries.append(f"{where}{name} {kind}: {cut(content, limit, 'left out')}")
    head = f"Summary of the conversation before:\n{previous}\n\n" if previous else ""
    room = budget - len(head)
    taken: list[str] = []
    for entry in reversed(entries):
        room -= len(entry) + 1
        if room < 0:
            break
        taken.append(entry)
    taken.reverse()
    left_out = len(entries) - len(taken)
    note = f"[{left_out} older entries left out]\n" if left_out else ""
    return f"{head}The conversation:\n{note}" + "\n".join(taken)
