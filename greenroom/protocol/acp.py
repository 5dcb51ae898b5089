"""ACP v1 on the wire: JSON-RPC 2.0 envelopes and the Agent Client Protocol types greenroom speaks.

Every Struct here derives from `_Wire`, which sets once the options they all
share (immutable, untracked by the garbage collector, field names as on the
wire: camelCase, ``_meta``, through one rename function); `_Sparse` also
leaves a field at its default off the wire, `_Typed` tags a Struct by
``type``, `_Update` a ``session/update`` by ``sessionUpdate``. Every Struct
is built once and encoded by one `Encoder`.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import msgspec

from greenroom.protocol.events import PermissionDecision, PlanEntry, ToolKind

PROTOCOL_VERSION: Final = 1

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800
RESOURCE_NOT_FOUND: Final = -32002
AUTH_REQUIRED: Final = -32000


def wire_name(name: str) -> str:
    """``session_id`` → ``sessionId``; ``meta`` → ``_meta``."""
    if name == "meta":
        return "_meta"
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


RequestId: TypeAlias = int | str | None


class _Wire(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """What every Struct here is: frozen, never part of a reference cycle (so untracked by
    the garbage collector), its fields named as on the wire. A subclass inherits all
    three; it says ``frozen=True`` again only for type checkers, which do not carry it
    over (PEP 681)."""


class _Sparse(_Wire, frozen=True, omit_defaults=True):
    """A Struct whose fields at their default are left off the wire."""


class _Typed(_Wire, frozen=True, tag_field="type"):
    """A Struct tagged by its ``type`` member: a content block, a config option."""


class _Update(_Sparse, frozen=True, tag_field="sessionUpdate"):
    """A ``session/update``, tagged by ``sessionUpdate``."""


# -- JSON-RPC envelopes --------------------------------------------------------------


class ErrorObject(_Sparse, frozen=True):
    code: int
    message: str
    data: Any = None


class Response(_Wire, frozen=True):
    id: RequestId
    result: Any
    jsonrpc: str = "2.0"


class ErrorResponse(_Wire, frozen=True):
    id: RequestId
    error: ErrorObject
    jsonrpc: str = "2.0"


class Notification(_Wire, frozen=True):
    """A notification greenroom sends (the ones it reads are `greenroom.acp.frames`')."""

    method: str
    params: Any
    jsonrpc: str = "2.0"


# -- content ---------------------------------------------------------------------------


class TextBlock(_Typed, frozen=True, tag="text"):
    text: str


class ResourceLinkBlock(_Typed, frozen=True, tag="resource_link"):
    uri: str
    name: str
    title: str | None = None
    description: str | None = None


class ImageBlock(_Typed, frozen=True, tag="image", omit_defaults=True):
    data: str  # base64
    mime_type: str
    uri: str | None = None


class ResourceContents(_Sparse, frozen=True):
    """An embedded resource's contents: its `text`, or its `blob` (base64); one of them."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: str | None = None


class ResourceBlock(_Typed, frozen=True, tag="resource"):
    resource: ResourceContents


#: ACP's ``ContentBlock``, as a prompt holds it (greenroom's own is
#: `greenroom.protocol.content.ContentBlock`).
AcpContentBlock: TypeAlias = TextBlock | ImageBlock | ResourceBlock | ResourceLinkBlock

# -- requests --------------------------------------------------------------------------


class FileSystemCapability(_Wire, frozen=True):
    read_text_file: bool = False
    write_text_file: bool = False


class ElicitationCapability(_Wire, frozen=True):
    """ACP's ``elicitation`` client capability; greenroom asks only in ``form`` mode."""

    form: dict[str, Any] | None = None


class ConfigOptionsCapability(_Wire, frozen=True):
    """ACP's ``clientCapabilities.session.configOptions``. ``boolean``: an object (``{}``)
    when the client takes config options of ``type: "boolean"``; omitted or null, it
    does not (it is offered none)."""

    boolean: dict[str, Any] | None = None


class ClientSessionCapabilities(_Wire, frozen=True):
    """ACP's ``clientCapabilities.session``. ``compaction`` (unstable): an object (``{}``)
    when the client renders ``compaction_update`` (RFD "session-compaction"); omitted or
    null, it does not. ``config_options``: the config option types it takes beyond
    ``select``."""

    compaction: dict[str, Any] | None = None
    config_options: ConfigOptionsCapability | None = None


class ClientCapabilities(_Wire, frozen=True):
    """What the client offers the agent (the members greenroom uses; others are ignored).
    ``meta`` is ``_meta``: a client sets ``terminal_output: true`` there to have command
    output rendered as a terminal (the convention of Zed and claude-agent-acp)."""

    fs: FileSystemCapability = FileSystemCapability()
    elicitation: ElicitationCapability | None = None
    session: ClientSessionCapabilities | None = None
    plan: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


class InitializeParams(_Wire, frozen=True):
    protocol_version: int
    client_capabilities: ClientCapabilities = ClientCapabilities()
    client_info: dict[str, Any] | None = None


class NameValue(_Wire, frozen=True):
    """An environment variable of a stdio server, or a header of an HTTP one."""

    name: str
    value: str


class StdioServerEntry(_Wire, frozen=True):
    """An entry of ``mcpServers`` without a ``type`` (or ``"stdio"``): a process to run."""

    name: str
    command: str
    args: list[str] = []
    env: list[NameValue] = []
    type: Literal["stdio"] = "stdio"


class HttpServerEntry(_Wire, frozen=True):
    """An entry of ``mcpServers`` with ``"type": "http"``: a streamable-HTTP server."""

    type: Literal["http"]
    name: str
    url: str
    headers: list[NameValue] = []


class NewSessionParams(_Wire, frozen=True):
    cwd: str
    mcp_servers: list[dict[str, Any]] = []
    additional_directories: list[str] = []


class LoadSessionParams(_Wire, frozen=True):
    """``session/load`` and ``session/resume``: the additional roots are sent again each
    time (omitted: none), never restored from the stored session."""

    session_id: str
    cwd: str
    mcp_servers: list[dict[str, Any]] = []
    additional_directories: list[str] = []
    #: ``_meta``: ``{"greenroom": {"after": SEQ}}`` replays only what came after SEQ.
    meta: dict[str, Any] | None = None


class ForkSessionParams(_Wire, frozen=True):
    """``session/fork``; `message_id` (the optional message id the session-fork RFD foresees)
    forks at that message: the fork ends with the turn that holds it."""

    session_id: str
    cwd: str
    additional_directories: list[str] = []
    mcp_servers: list[dict[str, Any]] = []
    message_id: str | None = None


class SetModeParams(_Wire, frozen=True):
    session_id: str
    mode_id: str


class AuthenticateParams(_Wire, frozen=True):
    method_id: str


class SetConfigOptionParams(_Wire, frozen=True):
    """``session/set_config_option``: a select option's value is the id of one of its
    choices (a string); a boolean option's is a boolean, sent with ``type: "boolean"``."""

    session_id: str
    config_id: str
    value: str | bool
    type: str | None = None


class ListSessionsParams(_Wire, frozen=True):
    cwd: str | None = None
    cursor: str | None = None


class SessionParams(_Wire, frozen=True):
    """The params of ``session/cancel``, ``session/close`` and ``session/delete``."""

    session_id: str


class PromptParams(_Wire, frozen=True):
    """The params of ``session/prompt`` and of the ``_session/steering`` extension."""

    session_id: str
    prompt: list[AcpContentBlock]


class CancelRequestParams(_Wire, frozen=True):
    """``$/cancel_request``: the id of the request to cancel."""

    request_id: int | str


# -- results ---------------------------------------------------------------------------


class Empty(_Wire, frozen=True):
    """``{}``: what ``session/load``, ``session/close`` answer."""


class PromptCapabilities(_Wire, frozen=True):
    image: bool = True
    audio: bool = False
    embedded_context: bool = True


class SessionCapabilities(_Wire, frozen=True):
    list: Empty = Empty()
    resume: Empty = Empty()
    close: Empty = Empty()
    delete: Empty = Empty()
    fork: Empty = Empty()
    additional_directories: Empty = Empty()


class McpCapabilities(_Wire, frozen=True):
    """The ``mcpServers`` transports greenroom connects (stdio always)."""

    http: bool = True
    sse: bool = False


class AgentAuthCapabilities(_Wire, frozen=True):
    """``agentCapabilities.auth``: ``logout: {}``, the agent serves ``logout``."""

    logout: Empty = Empty()


class AgentCapabilities(_Wire, frozen=True):
    load_session: bool = True
    prompt_capabilities: PromptCapabilities = PromptCapabilities()
    mcp_capabilities: McpCapabilities = McpCapabilities()
    session_capabilities: SessionCapabilities = SessionCapabilities()
    meta: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"claudeCode": {"promptQueueing": True}}
    )
    auth: AgentAuthCapabilities | None = None


