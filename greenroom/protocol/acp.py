"""ACP v1 on the wire: JSON-RPC 2.0 envelopes and the Agent Client Protocol types greenroom speaks.

Field names follow the wire (camelCase, ``_meta``) through one rename
function; every Struct is built once and encoded by one `Encoder`.
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


def wire_name(name: str) -> str:
    """``session_id`` → ``sessionId``; ``meta`` → ``_meta``."""
    if name == "meta":
        return "_meta"
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


RequestId: TypeAlias = int | str | None

# -- JSON-RPC envelopes --------------------------------------------------------------


class ErrorObject(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    code: int
    message: str
    data: Any = None


class Response(msgspec.Struct, frozen=True, gc=False):
    id: RequestId
    result: Any
    jsonrpc: str = "2.0"


class ErrorResponse(msgspec.Struct, frozen=True, gc=False):
    id: RequestId
    error: ErrorObject
    jsonrpc: str = "2.0"


class Notification(msgspec.Struct, frozen=True, gc=False):
    method: str
    params: Any
    jsonrpc: str = "2.0"


# -- content ---------------------------------------------------------------------------


class TextBlock(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="text"):
    text: str


class ResourceLinkBlock(
    msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="resource_link", rename=wire_name
):
    uri: str
    name: str
    title: str | None = None
    description: str | None = None


class ImageBlock(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="type",
    tag="image",
    rename=wire_name,
    omit_defaults=True,
):
    data: str  # base64
    mime_type: str
    uri: str | None = None


class ResourceContents(msgspec.Struct, frozen=True, gc=False, rename=wire_name, omit_defaults=True):
    """An embedded resource's contents: its `text`, or its `blob` (base64); one of them."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: str | None = None


class ResourceBlock(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="resource"):
    resource: ResourceContents


ContentBlock: TypeAlias = TextBlock | ImageBlock | ResourceBlock | ResourceLinkBlock

# -- requests --------------------------------------------------------------------------


