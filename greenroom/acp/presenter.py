"""From the session log to ``session/update``: one presenter for live turns and load replay.

Updates are derived from log events only (never from ``agent/*`` emits), so a
replayed session and a live one produce the same frames. Message ids are
stable: a user message keeps its own id; an assistant reply is
``<session>/<turn>/<step>``. A tool call shows ``pending`` when the model
makes it, ``in_progress`` once it was allowed to run, then ``completed`` or
``failed`` with its output (and its edits as diffs).

Every update is bounded, whatever the log holds: its texts together (a
message chunk; a tool call's title, locations and arguments; a result's
output and diffs) carry at most `UPDATE_CHARS` characters, any one of them
at most `TEXT_CHARS`, each diff or location costing `ITEM_CHARS` more (so a
huge output leaves room for the diffs after it). A longer text is cut
(`greenroom.spill.cut`: its start and its end kept, a marker between saying
how much was cut and that the log holds the rest), and diffs past the budget
are left out, said so. Escaped as JSON a character takes
at most 6 bytes, so an update stays far inside the 8 MiB frame a reader
takes (`greenroom.acp.frames.MAX_FRAME`), live and on replay.

`Presenter` has a handler per kind of event that shows (``_SHOWN``; any other kind costs
one look-up). A ``turn/usage`` record with the session's known cost is a
``usage_update`` with its ``cost``. A compaction is, for a client declaring
``session.compaction``, the unstable ``compaction_update`` /
``compaction_summary_chunk`` entity (`compaction_updates`) from its start
(``in_progress``; on replay ``failed`` for a start a crash left without its end), else
one plain agent message from its start to its end. The presenter also says a session's
modes and config options, and `shown_call` a permission question's title and raw input,
bounded the same way: a call's raw input is its JSON text checked and passed through
(``msgspec.Raw``), never decoded and encoded again.
"""

from __future__ import annotations

import base64
import datetime
import functools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from greenroom.acp import frames
from greenroom.actors.compaction import learned_window
from greenroom.actors.titles import TITLE_FAILED
from greenroom.actors.types import DEFAULT_MODE, MODES, Titles, mode_descriptions
from greenroom.protocol.acp import (
    AgentMessageChunk,
    AgentThoughtChunk,
    AnyConfigOption,
    BooleanConfigOption,
    CompactionSummaryChunk,
    CompactionUpdate,
    ConfigChoice,
    ConfigOption,
    ConfigOptionUpdate,
    Cost,
    CurrentModeUpdate,
    DiffContent,
    ImageBlock,
    NoticeSeverity,
    NoticeUpdate,
    PlanContentUpdate,
    PlanItems,
    PlanUpdate,
    ResourceBlock,
    ResourceContents,
    SessionInfoUpdate,
    SessionMode,
    SessionModeState,
    SessionUpdate,
    TerminalContent,
    TextBlock,
    ToolCallContent,
    ToolCallProgress,
    ToolCallStart,
    ToolContent,
    ToolLocation,
    ToolStatus,
    UsageUpdate,
    UserMessageChunk,
)
from greenroom.protocol.arguments import decode_arguments
from greenroom.protocol.content import (
    ImageRef,
    Part,
    Resource,
    ResourceRef,
    Text,
    described,
    missing,
)
from greenroom.protocol.events import (
    AssistantChunk,
    AssistantMessage,
    Compacted,
    CompactionStart,
    ConfigSet,
    DecisionMade,
    DecisionRequested,
    Errored,
    LimitReached,
    ModelRetry,
    PlanEntry,
    PlanSet,
    Protections,
    SessionEvent,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    ToolStart,
    TurnEnd,
    TurnUsage,
    UserMessage,
)
from greenroom.protocol.mcp import McpStatus
from greenroom.protocol.model import THOUGHT_LEVELS, ReasoningDelta, TextDelta
from greenroom.session import Session
from greenroom.session.session import TITLE_KEY
from greenroom.session.transcript import describe_decision
from greenroom.spill import cut