class Implementation(_Sparse, frozen=True):
    name: str
    version: str
    title: str | None = None


class TerminalAuthMethod(_Wire, frozen=True):
    """ACP's ``AuthMethodTerminal``: the client runs the agent's program again in a terminal,
    with `args` in place of its own (as the ACP registry launches it) and `env` added, for
    the user to log in there; exit status 0 is a login. The client then reconnects."""

    id: str
    name: str
    description: str
    args: list[str]
    env: dict[str, str] = {}
    type: Literal["terminal"] = "terminal"


class InitializeResult(_Wire, frozen=True):
    protocol_version: int
    agent_info: Implementation
    agent_capabilities: AgentCapabilities = AgentCapabilities()
    auth_methods: list[TerminalAuthMethod] = []
    meta: dict[str, Any] = msgspec.field(default_factory=lambda: {"steering": {"supported": True}})


class SessionMode(_Wire, frozen=True):
    id: str
    name: str
    description: str


class SessionModeState(_Wire, frozen=True):
    current_mode_id: str
    available_modes: list[SessionMode]


class ConfigChoice(_Wire, frozen=True):
    value: str
    name: str


class ConfigOption(_Typed, frozen=True, tag="select"):
    """A setting the client may change with ``session/set_config_option`` (a select: its
    value is one of its choices')."""

    id: str
    name: str
    category: str
    current_value: str
    options: list[ConfigChoice]


