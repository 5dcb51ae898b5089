"""The session log's vocabulary: what a turn writes, in the order it writes it.

Every event is a frozen msgspec Struct tagged by ``type`` (``"turn/start"``,
``"tool/result"``, ...). ``seq`` and ``time`` are stamped by the session when
the event is appended; until then they are -1 and 0.

Beside the events: `TurnEndReason` (why a turn ended: ``completed``, ``aborted``,
``error``, ``refusal``, ``limit``, ...), the message sources (`MessageSource`: the user,
a plugin, another agent) and turn triggers, `ToolProgress` (a running call's output so far,
never logged), `Protections` (what the kernel gives a sandbox) and `SessionHeader` (a log's
first record). ``turn/answered`` (`TurnAnswered`) says what a turn's prompts were answered
when the store could not take its closing events in time; it stands right after that
``turn/end``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Final, Literal, TypeAlias, final

import msgspec

from greenroom.protocol.content import Part
from greenroom.protocol.model import StreamChunk, Thought, ToolCallChunk, Usage

# -- who a message came from -------------------------------------------------


@final
class UserSource(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="user"):
    """A person, through whatever front end (the default source)."""


@final
class PluginSource(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="plugin"):
    """A plugin of the runtime (a tool's completion notice, say)."""

    plugin: str


@final
class AgentSource(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="agent"):
    """Another agent."""

    agent_id: str


MessageSource: TypeAlias = UserSource | PluginSource | AgentSource
USER: Final = UserSource()

# -- why a turn started ------------------------------------------------------


@final
class MessageTrigger(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="message"):
    source: MessageSource


@final
class InjectionTrigger(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="injection"):
    source: MessageSource


@final
class ConfigTrigger(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="config"):
    """A one-shot turn that only records a setting changed while the agent was idle."""

    source: MessageSource


@final
class CompactionTrigger(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="compaction"):
    """A one-shot turn that only compacts the history (`Agent.compact` while idle)."""

    source: MessageSource


@final
class TitleTrigger(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="title"):
    """A one-shot turn that only has the model write the session's title (the ``titles``
    setting ``model``, after the first turn that completed): at most one per session."""


TurnTrigger: TypeAlias = (
    MessageTrigger | InjectionTrigger | ConfigTrigger | CompactionTrigger | TitleTrigger
)

#: What a tool does, as ACP names it; a tool that edits, deletes, moves or executes asks
#: permission before it runs.
ToolKind: TypeAlias = Literal[
    "read", "edit", "delete", "move", "search", "execute", "think", "fetch", "other"
]


#: An answer to a permission request, as ACP names its options.
PermissionDecision: TypeAlias = Literal[
    "allow_once", "allow_always", "reject_once", "reject_always"
]


@final
class Location(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A place a tool call works on: a path, and a 1-based line if it has one."""

    path: str
    line: int | None = None


@final
class FileDiff(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """An edit a tool made: the file's text before (None for a new file) and after."""

    path: str
    new_text: str
    old_text: str | None = None


# -- why a turn ended --------------------------------------------------------


@final
class Completed(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="completed"):
    """The model stopped and nothing asked for another step."""


@final
class Aborted(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="aborted"):
    """`Agent.cancel(reason)` stopped the turn."""

    reason: str


@final
class Errored(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="error"):
    """A step failed: the model raised, yielded garbage, or finished with an error."""

    step: int
    message: str
    code: str | None = None


@final
class Disposed(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="disposed"):
    """The agent was disposed (or its owner closed) while the turn ran."""


@final
class MaxTokens(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="max-tokens"):
    """A step hit the model's output limit; its tool calls were dropped."""


@final
class Refused(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="refusal"):
    """The model refused (a content filter, a safety stop). The turn stays in the log,
    but the model never sees it again: the next request's history leaves it out."""


@final
class Interrupted(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="interrupted"):
    """The process died mid-turn; written by crash repair on load, never live."""


@final
class LimitReached(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="limit"):
    """A limit of the agent's `Limits` stopped the turn: `limit` names it (``requests``,
    ``session_total_tokens``, ``cost_usd``, ...), `allowed` is its figure and `reached` the
    count that met it (a count: before the call that would pass it; tokens and cost: after
    the step that crossed it). A cost limit's figures are `Decimal` USD (in the log, exact
    decimal strings), its `reached` None when the cost is unknown (a step of a model with
    no price): a cost limit cannot be held over it."""

    limit: str
    allowed: int | Decimal
    reached: int | Decimal | None


@final
class Guarded(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="guarded"):
    """A guard tripped: `guard` is its name, `at` where it looked (``prompt``,
    ``tool_call``, ``answer``), `message` what it said."""

    guard: str
    at: str
    message: str


TurnEndReason: TypeAlias = (
    Completed
    | Aborted
    | Errored
    | Disposed
    | MaxTokens
    | Refused
    | Interrupted
    | LimitReached
    | Guarded
)
COMPLETED: Final = Completed()
DISPOSED: Final = Disposed()
MAX_TOKENS: Final = MaxTokens()
REFUSED: Final = Refused()

# -- the events --------------------------------------------------------------


class Event(msgspec.Struct, frozen=True, gc=False, kw_only=True, tag_field="type"):
    """The base of the log's events. Each event class is final: readers tell events
    apart by exact type (``type(event) is ToolResult``, a table keyed by type), which a
    subclass would fall through silently, so subclassing one is a `TypeError`."""

    seq: int = -1
    time: float = 0.0

    def __init_subclass__(cls, **options: Any) -> None:
        super().__init_subclass__(**options)
        for base in cls.__bases__:
            if getattr(base, "__final__", False):
                raise TypeError(
                    f"{cls.__name__}: the event {base.__name__} is final; events are told"
                    " apart by exact type, so a subclass would be read as no event at all"
                )


@final
class TurnStart(Event, frozen=True, gc=False, tag="turn/start"):
    turn: int
    trigger: TurnTrigger


@final
class TurnEnd(Event, frozen=True, gc=False, tag="turn/end"):
    turn: int
    reason: TurnEndReason


@final
class TurnAnswered(Event, frozen=True, gc=False, tag="turn/answered"):
    """What the prompts of turn `turn` were answered when the store could not take its
    closing events in time (under ``sync="always"``: sync them): `reason`, an error naming
    the store, instead of the ``turn/end`` the log holds. Appended right after that
    ``turn/end``, and written with it once the store takes them again (never, if another
    node fenced the log): the one event that follows the end of the turn it belongs to."""

    turn: int
    reason: TurnEndReason


@final
class GuardTripped(Event, frozen=True, gc=False, tag="guard/tripped"):
    """A guard of the agent's tripped (the turn then ends `Guarded`): `guard` is its name,
    `at` where it looked (``prompt``, ``tool_call`` with `call_id`, ``answer``), `message`
    what it said."""

    turn: int
    guard: str
    at: str
    message: str
    call_id: str | None = None


#: What a decision is about: a tool call's permission, or a question ``ask_user`` asks.
DecisionKind: TypeAlias = Literal["permission", "question"]


@final
class DecisionRequested(Event, frozen=True, gc=False, tag="decision/requested", omit_defaults=True):
    """A decision the turn waits for, logged before anyone is asked: the permission of tool
    call `call_id` (its `tool`, `title`, `arguments`; the answers it may get, `options`), or
    the question of the ``ask_user`` call `call_id` (`question`, its `choices`, whether
    `free_text` may answer it). `decision_id` names it; the `DecisionMade` naming it answers
    it. While one is open, the turn is parked: a turn cut then is left open by repair,
    for the session's next holder to ask again."""

    turn: int
    decision_id: str
    call_id: str
    kind: DecisionKind
    tool: str = ""
    title: str = ""
    arguments: str = ""
    options: list[str] = []
    question: str = ""
    choices: list[str] = []
    free_text: bool = False


@final
class DecisionMade(Event, frozen=True, gc=False, tag="decision/made"):
    """The answer to decision `decision_id`: a permission's option, or the question's answer
    (empty: declined), and who gave it (`by`: the client's name, ``embedder``, a principal,
    ``policy``)."""

    turn: int
    decision_id: str
    answer: str
    by: str


@final
class TurnResumed(Event, frozen=True, gc=False, tag="turn/resumed"):
    """A turn a crash cut, carried on by the session's next holder (``resume(...,
    interrupted="continue")``), or a turn parked on a decision, carried on by its
    next holder whatever ``interrupted`` says; logged before anything it does.

    ``step`` is the step the log had reached (0: none). ``requested`` is true
    when that step's reply was not fully logged, so the model is asked again
    (as the next step). ``rerun`` names the calls that had started with no
    result and are run again (safe to repeat: ``read`` or idempotent tools);
    ``interrupted`` those given an ``interrupted`` result instead; ``waiting``
    those that never started, waiting on an open decision: asked again (the
    same decision), then run or refused as it is answered.
    """

    turn: int
    step: int
    requested: bool = False
    rerun: list[str] = []
    interrupted: list[str] = []
    waiting: list[str] = []


@final
class StepStart(Event, frozen=True, gc=False, tag="step/start"):
    turn: int
    step: int


@final
class StepEnd(Event, frozen=True, gc=False, tag="step/end"):
    turn: int
    step: int


@final
class UserMessage(Event, frozen=True, gc=False, tag="user/message", omit_defaults=True):
    """A prompt: its text in `content`; `parts` its blocks when it was sent as blocks
    (an image or a blob resource as a reference to its bytes, kept beside the log)."""

    content: str
    source: MessageSource
    message_id: str
    parts: list[Part] = []


@final
class ContextMessage(Event, frozen=True, gc=False, tag="context/message"):
    content: str
    source: MessageSource
    message_id: str


@final
class SteeringMessage(Event, frozen=True, gc=False, tag="steering/message"):
    turn: int
    content: str
    source: MessageSource
    message_id: str


@final
class AssistantChunk(Event, frozen=True, gc=False, tag="assistant/chunk"):
    turn: int
    step: int
    chunk: StreamChunk


@final
class AssistantMessage(Event, frozen=True, gc=False, tag="assistant/message"):
    turn: int
    step: int
    content: str
    reasoning: str = ""
    tool_calls: list[ToolCallChunk] = []
    usage: Usage | None = None
    thoughts: list[Thought] = []  # the provider's thinking blocks, sent back as they came


@final
class ModelRetry(Event, frozen=True, gc=False, tag="model/retry"):
    """The step's model call failed before any of its reply was logged (`error`, its `code`)
    and is tried again after `wait` seconds; `attempt` is the failed one, from 1."""

    turn: int
    step: int
    attempt: int
    wait: float
    error: str
    code: str | None = None


@final
class Cut(msgspec.Struct, frozen=True, gc=False):
    """A verbatim event the model sees shortened: the first `kept` characters of its text
    (a tool result's output, a message's content), then a marker saying how much was cut."""

    seq: int
    kept: int


#: Why a compaction runs: the estimate passed the threshold, it was asked for
#: (`Agent.compact`), or the provider refused the request as too long.
CompactionCause: TypeAlias = Literal["threshold", "request", "overflow"]


@final
class CompactionStart(Event, frozen=True, gc=False, tag="context/compacting"):
    """A compaction began: logged (and written ahead) before its summarizing call, so a
    replay and a crash tell it. The `Compacted` whose ``started`` is this event's seq ends
    it; a crash leaves it without one, and the history is then as before it.

    `tokens` is the request's estimated input tokens, `window` the context window it was
    measured against, `cause` why it runs.
    """

    turn: int
    step: int
    tokens: int
    window: int
    cause: CompactionCause


@final
class Compacted(Event, frozen=True, gc=False, tag="context/compacted"):
    """The model's history from here on: `summary` stands for the events from `first_seq`
    up to `kept_seq` (turns `first_turn` to `last_turn`), the `carried` events before
    `kept_seq` follow it verbatim (the turn's own prompts and the open plan), and the
    events from `kept_seq` on stay verbatim, but for the `cuts`. No event leaves the log:
    only what the model is sent changes (the rules are in docs/semantics.md, "Compaction").

    `model` is the id of the model that wrote `summary`; `cut` says why the summary was
    cut short (past its budget, or the model's output limit stopped it); `degraded` says
    why none could be written, and then `summary` is a marker naming what was dropped (or
    the previous summary) and `model` is empty. `tokens_before` and `tokens_after` are the
    estimated input tokens of the request without and with this compaction;
    `instructions` are the caller's, if any; `started` is the seq of its
    `CompactionStart` (-1 in a log written before those were).
    """

    turn: int
    step: int
    summary: str
    first_seq: int
    kept_seq: int
    first_turn: int
    last_turn: int
    model: str
    tokens_before: int
    tokens_after: int
    cuts: list[Cut] = []
    degraded: str | None = None
    instructions: str | None = None
    started: int = -1
    carried: list[Cut] = []
    cut: str | None = None


@final
class TurnUsage(Event, frozen=True, gc=False, tag="turn/usage"):
    """The tokens of a turn and their cost: `usage` its steps' summed, `session` every
    turn's of the session so far, this one's included. Just before ``turn/end``, when a
    step reported usage. Each ``cost`` is None (left out) when unknown: a turn's when a
    step's was, the session's from the first such turn on (and in a log written before
    costs were)."""

    turn: int
    usage: Usage
    session: Usage


@final
class ToolCall(Event, frozen=True, gc=False, tag="tool/call"):
    """A call the model made; `kind`, `title` and `locations` say, for a reader, what it does."""

    turn: int
    step: int
    call_id: str
    name: str
    arguments: str  # the raw JSON text the model produced
    kind: ToolKind = "other"
    title: str = ""
    locations: list[Location] = []


@final
class ToolStart(Event, frozen=True, gc=False, tag="tool/start"):
    """The call was allowed to run and is running now."""

    turn: int
    step: int
    call_id: str


@final
class ToolError(msgspec.Struct, frozen=True, gc=False):
    name: str
    code: str | None = None


@final
class ToolResult(Event, frozen=True, gc=False, tag="tool/result"):
    turn: int
    step: int
    call_id: str
    content: str
    is_error: bool = False
    error: ToolError | None = None
    diffs: list[FileDiff] = []


PlanStatus: TypeAlias = Literal["pending", "in_progress", "completed"]
PlanPriority: TypeAlias = Literal["high", "medium", "low"]


@final
class PlanEntry(msgspec.Struct, frozen=True, gc=False):
    """One task of an agent's plan, shaped like ACP's ``PlanEntry``."""

    content: str
    priority: PlanPriority
    status: PlanStatus


@final
class PlanSet(Event, frozen=True, gc=False, tag="plan/set"):
    """The agent's plan is now `entries`, whole (the ``todo`` tool's call `call_id`); the
    last one of a session holds."""

    turn: int
    call_id: str
    entries: list[PlanEntry]


@final
class ToolProgress(msgspec.Struct, frozen=True, gc=False, kw_only=True, tag="tool/progress"):
    """What a running call has shown so far: `output` the last `PROGRESS_BYTES` of it at
    most (UTF-8), `total` the bytes it wrote. A transient notice, never a log event: the
    latest one of a call stands for every earlier one, and its ``tool/result`` for all."""

    turn: int
    step: int
    call_id: str
    output: str
    total: int


#: Bytes of a running call's output a `ToolProgress` carries at most (its tail).
PROGRESS_BYTES: Final = 8192


@final
class ConfigSet(Event, frozen=True, gc=False, tag="config/set"):
    """A setting of the session changed (``mode``, ``model``); the last one of a key holds."""

    key: str
    value: str


@final
class PermissionRule(Event, frozen=True, gc=False, tag="permission/rule"):
    """An "always" answer to a permission request: `tool` may (or may not) run unasked."""

    tool: str
    allow: bool


@final
class Protections(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """What the kernel enforces on the commands a session runs (`greenroom.sandbox`).

    ``filesystem``: the Landlock ABI that confines their writes (0: none);
    ``read_only``: read only also opens no socket and changes no file's mode, owner,
    times or extended attributes (a seccomp filter);
    ``signals``: a confined command cannot signal a process outside its sandbox
    (Landlock scoping, ABI 6); ``cgroup``: each command is in a cgroup of its own,
    killed with it; ``pids`` and ``memory``: a session's limits, where they hold.
    """

    filesystem: int = 0
    read_only: bool = False
    signals: bool = False
    cgroup: bool = False
    pids: int | None = None
    memory: int | None = None


@final
class SandboxProtections(Event, frozen=True, gc=False, tag="sandbox/protections"):
    """The protections that hold for this session's commands, logged by the first command
    of each of its lives (a resume may run on another kernel)."""

    protections: Protections


SessionEvent: TypeAlias = (
    TurnStart
    | TurnEnd
    | TurnAnswered
    | TurnResumed
    | GuardTripped
    | DecisionRequested
    | DecisionMade
    | StepStart
    | StepEnd
    | UserMessage
    | ContextMessage
    | SteeringMessage
    | AssistantChunk
    | AssistantMessage
    | ModelRetry
    | TurnUsage
    | CompactionStart
    | Compacted
    | ToolCall
    | ToolStart
    | ToolResult
    | PlanSet
    | ConfigSet
    | PermissionRule
    | SandboxProtections
)

StatusName: TypeAlias = Literal["idle", "running", "waiting", "disposed"]

SESSION_VERSION: Final = 0


@final
class SessionHeader(
    msgspec.Struct, frozen=True, gc=False, kw_only=True, tag_field="type", tag="session"
):
    """What a session is, kept outside its log. ``created_at`` is wall-clock milliseconds.

    Tagged ``"type": "session"`` so it can lead a log file beside the events.
    ``principal``: who owns it, the name of the ``greenroom serve`` principal that made
    it (a sub-agent's session, its parent's); None for one made without one (by
    ``greenroom acp``, by an embedder, or before headers recorded it).
    """

    version: int = SESSION_VERSION
    id: str
    created_at: int
    cwd: str | None = None
    additional_directories: list[str] = []
    parent_session: str | None = None
    forked_from: str | None = None
    principal: str | None = None