class FileSystemCapability(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    read_text_file: bool = False
    write_text_file: bool = False


class ElicitationCapability(msgspec.Struct, frozen=True, gc=False):
    """ACP's ``elicitation`` client capability; greenroom asks only in ``form`` mode."""

    form: dict[str, Any] | None = None


class ClientSessionCapabilities(msgspec.Struct, frozen=True, gc=False):
    """ACP's ``clientCapabilities.session`` (unstable members). ``compaction``: an object
    (``{}``) when the client renders ``compaction_update`` (RFD "session-compaction");
    omitted or null, it does not."""

    compaction: dict[str, Any] | None = None


class ClientCapabilities(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """What the client offers the agent (the members greenroom uses; others are ignored).
    ``meta`` is ``_meta``: a client sets ``terminal_output: true`` there to have command
    output rendered as a terminal (the convention of Zed and claude-agent-acp)."""

    fs: FileSystemCapability = FileSystemCapability()
    elicitation: ElicitationCapability | None = None
    session: ClientSessionCapabilities | None = None
    meta: dict[str, Any] | None = None


class InitializeParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    protocol_version: int
    client_capabilities: ClientCapabilities = ClientCapabilities()
    client_info: dict[str, Any] | None = None


class NameValue(msgspec.Struct, frozen=True, gc=False):
    """An environment variable of a stdio server, or a header of an HTTP one."""

    name: str
    value: str


class StdioServerEntry(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """An entry of ``mcpServers`` without a ``type`` (or ``"stdio"``): a process to run."""

    name: str
    command: str
    args: list[str] = []
    env: list[NameValue] = []
    type: Literal["stdio"] = "stdio"


class HttpServerEntry(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """An entry of ``mcpServers`` with ``"type": "http"``: a streamable-HTTP server."""

    type: Literal["http"]
    name: str
    url: str
    headers: list[NameValue] = []


class NewSessionParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    cwd: str
    mcp_servers: list[dict[str, Any]] = []
    additional_directories: list[str] = []


class LoadSessionParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """``session/load`` and ``session/resume``: the additional roots are sent again each
    time (omitted: none), never restored from the stored session."""

    session_id: str
    cwd: str
    mcp_servers: list[dict[str, Any]] = []
    additional_directories: list[str] = []


class ForkSessionParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    session_id: str
    cwd: str
    additional_directories: list[str] = []
    mcp_servers: list[dict[str, Any]] = []


class SetModeParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    session_id: str
    mode_id: str


class AuthenticateParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    method_id: str


class SetConfigOptionParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    session_id: str
    config_id: str
    value: str


class ListSessionsParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    cwd: str | None = None
    cursor: str | None = None


class SessionParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """The params of ``session/cancel``, ``session/close`` and ``session/delete``."""

    session_id: str


class PromptParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """The params of ``session/prompt`` and of the ``_session/steering`` extension."""

    session_id: str
    prompt: list[ContentBlock]


class CancelRequestParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """``$/cancel_request``: the id of the request to cancel."""

    request_id: int | str


# -- results ---------------------------------------------------------------------------


class Empty(msgspec.Struct, frozen=True, gc=False):
    """``{}``: what ``session/load``, ``session/close`` answer."""


class PromptCapabilities(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    image: bool = True
    audio: bool = False
    embedded_context: bool = True


class SessionCapabilities(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    list: Empty = Empty()
    resume: Empty = Empty()
    close: Empty = Empty()
    delete: Empty = Empty()
    fork: Empty = Empty()
    additional_directories: Empty = Empty()


class McpCapabilities(msgspec.Struct, frozen=True, gc=False):
    """The ``mcpServers`` transports greenroom connects (stdio always)."""

    http: bool = True
    sse: bool = False


class AgentCapabilities(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    load_session: bool = True
    prompt_capabilities: PromptCapabilities = PromptCapabilities()
    mcp_capabilities: McpCapabilities = McpCapabilities()
    session_capabilities: SessionCapabilities = SessionCapabilities()
    meta: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"claudeCode": {"promptQueueing": True}}
    )


class Implementation(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    name: str
    version: str
    title: str | None = None


class InitializeResult(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    protocol_version: int
    agent_info: Implementation
    agent_capabilities: AgentCapabilities = AgentCapabilities()
    auth_methods: list[Any] = []
    meta: dict[str, Any] = msgspec.field(default_factory=lambda: {"steering": {"supported": True}})


class SessionMode(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    id: str
    name: str
    description: str


class SessionModeState(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    current_mode_id: str
    available_modes: list[SessionMode]


class ConfigChoice(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    value: str
    name: str


class ConfigOption(
    msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="select", rename=wire_name
):
    """A setting the client may change with ``session/set_config_option``."""

    id: str
    name: str
    category: str
    current_value: str
    options: list[ConfigChoice]


class NewSessionResult(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    session_id: str
    modes: SessionModeState
    config_options: list[ConfigOption]


class LoadSessionResult(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    """What ``session/load`` and ``session/resume`` answer."""

    modes: SessionModeState
    config_options: list[ConfigOption]


class SetConfigOptionResult(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    config_options: list[ConfigOption]


class SessionInfo(msgspec.Struct, frozen=True, gc=False, rename=wire_name, omit_defaults=True):
    session_id: str
    cwd: str
    title: str | None = None
    updated_at: str | None = None


class ListSessionsResult(
    msgspec.Struct, frozen=True, gc=False, rename=wire_name, omit_defaults=True
):
    sessions: list[SessionInfo]
    next_cursor: str | None = None


StopReason: TypeAlias = Literal[
    "end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"
]


class PromptUsage(msgspec.Struct, frozen=True, gc=False, rename=wire_name, omit_defaults=True):
    """A turn's tokens (ACP's unstable ``PromptResponse.usage``); the input counts the cached
    reads and writes, the output the thought tokens."""

    total_tokens: int
    input_tokens: int
    output_tokens: int
    thought_tokens: int | None = None
    cached_read_tokens: int | None = None
    cached_write_tokens: int | None = None


class PromptResult(msgspec.Struct, frozen=True, gc=False, rename=wire_name, omit_defaults=True):
    stop_reason: StopReason
    usage: PromptUsage | None = None


SteeringOutcome: TypeAlias = Literal["injected", "startedNewTurn", "failed"]


class SteeringResult(msgspec.Struct, frozen=True, gc=False):
    outcome: SteeringOutcome


# -- session/update ------------------------------------------------------------------------


class _ContentChunk(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    rename=wire_name,
    omit_defaults=True,
):
    content: TextBlock
    message_id: str | None = None


class UserMessageChunk(_ContentChunk, frozen=True, gc=False, tag="user_message_chunk"):
    """A prompt's block, replayed (an image or embedded resource as it came)."""

    content: TextBlock | ImageBlock | ResourceBlock  # type: ignore[assignment]


class AgentMessageChunk(_ContentChunk, frozen=True, gc=False, tag="agent_message_chunk"):
    pass


class AgentThoughtChunk(_ContentChunk, frozen=True, gc=False, tag="agent_thought_chunk"):
    pass


ToolStatus: TypeAlias = Literal["pending", "in_progress", "completed", "failed"]


class ToolCallContent(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="content"):
    content: TextBlock


class DiffContent(
    msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="diff", rename=wire_name
):
    path: str
    new_text: str
    old_text: str | None = None


class TerminalContent(
    msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="terminal", rename=wire_name
):
    """A terminal the client renders; greenroom names a ``bash`` call's after the call and
    fills it through ``_meta.terminal_output`` (see `greenroom.acp.live`)."""

    terminal_id: str


ToolContent: TypeAlias = ToolCallContent | DiffContent | TerminalContent


class ToolLocation(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    path: str
    line: int | None = None


class ToolCallStart(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="tool_call",
    rename=wire_name,
    omit_defaults=True,
):
    tool_call_id: str
    title: str
    kind: ToolKind
    status: ToolStatus
    locations: list[ToolLocation] | None = None
    raw_input: Any = None
    content: list[ToolContent] | None = None
    meta: dict[str, Any] | None = None


class ToolCallProgress(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="tool_call_update",
    rename=wire_name,
    omit_defaults=True,
):
    tool_call_id: str
    status: ToolStatus
    content: list[ToolContent] | None = None
    meta: dict[str, Any] | None = None


class CurrentModeUpdate(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="current_mode_update",
    rename=wire_name,
):
    current_mode_id: str


class ConfigOptionUpdate(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="config_option_update",
    rename=wire_name,
):
    config_options: list[ConfigOption]


class SessionInfoUpdate(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="session_info_update",
    rename=wire_name,
    omit_defaults=True,
):
    title: str | None = None
    updated_at: str | None = None


class Cost(msgspec.Struct, frozen=True, gc=False):
    """A session's cost so far (ACP's ``Cost``): `amount` a JSON number, as the schema
    has it (the log keeps the exact decimal), in `currency` (ISO 4217)."""

    amount: float
    currency: str


class UsageUpdate(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="usage_update",
    rename=wire_name,
    omit_defaults=True,
):
    """The tokens in the model's context (`used`) of its window (`size`), and the
    session's `cost` so far when it is known."""

    used: int
    size: int
    cost: Cost | None = None


#: A compaction's lifecycle as ACP's unstable ``CompactionStatus`` names it (greenroom
#: sends ``in_progress``, ``completed`` (a cancelled or failed summary still ends in a
#: compaction, degraded) and, on replay, ``failed`` for one a crash cut).
CompactionStatus: TypeAlias = Literal["in_progress", "completed", "failed", "cancelled"]


class CompactionUpdate(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="compaction_update",
    rename=wire_name,
    omit_defaults=True,
):
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


class CompactionSummaryChunk(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="compaction_summary_chunk",
    rename=wire_name,
):
    """ACP's unstable ``compaction_summary_chunk``: `content` appended to the summary of the
    compaction `compaction_id`, between its ``in_progress`` and its terminal update."""

    compaction_id: str
    content: TextBlock


class PlanUpdate(msgspec.Struct, frozen=True, gc=False, tag_field="sessionUpdate", tag="plan"):
    """The agent's whole plan (ACP's ``PlanEntry`` is greenroom's own `PlanEntry`)."""

    entries: list[PlanEntry]


class CommandInput(msgspec.Struct, frozen=True, gc=False):
    """What a command takes after its name, as the client hints it."""

    hint: str


class AvailableCommand(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    name: str
    description: str
    input: CommandInput | None = None


class AvailableCommandsUpdate(
    msgspec.Struct,
    frozen=True,
    gc=False,
    tag_field="sessionUpdate",
    tag="available_commands_update",
    rename=wire_name,
):
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
)


class SessionNotificationParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    session_id: str
    update: SessionUpdate


# -- requests greenroom sends the client ------------------------------------------------------


class OutgoingRequest(msgspec.Struct, frozen=True, gc=False):
    id: str
    method: str
    params: Any
    jsonrpc: str = "2.0"


class PermissionOption(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    option_id: str
    name: str
    kind: PermissionDecision


class PermissionToolCall(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    tool_call_id: str
    title: str
    kind: ToolKind
    status: ToolStatus
    raw_input: Any = None


class RequestPermissionParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    session_id: str
    tool_call: PermissionToolCall
    options: list[PermissionOption]


class PermissionOutcome(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    outcome: Literal["selected", "cancelled"]
    option_id: str | None = None


class RequestPermissionResult(msgspec.Struct, frozen=True, gc=False):
    outcome: PermissionOutcome


class ElicitationParams(
    msgspec.Struct, frozen=True, gc=False, rename=wire_name, omit_defaults=True
):
    """``elicitation/create`` in form mode, in a session (a tool call's, when it has one)."""

    session_id: str
    message: str
    requested_schema: dict[str, Any]
    mode: Literal["form"]
    tool_call_id: str | None = None


class ElicitationResult(msgspec.Struct, frozen=True, gc=False):
    """The client's answer: ``accept`` with the form's content, ``decline`` or ``cancel``."""

    action: str
    content: dict[str, Any] | None = None


class ReadTextFileParams(
    msgspec.Struct, frozen=True, gc=False, rename=wire_name, omit_defaults=True
):
    session_id: str
    path: str
    line: int | None = None
    limit: int | None = None


class ReadTextFileResult(msgspec.Struct, frozen=True, gc=False):
    content: str


class WriteTextFileParams(msgspec.Struct, frozen=True, gc=False, rename=wire_name):
    session_id: str
    path: str
    content: str