class BooleanConfigOption(_Typed, frozen=True, tag="boolean"):
    """A setting that is on or off, offered only to a client that declares
    ``session.configOptions.boolean``."""

    id: str
    name: str
    description: str
    current_value: bool


#: A config option as ``configOptions`` lists it.
AnyConfigOption: TypeAlias = ConfigOption | BooleanConfigOption


class NewSessionResult(_Wire, frozen=True):
    session_id: str
    modes: SessionModeState
    config_options: list[AnyConfigOption]


class LoadSessionResult(_Wire, frozen=True):
    """What ``session/load`` and ``session/resume`` answer."""

    modes: SessionModeState
    config_options: list[AnyConfigOption]


class SetConfigOptionResult(_Wire, frozen=True):
    config_options: list[AnyConfigOption]


class SessionInfo(_Sparse, frozen=True):
    session_id: str
    cwd: str
    title: str | None = None
    updated_at: str | None = None


class ListSessionsResult(_Sparse, frozen=True):
    sessions: list[SessionInfo]
    next_cursor: str | None = None


#: ACP's ``StopReason`` (greenroom's own, an `Answer`'s, is `greenroom.actors.prompt.StopReason`).
AcpStopReason: TypeAlias = Literal[
    "end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"
]


class PromptUsage(_Sparse, frozen=True):
    """A turn's tokens (ACP's unstable ``PromptResponse.usage``); the input counts the cached
    reads and writes, the output the thought tokens."""

    total_tokens: int
    input_tokens: int
    output_tokens: int
    thought_tokens: int | None = None
    cached_read_tokens: int | None = None
    cached_write_tokens: int | None = None


class PromptResult(_Sparse, frozen=True):
    stop_reason: AcpStopReason
    usage: PromptUsage | None = None


SteeringOutcome: TypeAlias = Literal["injected", "startedNewTurn", "failed"]


class SteeringResult(_Wire, frozen=True):
    outcome: SteeringOutcome