#: The most characters of text one update carries, and of any one text in it (see the module).
UPDATE_CHARS: Final = 1_000_000
TEXT_CHARS: Final = 250_000
#: What a diff or a location costs beyond its texts (its JSON), so their number is bounded too.
ITEM_CHARS: Final = 64
_MARKER_ROOM: Final = 10_000  # room left for a cut's marker line
_REST: Final = "the rest is in the session's log"
#: A call's arguments checked as one JSON value and kept as their text (`_arguments`).
_raw: Final = msgspec.json.Decoder(msgspec.Raw)


@functools.cache
def _session_modes(protections: Protections | None) -> list[SessionMode]:
    """The modes every connection of this process offers (one list, shared: never changed)."""
    described = MODES if protections is None else mode_descriptions(protections)
    return [SessionMode(id, name, what) for id, (name, what) in described.items()]


class Presenter:
    """Log events as ``session/update``s, and a session's settings as ACP shows them.

    ``models`` are the runtime's model ids (the first is the default);
    ``context_windows`` the tokens each can hold, for ``usage_update``;
    ``protections`` what the kernel enforces on commands, which each mode's
    description says (None: `MODES` as they are).
    ``terminal``: the client opted into terminal content (`greenroom.acp.live`), so a
    ``bash`` call is shown as a terminal named after the call, and its end says its exit.
    ``compaction``: the client declared ``clientCapabilities.session.compaction``, so a
    compaction is shown as ACP's unstable compaction entity (`compaction_updates`), not
    as an agent message.
    ``notices``: the client declared ``clientCapabilities._meta.notice``, so what is not
    the model's words (a retry, a server's failure, a compaction without a summary, a
    limit reached) is ACP's unstable ``notice``, live only, not an agent message.
    ``plans``: the client declared ``clientCapabilities.plan``, so the plan is ACP's
    unstable ``plan_update`` (the session's one plan, `PLAN_ID`), not ``plan``.
    ``booleans``: the client declared ``session.configOptions.boolean``, so the session's
    ``titles`` setting is offered as a boolean option (`TITLES_OPTION`; ``titles`` is
    what a session whose log sets none has); others are offered the select options only.
    """

    __slots__ = (
        "_context_windows",
        "_models",
        "_modes",
        "_titles",
        "booleans",
        "compaction",
        "notices",
        "plans",
        "terminal",
    )

    def __init__(
        self,
        models: Sequence[str],
        context_windows: Mapping[str, int],
        protections: Protections | None = None,
        titles: Titles = "prompt",
    ) -> None:
        self._models = list(models)
        self._context_windows = context_windows
        self._modes = _session_modes(protections)
        self._titles = titles
        self.terminal = False
        self.compaction = False
        self.notices = False
        self.plans = False
        self.booleans = False

    def modes(self, session: Session) -> SessionModeState:
        return SessionModeState(session.config.get("mode", DEFAULT_MODE), self._modes)

    def config_options(self, session: Session) -> list[AnyConfigOption]:
        mode = session.config.get("mode", DEFAULT_MODE)
        options: list[AnyConfigOption] = [
            ConfigOption(
                "mode",
                "Mode",
                "mode",
                mode,
                [ConfigChoice(mode.id, mode.name) for mode in self._modes],
            ),
            ConfigOption(
                "model",
                "Model",
                "model",
                self._model(session),
                [ConfigChoice(model, model) for model in self._models],
            ),
            ConfigOption(
                "thought_level",
                "Thinking",
                "thought_level",
                session.config.get("thought_level", "off"),
                [ConfigChoice(level, level.capitalize()) for level in THOUGHT_LEVELS],
            ),
        ]
        if self.booleans:
            titles = session.config.get(TITLES_OPTION, self._titles)
            options.append(
                BooleanConfigOption(
                    TITLES_OPTION, "Model-written titles", TITLES_DESCRIPTION, titles == "model"
                )
            )
        return options

    def offered(self) -> tuple[str, ...]:
        """The ids of the config options this client is offered."""
        return (*OPTIONS, TITLES_OPTION) if self.booleans else OPTIONS

    def present(
        self, session: Session, event: SessionEvent, *, replay: bool
    ) -> Iterable[SessionUpdate]:
        """The updates one log event becomes (user messages only on replay: the client has
        them). An event of a kind no update shows (a turn's or a step's start and end, ...)
        costs one look-up: most of a turn's events are such."""
        shown = _SHOWN.get(type(event))
        return () if shown is None else shown(self, session, event, replay)

    def _chunk(
        self, session: Session, event: AssistantChunk, replay: bool
    ) -> Iterator[SessionUpdate]:
        match event.chunk:
            case TextDelta(text=text) if text:
                message_id = f"{session.id}/{event.turn}/{event.step}"
                yield AgentMessageChunk(TextBlock(_bounded(text)), message_id)
            case ReasoningDelta(text=text) if text:
                message_id = f"{session.id}/{event.turn}/{event.step}"
                yield AgentThoughtChunk(TextBlock(_bounded(text)), message_id)

    def _user(self, session: Session, event: UserMessage, replay: bool) -> Iterator[SessionUpdate]:
        if replay and event.parts:
            for block in _replayed(event.parts, session.blobs):
                yield UserMessageChunk(block, event.message_id)
        elif replay:
            yield UserMessageChunk(TextBlock(_bounded(event.content)), event.message_id)
        if event.seq == session.title_seq and session.title is not None:
            yield SessionInfoUpdate(session.title, iso_time(event.time))

    def _usage(
        self, session: Session, event: AssistantMessage, replay: bool
    ) -> Iterator[SessionUpdate]:
        usage = event.usage
        if usage is not None:
            used = usage.input_tokens + usage.output_tokens
            yield UsageUpdate(used, max(self._window(session), used))

    def _cost(self, session: Session, event: TurnUsage, replay: bool) -> Iterator[SessionUpdate]:
        # The session's cost once the turn's is summed, with the context its last step's
        # update said (the schema has no update of the cost alone); unknown: not said.
        cost = event.session.cost
        if cost is not None:
            used = _context_used(session, event)
            yield UsageUpdate(used, max(self._window(session), used), Cost(float(cost), "USD"))

    def server_notice(self, status: McpStatus) -> SessionUpdate:
        """What an MCP server of the session did, told: a notice (an error for a failure
        or giving up), else an agent message of its own."""
        if not self.notices:
            return AgentMessageChunk(TextBlock(status.describe() + "\n"))
        severity: NoticeSeverity = "info"
        if status.state in ("failed", "gave-up"):
            severity = "error"
        elif status.message:
            severity = "warning"
        return NoticeUpdate(severity, _bounded(status.describe()))

    def _retry(self, session: Session, event: ModelRetry, replay: bool) -> Iterator[SessionUpdate]:
        if self.notices:  # live only: a notice is no part of the session's history
            if not replay:
                title = f"Retrying the model in {event.wait:.1f} s"
                yield NoticeUpdate("warning", title, event.error[:300])
            return
        # A notice of its own (its own message id), not a part of the reply.
        notice = f"Retrying the model in {event.wait:.1f} s: {event.error[:300]}\n"
        message_id = f"{session.id}/{event.turn}/{event.step}/retry-{event.attempt}"
        yield AgentMessageChunk(TextBlock(notice), message_id)

    def _asked(
        self, session: Session, event: DecisionRequested, replay: bool
    ) -> Iterator[SessionUpdate]:
        # Live, the client is asked the decision itself; replayed, it reads what was asked.
        if replay:
            said = f"Asked: {describe_decision(event)}\n"
            message_id = f"{session.id}/{event.turn}/{event.decision_id}"
            yield AgentMessageChunk(TextBlock(_bounded(said)), message_id)

    def _decided(
        self, session: Session, event: DecisionMade, replay: bool
    ) -> Iterator[SessionUpdate]:
        if replay:
            answer = event.answer or "(declined)"
            said = f"Decided by {event.by}: {answer}\n"
            message_id = f"{session.id}/{event.turn}/{event.decision_id}/made"
            yield AgentMessageChunk(TextBlock(_bounded(said)), message_id)

    def _ended(self, session: Session, event: TurnEnd, replay: bool) -> Iterator[SessionUpdate]:
        reason = event.reason
        if self.notices and not replay and type(reason) is LimitReached:
            reached = "unknown" if reason.reached is None else str(reason.reached)
            yield NoticeUpdate(
                "warning",
                f"The turn stopped at its {reason.limit} limit",
                f"allowed {reason.allowed}, reached {reached}",
            )
        elif (
            self.notices and not replay and type(reason) is Errored and reason.code == TITLE_FAILED
        ):  # the title stays the first prompt's
            yield NoticeUpdate("warning", "The title was not written", _bounded(reason.message))

    def _compacting(
        self, session: Session, event: CompactionStart, replay: bool
    ) -> Iterator[SessionUpdate]:
        # The entity (or the notice) its end completes; on replay an entity client is shown
        # the end's materialized form only, unless the log has no end (a crash cut it).
        entity = f"{session.id}/{event.turn}/{event.step}/compacted-{event.seq}"
        ended = not replay or _ended(session, event)
        if self.compaction:
            if not replay:
                yield CompactionUpdate(entity, "in_progress")
            elif not ended:
                yield CompactionUpdate(entity, "failed", error=INTERRUPTED_COMPACTION)
        else:
            notice = starting_notice(event)
            if not ended:
                notice += f"It ended there: {INTERRUPTED_COMPACTION}.\n"
            yield AgentMessageChunk(TextBlock(notice), entity)

    def _compacted(
        self, session: Session, event: Compacted, replay: bool
    ) -> Iterator[SessionUpdate]:
        # The entity (or the notice) its start opened, then the window as the next request
        # will use it. A compaction logged before starts were has its own seq in its id.
        started = event.started if event.started >= 0 else event.seq
        entity = f"{session.id}/{event.turn}/{event.step}/compacted-{started}"
        if self.compaction:
            announced = event.started >= 0
            yield from compaction_updates(entity, event, replay=replay, announced=announced)
        else:
            yield AgentMessageChunk(TextBlock(_bounded(compaction_notice(event))), entity)
        if self.notices and not replay and event.degraded is not None:
            yield NoticeUpdate("warning", "Compacted without a summary", _bounded(event.degraded))
        window = self._window(session)
        yield UsageUpdate(event.tokens_after, max(window, event.tokens_after))

    def _call(self, session: Session, event: ToolCall, replay: bool) -> Iterator[SessionUpdate]:
        call_id, arguments = event.call_id, event.arguments
        cwd = session.header.cwd
        budget = _Budget()
        title = budget.take(event.title or event.name)
        locations = [
            ToolLocation(budget.take(_absolute(cwd, loc.path)), loc.line)
            for loc in event.locations
            if budget.item()
        ]
        terminal = self.terminal and event.name == TERMINAL_TOOL
        yield ToolCallStart(
            call_id,
            title,
            event.kind,
            "pending",
            locations or None,
            _arguments(arguments) if budget.fits(arguments) else budget.take(arguments),
            [TerminalContent(call_id)] if terminal else None,
            {"terminal_info": {"terminal_id": call_id, "cwd": cwd}} if terminal else None,
            budget.take(event.name),
        )

    def _start(self, session: Session, event: ToolStart, replay: bool) -> Iterator[SessionUpdate]:
        yield ToolCallProgress(event.call_id, "in_progress")

    def _result(self, session: Session, event: ToolResult, replay: bool) -> Iterator[SessionUpdate]:
        status: ToolStatus = "failed" if event.is_error else "completed"
        budget = _Budget()
        output = budget.take(event.content)
        shown: list[ToolContent] = [ToolCallContent(TextBlock(output))]
        for diff in event.diffs:
            if not budget.item():
                left = len(event.diffs) - len(shown) + 1
                note = f"[{left} more diffs not shown; {_REST}]"
                shown.append(ToolCallContent(TextBlock(note)))
                break
            old = None if diff.old_text is None else budget.take(diff.old_text)
            shown.append(DiffContent(budget.take(diff.path), budget.take(diff.new_text), old))
        ended = _terminal_exit(session, event) if self.terminal else None
        # Sent twice (content, rawOutput), so counted twice: what does not fit after the
        # diffs is left out of rawOutput (the content has it).
        raw = output if budget.fits(output) else None
        yield ToolCallProgress(event.call_id, status, shown, ended, raw)

    def _plan(self, session: Session, event: PlanSet, replay: bool) -> Iterator[SessionUpdate]:
        budget = _Budget()
        entries = [
            PlanEntry(budget.take(entry.content), entry.priority, entry.status)
            for entry in event.entries
            if budget.item()
        ]
        yield PlanContentUpdate(PlanItems(PLAN_ID, entries)) if self.plans else PlanUpdate(entries)

    def _config(self, session: Session, event: ConfigSet, replay: bool) -> Iterator[SessionUpdate]:
        key = event.key
        if key == "mode":
            yield CurrentModeUpdate(event.value)
            yield ConfigOptionUpdate(self.config_options(session))
        elif key in ("model", "thought_level") or (key == TITLES_OPTION and self.booleans):
            yield ConfigOptionUpdate(self.config_options(session))
        elif key == TITLE_KEY:  # the title the model wrote: it stands for the prompt's
            yield SessionInfoUpdate(event.value, iso_time(event.time))

    def _model(self, session: Session) -> str:
        chosen = session.config.get("model")
        return chosen if chosen in self._models else self._models[0]

    def _window(self, session: Session) -> int:
        """The context window of the session's model: its adapter's, or the smaller one a
        refusal taught the session."""
        model = self._model(session)
        window = self._context_windows.get(model, 0)
        learned = learned_window(session.config, model)
        return min(window, learned) if window and learned else window or learned


