"""`Session`: one conversation's append-only log.

`Session` holds its log in memory, writes it through its `SessionSink` (``append``;
`write_ahead` and `flush` wait), reads `open_turn` and `last_turn` off it, and keeps the
model's history incrementally (`Session.messages`, a `History` snapshot, never a copy):
what each event puts there is `message_of`, and each ``context/compacted`` starts it anew
with its summary, the events it carries (the open plan, the turn's prompts:
`carried_message`), then the kept events' messages (a cut prompt's text blocks cut too).
It keeps the bytes of its prompts' images and blob resources by SHA-256 (`blobs`;
`hold_blobs` stores them through the sink before the ``user/message`` naming them, and a
resumed session reads them back at its next turn), the latest reply's reported tokens and
the bytes added since (compaction's estimate), and a running call's progress
(`show_progress`, in `greenroom.session.live.LiveCalls`, never logged).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar, overload

import trio
from msgspec.structs import force_setattr, replace

from greenroom.hooks import Emitter
from greenroom.parking import Parking
from greenroom.protocol.content import ImageRef, Part, Resource, ResourceRef, Text, referenced
from greenroom.protocol.events import (
    AssistantChunk,
    AssistantMessage,
    Compacted,
    CompactionStart,
    ConfigSet,
    ContextMessage,
    DecisionMade,
    DecisionRequested,
    MessageSource,
    PermissionRule,
    PlanSet,
    Refused,
    SessionEvent,
    SessionHeader,
    SteeringMessage,
    StepEnd,
    StepStart,
    ToolCall,
    ToolProgress,
    ToolResult,
    ToolStart,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import AssistantTurn, Message, ToolTurn, UserTurn
from greenroom.session.live import LiveCalls
from greenroom.spill import cut

E = TypeVar("E", bound=SessionEvent)
_now = time.time

#: A session's settings and answers before its log has any (shared: most sessions never do).
_NOTHING: Final[Mapping[str, Any]] = MappingProxyType({})

#: Events that change nothing the session reads off its log (the most frequent among them).
_PLAIN: Final[frozenset[type]] = frozenset(
    {AssistantChunk, StepStart, StepEnd, ToolCall, ToolStart, CompactionStart}
)


class History(Sequence[Message]):
    """The first ``length`` messages of a session's model history: a snapshot, made in O(1).

    Between two compactions the history only grows at its end, and a
    compaction (or a refusal) puts a new list in its place, so the prefix a
    snapshot names never changes: a model request holds one without a copy,
    and a turn's cost does not grow with the session. Slices are lists; it
    compares equal to any sequence of the same messages.
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[Message], length: int) -> None:
        self._items = items
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return self._items[: self._length][index]
        position = index + self._length if index < 0 else index
        if not 0 <= position < self._length:
            raise IndexError(f"history index {index} out of range (length {self._length})")
        return self._items[position]

    def __iter__(self) -> Iterator[Message]:
        return itertools.islice(self._items, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(other) == self._length and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"History({list(self)!r})"


class SessionSink(Protocol):
    """Where a live session's events are kept: its write path (hooks only observe).

    `append` takes each event right after the session logged it, in seq
    order; it never blocks and never raises. `write_ahead` returns once
    everything appended has reached the OS; `flush` ends a turn (durably, as
    the sink's policy says). Both raise what went wrong (a
    `PersistenceError`); events the sink could not write stay with it for
    the next call. Both shield what they wait for: a cancelled caller sees
    its cancel only once the sink is consistent again.
    """

    def append(self, event: SessionEvent) -> None: ...

    async def write_ahead(self) -> None: ...

    async def flush(self) -> None: ...

    async def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store `blobs` (bytes by their SHA-256, hex) beside the log, durably as the
        policy says, before the event naming them is appended."""
        ...

    async def read_blobs(self, digests: Sequence[str]) -> dict[str, bytes]:
        """The stored blobs among `digests`; one the store does not hold is left out."""
        ...


class Session:
    """An append-only log of `SessionEvent`s, and what can be read off it.

    Guarantees: ``seq`` is the event's index (0, 1, 2, ...); an event is in
    the log, then with the sink, before ``on_append`` (the observers) sees
    it, so a failing observer never unlogs it; `open_turn` and `last_turn`
    are read off the log, never off an agent's status. Events are frozen:
    what was appended is what stays.
    """

    __slots__ = (
        "_blobs",
        "_events",
        "_last_turn",
        "_logged",
        "_messages",
        "_open_turn",
        "_readers",
        "_sink",
        "_turn_messages",
        "_wanted",
        "added_bytes",
        "compaction",
        "config",
        "decisions",
        "header",
        "live",
        "on_append",
        "parent",
        "permissions",
        "persistent",
        "reported_tokens",
        "title",
        "title_seq",
    )

    def __init__(
        self,
        header: SessionHeader,
        seed: Sequence[SessionEvent] = (),
        *,
        sink: SessionSink | None = None,
    ) -> None:
        self.header = header
        #: The live session of the agent that spawned this one, if any: its family's
        #: root governs this session's mode, and their remembered answers apply here.
        self.parent: Session | None = None
        self._sink = sink
        #: True if the session has a sink: a flush has somewhere to go (read-only).
        self.persistent = sink is not None
        #: The ``session/event`` observers, wired by the store that publishes the session.
        self.on_append: Emitter[[Session, SessionEvent]] | None = None
        #: The settings in force (``config/set``: the last one of each key), read off the log.
        self.config: Mapping[str, str] = _NOTHING
        #: The "always" permission answers by tool name (``permission/rule``), read off the log.
        self.permissions: Mapping[str, bool] = _NOTHING
        #: The decisions the open turn waits for (``decision/requested`` without its
        #: ``decision/made``), by id, read off the log: while any is open the turn is parked.
        self.decisions: Mapping[str, DecisionRequested] = _NOTHING
        #: A name for the conversation, from its first prompt, and the seq of that prompt.
        self.title: str | None = None
        self.title_seq = -1
        #: The latest ``context/compacted``: the history starts with its summary.
        self.compaction: Compacted | None = None
        self._events: list[SessionEvent] = []
        #: The model's history (see `messages`), made by its first message: a session
        #: that never had a turn holds no list.
        self._messages: list[Message] | None = None
        #: The parts' bytes by SHA-256 (`hold_blobs`), made by the first held: a session
        #: without images or blob resources holds no table.
        self._blobs: dict[str, bytes] | None = None
        self._wanted: set[str] | None = None  # blobs the log names and `_blobs` lacks
        self._turn_messages = 0  # where the open turn's messages begin in `_messages`
        #: The input and output tokens the model reported for its latest reply (0 when none
        #: did since the latest compaction): that reply's request and the reply itself
        #: (read-only: attributes, not properties, since compaction reads both every step).
        self.reported_tokens = 0
        #: UTF-8 bytes of the history's messages since `reported_tokens` (all of them, the
        #: summary included, when no reply reported usage since the latest compaction).
        self.added_bytes = 0
        self._last_turn = 0
        self._open_turn: int | None = None
        self._readers: Parking | None = None  # made by the first reader
        #: The running calls' progress (`show_progress`), made by the first notice.
        self.live: LiveCalls | None = None
        for index, event in enumerate(seed):
            if event.seq != index:
                raise ValueError(
                    f"session {header.id!r}: seed event {index} has seq {event.seq}"
                    " (a log's seqs run 0, 1, 2, ... without gaps)"
                )
            self._record(event)
        self._logged = len(seed)  # the events a write-ahead or flush got to the sink's store

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def events(self) -> Sequence[SessionEvent]:
        """The log, oldest first (a live view: do not mutate)."""
        return self._events

    @property
    def next_seq(self) -> int:
        return len(self._events)

    @property
    def last_turn(self) -> int:
        """The highest turn number the log has opened (0 before the first)."""
        return self._last_turn

    @property
    def open_turn(self) -> int | None:
        """The turn the log has opened and not yet closed, if any."""
        return self._open_turn

    def append(self, event: E) -> E:
        """Stamp ``seq`` and ``time`` (wall seconds), log `event`, sink it, tell ``on_append``
        (when something listens to it)."""
        events = self._events
        force_setattr(event, "seq", len(events))
        force_setattr(event, "time", _now())
        events.append(event)
        if type(event) not in _PLAIN:
            self._read(event)
        sink = self._sink
        if sink is not None:
            sink.append(event)
        live = self.live
        if live is not None and isinstance(event, ToolResult):
            live.end(event.call_id)  # its result stands for every notice it showed
        on_append = self.on_append
        if on_append is not None and on_append.hook in on_append.listened:
            on_append.emit(self, event)
        readers = self._readers
        if readers is not None:
            readers.wake()
        return event

    async def wait_for_append(self, position: int) -> None:
        """Return once the log holds an event at `position` (after a checkpoint, at once if
        it does), or a running call shows progress (`show_progress`), whichever comes
        first: a reader of the log keeps its own position and calls this when it has read
        up to the end.

        The wake-up is made by the first reader of the session; a session nobody reads
        pays for none. A cancelled waiter leaves nothing behind.
        """
        if position < len(self._events):
            await trio.lowlevel.checkpoint()
            return
        if self._readers is None:
            self._readers = Parking()
        await self._readers.park()

    def show_progress(self, progress: ToolProgress) -> None:
        """Keep `progress` as its running call's latest notice (never logged: see
        `LiveCalls`) and wake the readers. Until that call's ``tool/result``."""
        live = self.live
        if live is None:
            live = self.live = LiveCalls()
        live.publish(progress)
        if self._readers is not None:
            self._readers.wake()

    @property
    def blobs(self) -> Mapping[str, bytes]:
        """The bytes of the images and blob resources its prompts' parts name, by SHA-256,
        as far as `hold_blobs` has them (do not mutate; read it afresh: the first blobs
        held replace the shared empty mapping of a session that held none)."""
        return _NOTHING if self._blobs is None else self._blobs

    def _hold(self, blobs: Mapping[str, bytes]) -> None:
        if blobs:
            if self._blobs is None:
                self._blobs = {}
            self._blobs.update(blobs)

    @property
    def blobs_wanted(self) -> bool:
        """True while the log names a blob `blobs` lacks that no `hold_blobs` looked for."""
        return bool(self._wanted)

    async def hold_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Keep `blobs` (bytes by SHA-256) for the model's history, stored through the sink
        before it returns, so the ``user/message`` naming them is logged after them; and
        read through the sink those the log names that `blobs` lacks (a resumed
        session's). One the store does not hold stays missing: the model is sent a
        marker naming it. Raises what the sink raised (`blobs` are held all the same)."""
        self._hold(blobs)
        wanted, self._wanted = self._wanted, None
        if self._sink is None:
            return
        if blobs:
            await self._sink.put_blobs(blobs)
        if wanted:
            self._hold(await self._sink.read_blobs(sorted(wanted - self.blobs.keys())))

    async def write_ahead(self) -> None:
        """Get everything appended so far to the OS, before the side effect the caller is
        about to run; raises what the sink raised. Without a sink, or when the sink writes
        inline, it returns without a checkpoint."""
        if self._sink is not None:
            appended = len(self._events)
            await self._sink.write_ahead()
            if appended > self._logged:
                self._logged = appended

    def logged_decisions(self) -> list[DecisionRequested]:
        """The open `decisions` known to be in the log, oldest first: a write-ahead or a
        flush after each returned (without a sink: all of them). What the outside world
        is asked to act on is shown only then (`Prompt.pending`, `Runtime.decisions`, a
        ``requires-action`` answer): a crash cannot lose what it was shown."""
        if self._sink is None:
            return list(self.decisions.values())
        logged = self._logged
        return [d for d in self.decisions.values() if d.seq < logged]

    async def flush(self) -> None:
        """End a turn through the sink; raises what the sink raised.

        Without a sink it returns at once, without a checkpoint.
        """
        if self._sink is not None:
            appended = len(self._events)
            await self._sink.flush()
            if appended > self._logged:
                self._logged = appended

    def messages(self) -> History:
        """The model-facing history derived from the log, as it stands now (a snapshot):
        the latest compaction's summary, if any, then the messages of the events after the
        part it stands for (docs/semantics.md, "Compaction")."""
        messages = self._messages
        return History(messages, len(messages)) if messages is not None else History([], 0)

    def _record(self, event: SessionEvent) -> None:
        """Log a seed event (stamped already)."""
        self._events.append(event)
        if type(event) not in _PLAIN:
            self._read(event)

    def _forget_refused_turn(self) -> None:
        """The model never sees a refused turn again: its prompts, steering, replies and
        tool calls leave the history. Context that arrived meanwhile (a background task's
        notice) was not the turn's own and stays. A new list: a `History` snapshot already
        handed out keeps what it saw."""
        events = self._events
        start = len(events) - 1
        while start > 0 and not isinstance(events[start], TurnStart):
            start -= 1
        kept = (self._messages or [])[: self._turn_messages]
        self._messages = kept + _context_of(events[start:])

    def _compact(self, compaction: Compacted) -> None:
        """Start the history anew at `compaction`: its summary, then the events it carries
        (the open plan, then the turn's prompts), then the messages of the events it keeps
        verbatim (those between ``kept_seq`` and itself), each carried or kept event
        shortened as it lists, a refused turn among them left out as it was. A new list: a
        `History` snapshot already handed out keeps what it saw."""
        self.compaction = compaction
        cuts = {c.seq: c.kept for c in compaction.cuts}
        messages: list[Message] = []
        if compaction.summary:
            messages.append(UserTurn(summary_text(compaction)))
        turn_messages = -1  # where the open turn's own messages begin
        for carried in compaction.carried:
            if not 0 <= carried.seq < compaction.seq:  # a log greenroom never writes
                continue
            event = self._events[carried.seq]
            if type(event) is UserMessage and turn_messages < 0:
                turn_messages = len(messages)  # its prompts, carried past the summary
            message = carried_message(event, carried.kept)
            if message is not None:
                messages.append(message)
        if turn_messages < 0:  # the open turn's start was summarized, if not in `kept`
            turn_messages = len(messages)
        kept = self._events[compaction.kept_seq : compaction.seq]
        turn_events = 0
        for index, event in enumerate(kept):
            if isinstance(event, TurnStart):
                turn_messages, turn_events = len(messages), index
            elif isinstance(event, TurnEnd) and type(event.reason) is Refused:
                messages[turn_messages:] = _context_of(kept[turn_events:index])
            else:
                message = message_of(event, cuts.get(event.seq))
                if message is not None:
                    messages.append(message)
        self._messages = messages
        self._turn_messages = turn_messages
        self.reported_tokens = 0
        self.added_bytes = sum(map(message_size, messages))

    def _read(self, event: SessionEvent) -> None:
        """Take from `event` what the session reads off its log.

        Dispatched on the exact type (events are final classes): a class pattern
        or an `isinstance` of a Struct class costs a slow subclass check each. The
        messages the common kinds put in the history are built inline, for speed: they
        must be what `message_of` gives (tests/session/test_message_of.py holds them to it)."""
        if type(event) is TurnStart:
            self._open_turn = self._last_turn = event.turn
            self._turn_messages = len(self._messages or ())
        elif type(event) is TurnEnd:
            self._open_turn = None
            if self.decisions:  # an ended turn's decisions are void
                self.decisions = _NOTHING
            if type(event.reason) is Refused:
                self._forget_refused_turn()
        elif type(event) is UserMessage:
            message: Message = UserTurn(event.content, event.parts)
            if self._messages is None:
                self._messages = []
            self._messages.append(message)
            self.added_bytes += message_size(message)
            if event.parts:
                self._want(event.parts)
            if self.title is None:
                self.title, self.title_seq = title_of(event.content), event.seq
        elif type(event) is AssistantMessage:
            if not event.content and not event.tool_calls:
                return
            message = AssistantTurn(event.content, event.tool_calls, event.thoughts)
            if self._messages is None:
                self._messages = []
            self._messages.append(message)
            usage = event.usage
            if usage is not None:  # the reply and everything before it, as counted
                self.reported_tokens = usage.input_tokens + usage.output_tokens
                self.added_bytes = 0
            else:
                self.added_bytes += message_size(message)
        elif type(event) is ConfigSet:
            self.config = {**self.config, event.key: event.value}
        elif type(event) is PermissionRule:
            self.permissions = {**self.permissions, event.tool: event.allow}
        elif type(event) is DecisionRequested:
            self.decisions = {**self.decisions, event.decision_id: event}
        elif type(event) is DecisionMade:
            decisions = self.decisions
            if len(decisions) == 1 and event.decision_id in decisions:  # no comprehension
                self.decisions = _NOTHING
            else:
                self.decisions = {k: v for k, v in decisions.items() if k != event.decision_id}
        elif type(event) is Compacted:
            self._compact(event)
        else:
            other = message_of(event)
            if other is not None:
                if self._messages is None:
                    self._messages = []
                self._messages.append(other)
                self.added_bytes += message_size(other)

    def _want(self, parts: Sequence[Part]) -> None:
        wanted = [digest for digest in referenced(parts) if digest not in self.blobs]
        if wanted:
            if self._wanted is None:
                self._wanted = set()
            self._wanted.update(wanted)


def message_of(event: SessionEvent, kept: int | None = None) -> Message | None:
    """The message `event` puts in the model's history, if any; with `kept`, its text cut
    to that many characters with a marker saying how much was cut."""
    if type(event) is UserMessage:
        parts = event.parts
        if kept is not None and parts:
            parts = _cut_parts(parts, kept)
        return UserTurn(_shortened(event.content, kept), parts)
    if type(event) is AssistantMessage:
        if not event.content and not event.tool_calls:
            return None
        return AssistantTurn(_shortened(event.content, kept), event.tool_calls, event.thoughts)
    if type(event) is ToolResult:
        return ToolTurn(event.call_id, _shortened(event.content, kept), event.is_error)
    if type(event) is ContextMessage:
        return UserTurn(_wrap("context", event.source, _shortened(event.content, kept)))
    if type(event) is SteeringMessage:
        return UserTurn(_wrap("steering", event.source, _shortened(event.content, kept)))
    return None


def carried_message(event: SessionEvent, kept: int) -> Message | None:
    """What an event a compaction carries past its summary is sent as: a prompt as itself,
    the plan (``plan/set``) as its open entries; each cut to `kept` characters."""
    if type(event) is PlanSet:
        text = plan_text(event)
        return UserTurn(_shortened(text, kept)) if text else None
    return message_of(event, kept)


def plan_text(plan: PlanSet) -> str:
    """The open entries of `plan` as a message (empty when none is open)."""
    entries = [e for e in plan.entries if e.status != "completed"]
    if not entries:
        return ""
    lines = "".join(f"\n- [{e.status}] {e.content}" for e in entries)
    return f'<plan note="the open entries of the plan (the todo tool\'s)">{lines}\n</plan>'


def summary_text(compaction: Compacted) -> str:
    """The message a compaction's summary is sent as, naming the turns it stands for."""
    first, last = compaction.first_turn, compaction.last_turn
    turns = f"turn {first}" if first == last else f"turns {first}-{last}"
    return f'<summary of="{turns}">{compaction.summary}</summary>'


#: What a cut's marker says of where the whole text is.
CUT_WHOLE: Final = "cut to fit the model's context window; the session's log holds the whole"


def _shortened(text: str, kept: int | None) -> str:
    return text if kept is None else cut(text, kept, CUT_WHOLE)


def _cut_parts(parts: Sequence[Part], kept: int) -> list[Part]:
    """`parts` with their texts (text blocks, text resources) cut to `kept` characters in
    all, in order, each cut one with its marker (what the adapters send is the parts, not
    the message's text); images and binary resources as they are."""
    left = kept
    shortened: list[Part] = []
    for part in parts:
        if type(part) is Text:
            shortened.append(Text(_shortened(part.text, max(left, 0))))
            left -= len(part.text)
        elif type(part) is Resource and part.text:
            shortened.append(replace(part, text=_shortened(part.text, max(left, 0))))
            left -= len(part.text)
        else:
            shortened.append(part)
    return shortened


#: Bytes each message is counted beyond its text: its role and framing (providers count
#: about 4 tokens a message; 4 bytes a token).
MESSAGE_FRAMING: Final = 16


def message_size(message: Message) -> int:
    """UTF-8 bytes of `message`'s text (a tool call's name and arguments included), and
    `MESSAGE_FRAMING`."""
    size = MESSAGE_FRAMING + _utf8(message.content)
    if type(message) is AssistantTurn:
        for call in message.tool_calls:
            size += len(call.name) + _utf8(call.arguments)
    elif type(message) is UserTurn and message.parts:
        size += sum(_part_size(part) for part in message.parts)
    return size


#: Bytes an image is counted as (providers bill about 1,600 tokens for a screenshot the size
#: they scale to; 4 bytes a token), whatever its own size.
IMAGE_SIZE: Final = 6_400


def _part_size(part: Part) -> int:
    """The bytes a part adds to its message beyond `content` (its text is in `content`)."""
    if type(part) is ImageRef:
        return IMAGE_SIZE
    if type(part) is Resource:
        return _utf8(part.text or "")
    if type(part) is ResourceRef:
        return part.size
    return 0


def _utf8(text: str) -> int:
    """UTF-8 bytes of `text`, without encoding it when it is ASCII (most text is)."""
    return len(text) if text.isascii() else len(text.encode())


def _context_of(events: Sequence[SessionEvent]) -> list[Message]:
    """The context messages among `events`: what a refused turn leaves in the history."""
    return [
        UserTurn(_wrap("context", e.source, e.content))
        for e in events
        if isinstance(e, ContextMessage)
    ]


def _wrap(tag: str, source: MessageSource, content: str) -> str:
    return f'<{tag} source="{source.__struct_config__.tag}">{content}</{tag}>'


#: The longest title a session gets from its first prompt.
TITLE_LENGTH: Final = 60
#: The setting a title a model wrote is logged as (``config/set``): it replaces the prompt's.
TITLE_KEY: Final = "title"


def title_of(prompt: str) -> str:
    """A session's title: the first line of its first prompt, shortened to `TITLE_LENGTH`,
    without NUL characters (PostgreSQL's text cannot hold one: every store leaves them out
    alike)."""
    prompt = prompt.replace("\x00", "")
    line = prompt.strip().splitlines()[0] if prompt.strip() else ""
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"