# -- session/update ------------------------------------------------------------------------


class _ContentChunk(_Update, frozen=True):
    content: TextBlock
    message_id: str | None = None


class UserMessageChunk(_ContentChunk, frozen=True, tag="user_message_chunk"):
    """A prompt's block, replayed (an image or embedded resource as it came)."""

    content: TextBlock | ImageBlock | ResourceBlock  # type: ignore[assignment]


class AgentMessageChunk(_ContentChunk, frozen=True, tag="agent_message_chunk"):
    pass


class AgentThoughtChunk(_ContentChunk, frozen=True, tag="agent_thought_chunk"):
    pass


ToolStatus: TypeAlias = Literal["pending", "in_progress", "completed", "failed"]


class ToolCallContent(_Typed, frozen=True, tag="content"):
    content: TextBlock


class DiffContent(_Typed, frozen=True, tag="diff"):
    path: str
    new_text: str
    old_text: str | None = None


class TerminalContent(_Typed, frozen=True, tag="terminal"):
    """A terminal the client renders; greenroom names a ``bash`` call's after the call and
    fills it through ``_meta.terminal_output`` (see `greenroom.acp.live`)."""

    terminal_id: str


ToolContent: TypeAlias = ToolCallContent | DiffContent | TerminalContent


class ToolLocation(_Sparse, frozen=True):
    path: str
    line: int | None = None


class ToolCallStart(_Update, frozen=True, tag="tool_call"):
    """A call the model made; `name` (unstable) is its tool's name, as the model called it."""

    tool_call_id: str
    title: str
    kind: ToolKind
    status: ToolStatus
    locations: list[ToolLocation] | None = None
    raw_input: Any = None
    content: list[ToolContent] | None = None
    meta: dict[str, Any] | None = None
    name: str | None = None


class ToolCallProgress(_Update, frozen=True, tag="tool_call_update"):
    """A call's progress or its end; at its end `raw_output` is what the model was given
    back (its text, bounded as any update's)."""

    tool_call_id: str
    status: ToolStatus
    content: list[ToolContent] | None = None
    meta: dict[str, Any] | None = None
    raw_output: str | None = None


class CurrentModeUpdate(_Update, frozen=True, tag="current_mode_update"):
    current_mode_id: str


class ConfigOptionUpdate(_Update, frozen=True, tag="config_option_update"):
    config_options: list[AnyConfigOption]


class SessionInfoUpdate(_Update, frozen=True, tag="session_info_update"):
    title: str | None = None
    updated_at: str | None = None


class Cost(_Wire, frozen=True):
    """A session's cost so far (ACP's ``Cost``): `amount` a JSON number, as the schema
    has it (the log keeps the exact decimal), in `currency` (ISO 4217)."""

    amount: float
    currency: str


class UsageUpdate(_Update, frozen=True, tag="usage_update"):
    """The tokens in the model's context (`used`) of its window (`size`), and the
    session's `cost` so far when it is known."""

    used: int
    size: int
    cost: Cost | None = None


#: A compaction's lifecycle as ACP's unstable ``CompactionStatus`` names it (greenroom
#: sends ``in_progress``, ``completed`` (a cancelled or failed summary still ends in a
#: compaction, degraded) and, on replay, ``failed`` for one a crash cut).
CompactionStatus: TypeAlias = Literal["in_progress", "completed", "failed", "cancelled"]


class CompactionUpdate(_Update, frozen=True, tag="compaction_update"):
    """ACP's unstable ``compaction_update``: creates, then patches, the compaction entity
    `compaction_id` of the session's timeline. An omitted `summary` or `meta` leaves the
    entity's as it was; a `summary` replaces what its chunks added; `error` says why a
    ``failed`` one failed. Sent only to a client that declared
    ``clientCapabilities.session.compaction``."""

    compaction_id: str
    status: CompactionStatus
    summary: list[TextBlock] | None = None
    error: str | None = None
    meta: dict[str, Any] | None = None


class CompactionSummaryChunk(_Update, frozen=True, tag="compaction_summary_chunk"):
    """ACP's unstable ``compaction_summary_chunk``: `content` appended to the summary of the
    compaction `compaction_id`, between its ``in_progress`` and its terminal update."""

    compaction_id: str
    content: TextBlock