#: What each kind of event that an update shows becomes (`Presenter.present`); any other
#: kind (a turn's or a step's start and end, a permission rule, ...) shows nothing.
_SHOWN: Final[
    dict[type[SessionEvent], Callable[[Presenter, Session, Any, bool], Iterator[SessionUpdate]]]
] = {
    AssistantChunk: Presenter._chunk,
    UserMessage: Presenter._user,
    AssistantMessage: Presenter._usage,
    TurnUsage: Presenter._cost,
    ModelRetry: Presenter._retry,
    DecisionRequested: Presenter._asked,
    DecisionMade: Presenter._decided,
    TurnEnd: Presenter._ended,
    CompactionStart: Presenter._compacting,
    Compacted: Presenter._compacted,
    ToolCall: Presenter._call,
    ToolStart: Presenter._start,
    ToolResult: Presenter._result,
    PlanSet: Presenter._plan,
    ConfigSet: Presenter._config,
}

#: The kinds of event `Presenter.present` shows; any other becomes no update.
SHOWN: Final = frozenset(_SHOWN)

#: The select options every client is offered, by id (each is a setting of the same name).
OPTIONS: Final = ("mode", "model", "thought_level")
#: The boolean option of the ``titles`` setting: on is ``model``, off ``prompt``.
TITLES_OPTION: Final = "titles"
TITLES_DESCRIPTION: Final = (
    "After the first turn, the session's model writes its title (one short call, counted"
    " in its usage); off, the title is the first line of the first prompt"
)
#: The id of a session's one plan (the ``todo`` tool's), as ``plan_update`` names it.
PLAN_ID: Final = "todo"
#: The tool whose calls a terminal-rendering client is shown as terminals.
TERMINAL_TOOL: Final = "bash"
_EXIT: Final = re.compile(r"\[(?:exit code: (-?\d+|None)|killed by signal: (\w+))\]\Z")


