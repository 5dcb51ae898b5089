"""Compaction: when a turn shrinks what the model is sent, and the step that does it.

A compaction is a ``context/compacting`` event when it starts and one
``context/compacted`` event when it ends (`CompactionStart`, `Compacted`): a
summary standing for the older part of the history, the turn's own prompts and
the open plan carried past it, and which events after it stay verbatim.
`Session.messages` reads it (docs/semantics.md, "Compaction"); no event leaves
the log. This module decides when one is due (`Compactor.due`, before each model
call) and writes it (`Compactor.fit`): a model call that summarizes the old part
within a budget and a deadline, or, when that call fails, a truncation that never
fails.

The estimate of a request's input tokens is the latest reply's reported usage (its
input and output tokens) plus the history's growth since, at the model's bytes per
token (`BYTES_PER_TOKEN` until the replies' reported input tokens correct it,
`Compactor.observe`); with no usage reported since the last compaction, the system
prompt and the tool schemas are counted by the same rule, and the threshold is taken
`UNANCHORED_MARGIN` lower. Every budget of a compaction (the verbatim part, the
carried events, the summary, the summarizing transcript) is a share of the window
in bytes at the same rate, so what a compaction leaves is estimated at most
``keep + summary`` of the window (with the system prompt and the tools besides).

`CompactionPolicy` says when and how much (threshold, keep, summary, deadline); a
`Compactor` (one per agent) keeps the estimate and the windows refusals taught
(``config/set`` ``context_window:<id>``, `learned_window`); `bounded_summary` bounds what
the summarizer wrote.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

import msgspec
import trio

from greenroom.actors.side import read_side_text
from greenroom.models.base import ContextOverflow, ModelAdapter
from greenroom.protocol.content import Resource
from greenroom.protocol.events import (
    AssistantMessage,
    Compacted,
    CompactionCause,
    CompactionStart,
    ConfigSet,
    Cut,
    PlanSet,
    SessionEvent,
    SteeringMessage,
    ToolCall,
    ToolResult,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import (
    AssistantTurn,
    ModelRequest,
    ToolSchema,
    ToolTurn,
    Usage,
    UserTurn,
)
from greenroom.session.persistence import PersistenceError
from greenroom.session.session import (
    Session,
    carried_message,
    message_of,
    message_size,
    plan_text,
    summary_text,
)
from greenroom.spill import cut

logger = logging.getLogger("greenroom.compaction")

#: The estimate's rule where no tokenizer is at hand, and its highest rate: 4 UTF-8 bytes per
#: token (English text and code run 3.5 to 4.5; CJK text about 1 token per character, 3
#: bytes: an underestimate, which the replies' reported tokens then correct).
BYTES_PER_TOKEN: Final = 4
#: The lowest rate a correction may reach (one byte a token: no tokenizer counts more).
MIN_BYTES_PER_TOKEN: Final = 1.0
#: Bytes of growth a reply's reported tokens must cover to correct the rate (fewer are noise:
#: a message's framing alone is a few tokens).
SAMPLE_BYTES: Final = 512
#: How much lower the threshold is taken when no reported usage anchors the estimate (a model
#: that reports none, or the first step after a compaction): the bytes rule alone is off by
#: this much for code.
UNANCHORED_MARGIN: Final = 0.1
#: Characters a truncated tool output keeps, or a cut message at the least.
KEPT_CHARS: Final = 500
#: Characters of one entry of the old part shown to the summarizing model.
ENTRY_CHARS: Final = 2_000
#: The part of the window the summarizing request's transcript may take.
TRANSCRIPT_SHARE: Final = 0.5
#: The part of the verbatim budget the carried events (the turn's prompts, the open plan) may
#: take at most; the newest steps have the rest.
CARRIED_SHARE: Final = 0.5
#: The tool whose results are sub-agents' answers: never truncated, shown whole to the summary.
TASK_TOOL: Final = "task"
#: Characters of `Agent.compact` instructions at most (more is refused, naming this cap).
MAX_INSTRUCTIONS: Final = 10_000
#: The ``config/set`` key of a window learned from a refusal, the model's id after it.
WINDOW_KEY: Final = "context_window:"
#: What a compactor that has measured against no window yet reads.
_NO_WINDOWS: Final[Mapping[str, int]] = MappingProxyType({})

SUMMARY_SYSTEM: Final = """\
You write the summary that replaces the older part of a conversation between a user and \
an AI agent that uses tools. The agent will continue from your summary and the most recent \
messages only, so keep everything it needs. Begin with the user's goal: what they asked \
for, in their words where it matters, and what of it is still open. Then the decisions made \
and why; facts learned (file paths, names, commands, errors and their fixes); the results \
of sub-agent tasks; work finished; what the agent was doing last. Leave out pleasantries \
and dead ends that taught nothing. Write plain prose and lists, no preamble, within the \
length you are given."""


class CompactionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When a turn compacts, how much recent context stays verbatim, how long a summary may
    be and how long it may take.

    Before a model call whose estimated input passes `threshold` of the model's context
    window, the turn runs a compaction step first; the events kept verbatim after the
    summary (the turn's carried prompts and plan among them) take at most `keep` of the
    window (their newest whole steps; a single message larger than that is cut, with a
    marker), the summary at most `summary` of it, and the summarizing call at most
    `deadline` seconds (its retries included), past which the compaction truncates
    instead. `ValueError` unless 0 < keep, 0 < summary, keep + summary <= (1 -
    `UNANCHORED_MARGIN`) * threshold, threshold <= 1 and 0 < deadline: what a compaction
    leaves must not be due for another at once.
    """

    threshold: float = 0.8
    keep: float = 0.3
    summary: float = 0.1
    deadline: float = 30.0

    def __post_init__(self) -> None:
        room = (1 - UNANCHORED_MARGIN) * self.threshold
        shares = (self.keep, self.summary)
        if min(shares) <= 0 or sum(shares) > room or self.threshold > 1:
            raise ValueError(
                "compaction needs 0 < keep, 0 < summary, keep + summary <="
                f" {1 - UNANCHORED_MARGIN:g} * threshold and threshold <= 1 (fractions of the"
                f" context window), got threshold={self.threshold!r}, keep={self.keep!r},"
                f" summary={self.summary!r}"
            )
        if not (math.isfinite(self.deadline) and self.deadline > 0):
            raise ValueError(f"compaction deadline must be seconds > 0, got {self.deadline!r}")


DEFAULT_POLICY: Final = CompactionPolicy()


def learned_window(config: Mapping[str, str], model_id: str) -> int:
    """The window a refusal taught the session for `model_id` (its ``config/set``), 0 if none."""
    value = config.get(WINDOW_KEY + model_id)
    if value is None or not value.isdigit():
        return 0
    return int(value)


class Compactor:
    """One agent's compaction: the estimate, the windows and rates it learned, a compaction
    asked for, the compaction step.

    Not shared between agents: a sub-agent has its own, over its own session.
    """

    __slots__ = (
        "_instructions",
        "_policy",
        "_rates",
        "_schemas",
        "_session",
        "_windows",
        "requested",
    )

    def __init__(self, session: Session, policy: CompactionPolicy) -> None:
        self._session = session
        self._policy = policy
        #: True while a compaction asked for (`request`) has not run yet (read-only: an
        #: attribute, not a property, since the agent reads it at every wake-up and turn end).
        self.requested = False
        self._instructions: str | None = None
        self._schemas: tuple[list[ToolSchema], int] | None = None  # the last tools' bytes
        # Made by their first entries: an agent that never took a step holds neither.
        self._windows: dict[str, int] | None = None  # by model id: the window, 0: none
        self._rates: dict[str, float] | None = None  # by model id: bytes a token, corrected

    def request(self, agent_id: str, instructions: object) -> None:
        """Compact before the next model call (the last instructions asked for win; blank
        is none). A `TypeError` for instructions that are not text, a `ValueError` for
        text past `MAX_INSTRUCTIONS` characters, each naming agent `agent_id`, and nothing
        is asked."""
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(
                f"agent {agent_id!r}: compaction instructions must be text (str),"
                f" got {type(instructions).__name__}"
            )
        text = instructions.strip() or None if instructions else None
        if text is not None and len(text) > MAX_INSTRUCTIONS:
            raise ValueError(
                f"agent {agent_id!r}: compaction instructions are {len(text):,}"
                f" characters, past the cap of {MAX_INSTRUCTIONS:,}"
            )
        self.requested = True
        self._instructions = text

    def withdraw(self) -> None:
        """Forget a compaction asked for and not run yet (a cancel)."""
        self.requested, self._instructions = False, None

    def estimate(self, request: ModelRequest, model_id: str) -> int:
        """The input tokens of `request` to `model_id` as the module docstring's rule counts
        them."""
        session = self._session
        added = session.added_bytes
        if not session.reported_tokens:
            added += len((request.system or "").encode()) + self._schema_bytes(request.tools)
        rate = self._rate(model_id)
        return session.reported_tokens + math.ceil(added / rate)

    def due(self, request: ModelRequest, model: ModelAdapter, model_id: str) -> bool:
        """Whether `fit` would compact before `request` to `model` (its id `model_id`): it
        was asked for, or the estimate passes the threshold of the model's window (its
        adapter's ``context_window``, or the smaller one a refusal taught). Never
        checkpoints, and costs no call but its own once the window is known: a step that
        needs no compaction, nearly every one, need not enter `fit` at all."""
        if self.requested:
            return True
        window = (self._windows or _NO_WINDOWS).get(model_id)
        if window is None:
            window = self._window(model, model_id)
        if not window:
            return False
        session = self._session
        if session.reported_tokens:
            rate = self._rate(model_id)
            added = session.added_bytes / rate
            return session.reported_tokens + added > self._policy.threshold * window
        limit = self._policy.threshold * (1 - UNANCHORED_MARGIN) * window
        return self.estimate(request, model_id) > limit

    def observe(self, request: ModelRequest, usage: Usage, model_id: str) -> None:
        """Correct `model_id`'s bytes per token by `usage`, what the reply to `request`
        reported; called before that reply is logged, so the session still counts what
        the request held. The tokens it reported past the previous reply's, over the bytes
        the history gained in between (at least `SAMPLE_BYTES`), kept between
        `MIN_BYTES_PER_TOKEN` and `BYTES_PER_TOKEN`: a lower rate (more tokens) is taken at
        once, a higher one half-way."""
        session = self._session
        grown = usage.input_tokens - session.reported_tokens
        added = session.added_bytes
        if not session.reported_tokens:
            added += len((request.system or "").encode()) + self._schema_bytes(request.tools)
        if added < SAMPLE_BYTES or grown <= 0:
            return
        measured = min(max(added / grown, MIN_BYTES_PER_TOKEN), BYTES_PER_TOKEN)
        rate = self._rate(model_id)
        if self._rates is None:
            self._rates = {}
        self._rates[model_id] = measured if measured < rate else (rate + measured) / 2

    async def fit(
        self,
        request: ModelRequest,
        model: ModelAdapter,
        model_id: str,
        turn: int,
        step: int,
        *,
        overflow: ContextOverflow | None = None,
    ) -> ModelRequest:
        """`request`, or, when a compaction is due, the same request over the history the
        compaction left (its ``context/compacting`` and ``context/compacted`` appended).

        Due: one was asked for, the provider refused `request` as too long (`overflow`),
        or the estimate passes the policy's threshold of the model's window (a model
        without one is compacted only in the first two cases). A refusal that names a
        window smaller than the one known teaches it: logged (``config/set``
        ``context_window:<model id>``), measured against from now on. One that names
        none, or a larger one, means the estimate was wrong: the window is taken to be
        at most the estimate, and the verbatim part is halved.

        Whatever happens once the ``context/compacting`` is logged, a
        ``context/compacted`` follows it: the summarizing call failing, past its
        deadline, or saying nothing truncates instead (``degraded``); a cancel truncates
        too, logs it, and then goes on up (the turn ends ``aborted``).
        """
        if overflow is None and not self.due(request, model, model_id):
            return request
        session = self._session
        window = (self._windows or _NO_WINDOWS).get(model_id)
        if window is None:
            window = self._window(model, model_id)
        estimate = self.estimate(request, model_id)
        cause: CompactionCause = "request" if self.requested else "threshold"
        keep = self._policy.keep
        if overflow is not None:
            cause = "overflow"
            named = overflow.window
            if named and (not window or named < window):  # the window was wrong: learn it
                window = named
                self._learn(model_id, named)
                session.append(ConfigSet(key=WINDOW_KEY + model_id, value=str(named)))
            else:  # the estimate was wrong: `estimate` tokens (as counted here) were too many
                window = min(window, estimate) if window else estimate
                keep /= 2
        elif not window:  # asked for, of a model with no window: measure against what is there
            window = estimate
        asked, instructions = self.requested, self._instructions
        self.requested, self._instructions = False, None
        started = -1
        try:
            run = _Run(
                session,
                turn,
                step,
                max(window, 1),
                self._rate(model_id),
                (keep, self._policy.summary),
                len((request.system or "").encode()) + self._schema_bytes(request.tools),
                estimate,
            )
            if not run.plan(asked):
                return request
            opened = CompactionStart(
                turn=turn, step=step, tokens=estimate, window=run.window, cause=cause
            )
            started = session.append(opened).seq
            event = await self._write(run, request, model, model_id, instructions)
        except trio.Cancelled as cancel:  # the history shrinks all the same; the turn ends
            if started >= 0:
                reason = f"cancelled: {cancel.reason or 'cancelled'}"
                session.append(_ended(run.truncated(reason), started, instructions))
            raise
        except Exception as exc:  # a fault here must not fail every later step: as it was
            logger.exception("session %r: the compaction failed", session.id)
            if started < 0:
                return request
            event = run.unchanged(f"the compaction failed: {exc}"[:500])
        session.append(_ended(event, started, instructions))
        return msgspec.structs.replace(request, messages=session.messages())

    async def _write(
        self,
        run: _Run,
        request: ModelRequest,
        model: ModelAdapter,
        model_id: str,
        instructions: str | None,
    ) -> Compacted:
        """The compaction `run` planned: a summary of its old part, or, when there is none
        to summarize, only its cuts; a truncation when the summary cannot be written."""
        if run.kept_seq == run.start:  # nothing new to summarize: only what is too large is cut
            return run.kept_previous()
        session = self._session
        if session.persistent:  # the start, before the call: a crash tells it
            # A failure is the step's own write-ahead's to report, next.
            with contextlib.suppress(PersistenceError):
                await session.write_ahead()
        deadline = self._policy.deadline
        try:
            with trio.move_on_after(deadline):
                summary, note = await self._summarize(run, request, model, instructions)
                return run.summarized(summary, note, model_id)
            degraded = f"the summary took longer than {deadline:g} s (CompactionPolicy.deadline)"
        except trio.Cancelled:
            raise
        except Exception as exc:
            degraded = f"the summary could not be written: {exc}"[:500]
        logger.warning("session %r: %s; truncating instead", session.id, degraded)
        return run.truncated(degraded)

    async def _summarize(
        self, run: _Run, request: ModelRequest, model: ModelAdapter, instructions: str | None
    ) -> tuple[str, str | None]:
        """The model's summary of the previous summary and the part `run` summarizes, cut to
        its budget (and why it was cut, if it was); raises when the call fails or says
        nothing. Its retries are logged (``model/retry``) as a step's are; reading stops
        at twice the budget."""
        tokens = max(1, int(self._policy.summary * run.window))
        limit = run.summary_bytes
        budget = int(TRANSCRIPT_SHARE * run.window * run.rate)
        ask = f"Summarize this conversation so far, the user's goal first, in at most {tokens:,}"
        ask += " tokens."
        if instructions:
            ask += f"\nThe user asks of this summary: {cut(instructions, budget // 4, 'left out')}"
        previous = run.previous_summary()[0]
        text = _transcript(run.events, run.start, run.kept_seq, previous, budget - len(ask))
        summary_request = ModelRequest(
            messages=[UserTurn(f"{text}\n\n{ask}")],
            model=request.model,
            system=SUMMARY_SYSTEM,
            max_output_tokens=tokens,
        )
        answer = await read_side_text(
            model, summary_request, self._session, run.turn, run.step, 2 * limit
        )
        summary = answer.text.strip()
        if not summary:
            raise RuntimeError("the model's summary was empty")
        return bounded_summary(summary, limit, answer.cut)

    def _window(self, model: ModelAdapter, model_id: str) -> int:
        """The window `model_id` is measured against (0: none), remembered: its adapter's
        ``context_window``, or the smaller one a refusal taught the session."""
        given = getattr(model, "context_window", 0)
        if not isinstance(given, int) or given < 0:
            given = 0
        learned = learned_window(self._session.config, model_id)
        window = min(given, learned) if given and learned else given or learned
        self._learn(model_id, window)
        return window

    def _learn(self, model_id: str, window: int) -> None:
        if self._windows is None:
            self._windows = {}
        self._windows[model_id] = window

    def _rate(self, model_id: str) -> float:
        """`model_id`'s bytes per token: as corrected, else `BYTES_PER_TOKEN`."""
        rates = self._rates
        return BYTES_PER_TOKEN if rates is None else rates.get(model_id, BYTES_PER_TOKEN)

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


def _ended(event: Compacted, started: int, instructions: str | None) -> Compacted:
    return msgspec.structs.replace(event, started=started, instructions=instructions)


#: Bytes kept free for the marker of a cut summary.
_MARKER_ROOM: Final = 200


def bounded_summary(summary: str, limit: int, limited: bool = False) -> tuple[str, str | None]:
    """`summary` within `limit` UTF-8 bytes (a marker line included, for a `limit` of 200
    or more), and why it was cut (None when it was not): past the limit it is cut at the
    last line boundary before it (a word's, if no line ends in its second half), and when
    the model's output limit stopped it (`limited`) its last, unfinished line is dropped;
    a marker line says so."""
    encoded = summary.encode()
    size = len(encoded)
    if size <= limit and not limited:
        return summary, None
    head = encoded[: max(limit - _MARKER_ROOM, 0)].decode("utf-8", "ignore")
    if size > limit:
        why = f"{size:,} bytes, past the summary's budget of {limit:,}"
    else:
        why = "the model's output limit stopped it"
    end = head.rfind("\n")
    if len(head) < len(summary):  # cut inside: at a line, else a word, in its second half
        if end < len(head) // 2:
            end = head.rfind(" ")
        if end < len(head) // 2:
            end = len(head)
    elif end < 0:  # all of it, one line: kept as it came
        end = len(head)
    kept = head[:end].rstrip()
    note = f"{why}; {len(summary) - len(kept):,} of {len(summary):,} characters were cut"
    marker = f"[the summary was cut here: {note}]"
    return (f"{kept}\n{marker}" if kept else marker), note


class _Run:
    """One compaction: what it measures against, what it summarizes, keeps, carries and
    cuts (`plan`), and the event each way it can end builds (`summarized`,
    `kept_previous`, `truncated`, `unchanged`). Every size is UTF-8 bytes at the
    compactor's rate for the model."""

    __slots__ = (
        "budget",
        "carried",
        "carried_bytes",
        "cuts",
        "estimate",
        "events",
        "fixed",
        "goal",
        "kept_bytes",
        "kept_seq",
        "previous",
        "rate",
        "reserve",
        "start",
        "step",
        "summary_bytes",
        "turn",
        "window",
    )

    def __init__(
        self,
        session: Session,
        turn: int,
        step: int,
        window: int,
        rate: float,
        shares: tuple[float, float],
        fixed: int,
        estimate: int,
    ) -> None:
        """A compaction in step `step` of `turn` against `window` tokens at `rate` bytes a
        token; `shares` the window's parts the verbatim part and the summary may take,
        `fixed` the bytes of the request's system prompt and tools, `estimate` its tokens."""
        self.events = events = session.events
        self.previous = previous = session.compaction
        self.start = start = previous.kept_seq if previous is not None else 0
        self.turn, self.step, self.window, self.estimate = turn, step, window, estimate
        self.rate, self.fixed = rate, fixed
        keep, summary = shares
        #: The verbatim part's bytes, the carried events' included.
        self.budget = int(keep * window * rate)
        self.summary_bytes = max(int(summary * window * rate), 1)
        self.goal = _goal(events, start, previous)
        wholes = sum(_carried_bytes(events[seq]) for seq in self.goal)
        #: What the carried events may take of `budget` (planned before what they will be).
        self.reserve = min(wholes, int(CARRIED_SHARE * self.budget))
        self.kept_seq, self.kept_bytes = start, 0
        self.cuts: list[Cut] = []
        self.carried: list[Cut] = []
        self.carried_bytes = 0

    def plan(self, asked: bool) -> bool:
        """Where the verbatim part begins, what in it is cut and what is carried before it;
        False when nothing would change (nothing to summarize, nothing new to cut)."""
        events, start, previous = self.events, self.start, self.previous
        budget = self.budget - self.reserve
        verbatim = budget  # what the verbatim part is planned to fit
        if asked:  # asked for: summarize at least two thirds of what is there
            verbatim = min(budget, _bytes_from(events, start, {}) // 3)
        self.kept_seq, kept_bytes = _plan(events, start, verbatim)
        carried = [c for c in previous.cuts if c.seq >= self.kept_seq] if previous else []
        self.cuts, self.kept_bytes = _fit_kept(events, self.kept_seq, carried, kept_bytes, budget)
        if self.kept_seq == start and self.cuts == carried:
            return False
        self._carry()
        return True

    def previous_summary(self) -> tuple[str, str | None]:
        """The previous compaction's summary within this one's budget (and why it was cut)."""
        if self.previous is None or not self.previous.summary:
            return "", None
        return bounded_summary(self.previous.summary, self.summary_bytes)

    def summarized(self, summary: str, note: str | None, model: str) -> Compacted:
        return self._event(summary, model, cut=note)

    def kept_previous(self) -> Compacted:
        """Only the verbatim part's new cuts: the previous summary stands."""
        summary, note = self.previous_summary()
        model = self.previous.model if self.previous is not None else ""
        return self._event(summary, model, cut=note)

    def unchanged(self, degraded: str) -> Compacted:
        """The history as it was (the end of a compaction that failed on its own fault)."""
        previous = self.previous
        self.kept_seq = self.start
        self.cuts = list(previous.cuts) if previous is not None else []
        self.carried = list(previous.carried) if previous is not None else []
        self.kept_bytes = _bytes_from(self.events, self.start, {c.seq: c.kept for c in self.cuts})
        self.carried_bytes = sum(_carried_bytes(self.events[c.seq], c.kept) for c in self.carried)
        summary = previous.summary if previous is not None else ""
        return self._event(summary, "", degraded=degraded)

    def truncated(self, degraded: str) -> Compacted:
        """What a failed summary leaves: tool outputs cut to `KEPT_CHARS`, oldest turn first
        and within a turn largest first (a sub-agent's answer never), until the history
        fits the verbatim budget; if that is not enough, the part before the verbatim one
        dropped, a marker in the summary's place saying which turns and why. The turn's
        prompts and the open plan are carried past it either way."""
        events, previous, start = self.events, self.previous, self.start
        budget = self.budget - self.reserve
        known = {c.seq: c.kept for c in previous.cuts if c.seq >= start} if previous else {}
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
        self.kept_seq = start
        summary = self.previous_summary()[0]
        if total > budget:
            self.kept_seq, _ = _plan(events, start, budget)
            known = {seq: kept for seq, kept in known.items() if seq >= self.kept_seq}
            total = _bytes_from(events, self.kept_seq, known)
            fitted, total = _fit_kept(
                events,
                self.kept_seq,
                [Cut(seq, kept) for seq, kept in known.items()],
                total,
                budget,
            )
            known = {c.seq: c.kept for c in fitted}
            first = previous.first_turn if previous is not None else _turn_at(events, 0)
            last = _turn_at(events, max(self.kept_seq - 1, 0))
            summary = (
                f"[The conversation before this point (turns {first}-{last}) was dropped to"
                f" fit the model's context window: {degraded}. The session's log holds it.]"
            )
        self.cuts = [Cut(seq, chars) for seq, chars in sorted(known.items())]
        self.kept_bytes = total
        self._carry()
        return self._event(summary, "", degraded=degraded)

    def _carry(self) -> None:
        """The goal's events the verbatim part no longer holds, each cut to fit the carried
        events' share: the smallest whole, the rest sharing what is left equally."""
        events = self.events
        seqs = [seq for seq in self.goal if seq < self.kept_seq]
        sizes = sorted((_carried_bytes(events[seq]), seq) for seq in seqs)
        left = int(CARRIED_SHARE * self.budget)
        carried: list[Cut] = []
        total = 0
        for index, (whole, seq) in enumerate(sizes):
            share = left // (len(sizes) - index)
            chars = _chars(events[seq])
            kept = chars if whole <= share else max(share - 2 * _MARKER_ROOM, KEPT_CHARS)
            size = _carried_bytes(events[seq], min(kept, chars))
            carried.append(Cut(seq, min(kept, chars)))
            total += size
            left -= size
        self.carried = sorted(carried, key=lambda c: c.seq)
        self.carried_bytes = total

    def _event(
        self, summary: str, model: str, *, cut: str | None = None, degraded: str | None = None
    ) -> Compacted:
        events, previous = self.events, self.previous
        event = Compacted(
            turn=self.turn,
            step=self.step,
            summary=summary,
            first_seq=previous.first_seq if previous is not None else 0,
            kept_seq=self.kept_seq,
            first_turn=previous.first_turn if previous is not None else _turn_at(events, 0),
            last_turn=_turn_at(events, max(self.kept_seq - 1, 0)),
            model=model,
            tokens_before=self.estimate,
            tokens_after=0,
            cuts=self.cuts,
            degraded=degraded,
            carried=self.carried,
            cut=cut,
        )
        after = self.fixed + self.kept_bytes + self.carried_bytes
        after += message_size(UserTurn(summary_text(event))) if summary else 0
        return msgspec.structs.replace(event, tokens_after=math.ceil(after / self.rate))


def _goal(events: Sequence[SessionEvent], start: int, previous: Compacted | None) -> list[int]:
    """The seqs a compaction carries past its summary when it summarizes them: the open
    turn's own prompts (its ``user/message``s) and the latest ``plan/set`` when it has open
    entries (looked for back to `start`, else the one `previous` carried)."""
    seqs: list[int] = []
    plan: int | None = None
    index = len(events) - 1
    while index >= 0:
        event = events[index]
        if type(event) is UserMessage:
            seqs.append(index)
        elif type(event) is PlanSet and plan is None:
            plan = index
        elif type(event) is TurnStart:  # the open turn's (turns never nest)
            break
        index -= 1
    while plan is None and index >= start:
        if type(events[index]) is PlanSet:
            plan = index
        index -= 1
    if plan is None and previous is not None:
        plan = next((c.seq for c in previous.carried if type(events[c.seq]) is PlanSet), None)
    plan_event = events[plan] if plan is not None else None
    if type(plan_event) is PlanSet and plan_text(plan_event):
        seqs.append(plan_event.seq)
    return sorted(seqs)


def _chars(event: SessionEvent) -> int:
    """The characters of a carried event's texts (what a `Cut` counts)."""
    if type(event) is PlanSet:
        return len(plan_text(event))
    if type(event) is UserMessage:
        resources = sum(len(p.text or "") for p in event.parts if type(p) is Resource)
        return len(event.content) + resources
    return 0


def _carried_bytes(event: SessionEvent, kept: int | None = None) -> int:
    message = carried_message(event, _chars(event) if kept is None else kept)
    return 0 if message is None else message_size(message)


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
    (a sub-agent's answer up to a quarter of `budget`), the newest entries first to go in
    when all do not fit `budget`, and a line saying how many older ones were left out."""
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