class PlanUpdate(_Update, frozen=True, tag="plan"):
    """The agent's whole plan (ACP's ``PlanEntry`` is greenroom's own `PlanEntry`)."""

    entries: list[PlanEntry]


#: ACP's unstable ``NoticeSeverity`` (open: greenroom sends these three).
NoticeSeverity: TypeAlias = Literal["info", "warning", "error"]


class NoticeUpdate(_Update, frozen=True, tag="notice"):
    """ACP's unstable ``notice`` (RFD "session-notices"): advice for the user that is no
    part of the conversation, live only (never replayed); `title` stands alone. Sent only
    to a client that declared ``clientCapabilities._meta.notice: true``: the schema has no
    capability for it, and a v1 client without it drops the whole notification."""

    severity: NoticeSeverity
    title: str
    description: str | None = None


class PlanItems(_Typed, frozen=True, tag="items"):
    """ACP's unstable item-based plan content: the whole plan `plan_id`, replaced."""

    plan_id: str
    entries: list[PlanEntry]


class PlanContentUpdate(_Update, frozen=True, tag="plan_update"):
    """ACP's unstable ``plan_update``: a plan, by its id, for a client that declared
    ``clientCapabilities.plan`` (others get `PlanUpdate`)."""

    plan: PlanItems


class CommandInput(_Wire, frozen=True):
    """What a command takes after its name, as the client hints it."""

    hint: str


class AvailableCommand(_Sparse, frozen=True):
    name: str
    description: str
    input: CommandInput | None = None


class AvailableCommandsUpdate(_Update, frozen=True, tag="available_commands_update"):
    """The slash commands a session offers now (the whole set)."""

    available_commands: list[AvailableCommand]


SessionUpdate: TypeAlias = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCallStart
    | ToolCallProgress
    | CurrentModeUpdate
    | ConfigOptionUpdate
    | SessionInfoUpdate
    | UsageUpdate
    | CompactionUpdate
    | CompactionSummaryChunk
    | PlanUpdate
    | AvailableCommandsUpdate
    | NoticeUpdate
    | PlanContentUpdate
)


class SessionNotificationParams(_Sparse, frozen=True):
    """``meta`` (``_meta``): under ``greenroom serve``, ``{"greenroom": {"seq": N}}``, the
    update's place in its session's log."""

    session_id: str
    update: SessionUpdate
    meta: dict[str, Any] | None = None


# -- requests greenroom sends the client ------------------------------------------------------


class OutgoingRequest(_Wire, frozen=True):
    id: str
    method: str
    params: Any
    jsonrpc: str = "2.0"


class PermissionOption(_Wire, frozen=True):
    option_id: str
    name: str
    kind: PermissionDecision


class PermissionToolCall(_Wire, frozen=True):
    tool_call_id: str
    title: str
    kind: ToolKind
    status: ToolStatus
    raw_input: Any = None


class RequestPermissionParams(_Wire, frozen=True):
    session_id: str
    tool_call: PermissionToolCall
    options: list[PermissionOption]


class PermissionOutcome(_Wire, frozen=True):
    outcome: Literal["selected", "cancelled"]
    option_id: str | None = None


class RequestPermissionResult(_Wire, frozen=True):
    outcome: PermissionOutcome


class ElicitationParams(_Sparse, frozen=True):
    """``elicitation/create`` in form mode, in a session (a tool call's, when it has one)."""

    session_id: str
    message: str
    requested_schema: dict[str, Any]
    mode: Literal["form"]
    tool_call_id: str | None = None


class ElicitationResult(_Wire, frozen=True):
    """The client's answer: ``accept`` with the form's content, ``decline`` or ``cancel``."""

    action: str
    content: dict[str, Any] | None = None


class ReadTextFileParams(_Sparse, frozen=True):
    session_id: str
    path: str
    line: int | None = None
    limit: int | None = None


class ReadTextFileResult(_Wire, frozen=True):
    content: str


class WriteTextFileParams(_Wire, frozen=True):
    session_id: str
    path: str
    content: str