def _context_used(session: Session, record: TurnUsage) -> int:
    """The tokens of the last step of `record`'s turn that reported usage (a record has
    one): read back from the record, never past its turn."""
    events = session.events
    for index in range(record.seq - 1, -1, -1):
        event = events[index]
        if type(event) is AssistantMessage and event.usage is not None:
            return event.usage.input_tokens + event.usage.output_tokens
    return 0


def _terminal_exit(session: Session, result: ToolResult) -> dict[str, object] | None:
    """``_meta.terminal_exit`` of a ``bash`` call's result (its last line says how the
    command ended), None for any other call's."""
    events = session.events
    # Its call is in its own step, before it: read back from the result (its seq is its
    # index), not from the log's end, where a later call may reuse its id.
    for index in range(result.seq - 1, -1, -1):
        event = events[index]
        if isinstance(event, ToolCall) and event.call_id == result.call_id:
            if event.name != TERMINAL_TOOL:
                return None
            break
        if isinstance(event, StepStart):
            return None
    found = _EXIT.search(result.content)
    code = found.group(1) if found else None
    ended = {
        "terminal_id": result.call_id,
        "exit_code": int(code) if code and code != "None" else None,
        "signal": found.group(2) if found else None,
    }
    return {"terminal_exit": ended}


#: The characters of a summary one ``compaction_summary_chunk`` carries at most.
SUMMARY_CHUNK_CHARS: Final = 4_096


def compaction_updates(
    compaction_id: str, event: Compacted, *, replay: bool, announced: bool = False
) -> Iterator[CompactionUpdate | CompactionSummaryChunk]:
    """The end of a compaction as ACP's unstable entity (RFD "session-compaction"),
    `compaction_id` its id. Live: ``in_progress`` (unless its start `announced` it), the
    summary in ``compaction_summary_chunk``s of at most `SUMMARY_CHUNK_CHARS`, then
    ``completed`` (keeping what the chunks added). On replay: one ``completed`` carrying
    the whole summary, the RFD's materialized form.

    The summary is the one logged (a degraded compaction's is its marker saying what was
    dropped, or none when it dropped nothing), bounded like any text. The final update's
    ``_meta.greenroom`` says the turns it stands for, the model that wrote it, the
    estimated tokens before and after, ``degraded`` (why no summary could be written)
    when it degraded and ``cut`` (why the summary was cut short) when it was."""
    summary = _bounded(event.summary)
    facts: dict[str, object] = {
        "first_turn": event.first_turn,
        "last_turn": event.last_turn,
        "model": event.model,
        "tokens_before": event.tokens_before,
        "tokens_after": event.tokens_after,
    }
    if event.degraded is not None:
        facts["degraded"] = event.degraded
    if event.cut is not None:
        facts["cut"] = event.cut
    meta = {"greenroom": facts}
    if replay:
        # No block for a degraded compaction that dropped nothing: it has no summary.
        shown = [TextBlock(summary)] if summary else None
        yield CompactionUpdate(compaction_id, "completed", shown, meta=meta)
        return
    if not announced:
        yield CompactionUpdate(compaction_id, "in_progress")
    for start in range(0, len(summary), SUMMARY_CHUNK_CHARS):
        piece = summary[start : start + SUMMARY_CHUNK_CHARS]
        yield CompactionSummaryChunk(compaction_id, TextBlock(piece))
    yield CompactionUpdate(compaction_id, "completed", meta=meta)


#: What a compaction its log does not end says of it (the process stopped during it).
INTERRUPTED_COMPACTION: Final = (
    "the process stopped during this compaction, so the history stayed as it was"
)
_CAUSES: Final = {
    "threshold": "near the model's context window",
    "request": "as asked",
    "overflow": "the model refused the request as too long",
}


def starting_notice(event: CompactionStart) -> str:
    """What an editor is told when a compaction starts: why, and the tokens against the
    window."""
    why = _CAUSES.get(event.cause, event.cause)
    return (
        f"Compacting the conversation ({why}: about {event.tokens:,} tokens of {event.window:,})…\n"
    )


def _ended(session: Session, start: CompactionStart) -> bool:
    """Whether the log holds the end of the compaction `start` began (before its step ends:
    a crash, or the process's end, cut it otherwise)."""
    events = session.events
    for index in range(start.seq + 1, len(events)):
        event = events[index]
        if type(event) is Compacted and event.started == start.seq:
            return True
        if type(event) is StepEnd or type(event) is TurnEnd:
            return False
    return False


def compaction_notice(event: Compacted) -> str:
    """What an editor is told of a compaction: the turns it stands for, and its summary (or
    that it degraded, and why)."""
    turns = event.last_turn - event.first_turn + 1
    counted = f"{turns} turn" if turns == 1 else f"{turns} turns"
    if event.degraded is not None:
        return f"Compacted {counted} without a summary ({event.degraded}).\n"
    return f"Compacted {counted}: {event.summary}\n"


class _Budget:
    """What is left of one update's `UPDATE_CHARS`: each text takes its share in turn."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = UPDATE_CHARS

    def fits(self, text: str) -> bool:
        """Whether all of `text` fits; if so it is taken."""
        if len(text) > min(TEXT_CHARS, self.left):
            return False
        self.left -= len(text)
        return True

    def take(self, text: str) -> str:
        """`text`, cut to `TEXT_CHARS` or to what is left (with its marker)."""
        if self.fits(text):
            return text
        shown = cut(text, max(min(TEXT_CHARS, self.left - _MARKER_ROOM), 0), _REST)
        self.left = max(self.left - len(shown), 0)
        return shown

    def item(self) -> bool:
        """Whether one more diff or location fits (with room for its texts' markers)."""
        if self.left < ITEM_CHARS + 2 * _MARKER_ROOM:
            return False
        self.left -= ITEM_CHARS
        return True


#: The base64 characters of an image or blob a replayed prompt sends back at most (what a
#: frame holds beside its envelope); a larger one is sent as a text saying so.
BLOB_CHARS: Final = frames.MAX_FRAME - 64 * 1024


def _replayed(
    parts: Sequence[Part], blobs: Mapping[str, bytes]
) -> Iterator[TextBlock | ImageBlock | ResourceBlock]:
    """A prompt's parts as ACP blocks, as they came: an image or blob its store lacks, or
    one past `BLOB_CHARS`, as a text naming it."""
    for part in parts:
        match part:
            case Text(text=text):
                yield TextBlock(_bounded(text))
            case Resource(uri=uri, text=text):
                yield ResourceBlock(ResourceContents(uri, text=_bounded(text or "")))
            case ImageRef() | ResourceRef():
                data = blobs.get(part.sha256)
                if data is None:
                    yield TextBlock(missing(part))
                elif len(data) // 3 * 4 + 4 > BLOB_CHARS:
                    yield TextBlock(f"{described(part)} (too large to send back)")
                elif isinstance(part, ImageRef):
                    yield ImageBlock(base64.b64encode(data).decode(), part.mime_type)
                else:
                    encoded = base64.b64encode(data).decode()
                    yield ResourceBlock(ResourceContents(part.uri, part.mime_type, blob=encoded))


def _bounded(text: str) -> str:
    """One update's only text, bounded."""
    return text if len(text) <= TEXT_CHARS else cut(text, TEXT_CHARS, _REST)


def shown_call(title: str, arguments: str) -> tuple[str, object]:
    """A tool call's title and raw input as a frame other than an update shows them (a
    permission question): bounded like an update's."""
    budget = _Budget()
    title = budget.take(title)
    return title, _arguments(arguments) if budget.fits(arguments) else budget.take(arguments)


def iso_time(seconds: float) -> str:
    """Wall-clock seconds as ACP's ``updatedAt``: ISO 8601, UTC."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


def _absolute(cwd: str | None, path: str) -> str:
    """A tool's location as ACP wants every path: absolute (a model's relative path is
    the session's cwd's, as the file tools read it)."""
    if cwd is None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(cwd, path))


def _arguments(arguments: str) -> object:
    """The call's JSON arguments as the model wrote them (blank as ``{}``), checked to be one
    JSON value and passed into the frame whole (`msgspec.Raw`: not decoded and encoded
    again); as text if they are not JSON (or nest too deep to decode)."""
    try:
        return decode_arguments(arguments, _raw.decode)
    except msgspec.DecodeError:
        return arguments
