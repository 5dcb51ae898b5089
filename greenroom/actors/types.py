"""The agent interface every plugin programs against, and the tool seam the loop calls.

Nothing here depends on the loop: the loop is one implementation of `Agent`.

The names: the `Agent` protocol and `AgentOptions`; how titles are written (`TITLES`); the
modes (`MODES`, the sandbox access of each, `MODE_ACCESS`, and `mode_descriptions` with
what the kernel gives); `Guard`; the
tool seam (`ToolInvocation`, `ToolOutcome` and `ToolOutcome.failed`, the one builder of an
error result, `ToolView`, `ToolExecutor`); a spawn (`SpawnArgs`, what a spawn takes,
declared once; `SpawnLimits`, `SpawnRefused`); the seam for a session's servers
(`SessionServers`, `ServerHub`) and the front end's (`SessionClient`: `Permissions`,
`Questions`, `EditorFiles`; `PermissionRequest`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeAlias, TypeVar, overload

import msgspec
import trio

from greenroom.actors.compaction import CompactionPolicy
from greenroom.actors.limits import Limits
from greenroom.actors.prompt import Answer, Prompt
from greenroom.protocol.content import Content
from greenroom.protocol.events import (
    DecisionKind,
    DecisionRequested,
    FileDiff,
    Location,
    MessageSource,
    PermissionDecision,
    Protections,
    StatusName,
    ToolError,
    ToolKind,
)
from greenroom.protocol.mcp import McpServer
from greenroom.protocol.model import THOUGHT_LEVELS, ToolSchema
from greenroom.sandbox import Access, confines, describe
from greenroom.session import Session
from greenroom.session.history import HistoryEntry

#: The permission modes of a session (its ``mode`` setting): id -> (name, what it does),
#: where the kernel gives each mode's sandbox (`mode_descriptions` says what holds).
MODES: Final = {
    "default": ("Ask", "Ask before edits and commands; commands run sandboxed (workspace write)"),
    "accept-edits": (
        "Accept edits",
        "Edit and run commands without asking; commands run sandboxed (workspace write)",
    ),
    "read-only": ("Read only", "Edits refused; commands run without asking, read only, offline"),
    "full-access": ("Full access", "Ask before edits and commands; commands run unsandboxed"),
}
DEFAULT_MODE: Final = "default"
#: The sandbox each mode runs commands in (an escalated command: ``full-access``).
MODE_ACCESS: Final[dict[str, Access]] = {
    "default": "workspace-write",
    "accept-edits": "workspace-write",
    "read-only": "read-only",
    "full-access": "full-access",
}


def mode_descriptions(protections: Protections) -> dict[str, tuple[str, str]]:
    """`MODES` as this kernel has them: a mode whose sandbox does not hold says what it does
    instead (read only refuses commands; the others run them unsandboxed), and each
    sandboxed one what holds (`greenroom.sandbox.describe`)."""
    held = describe(protections)
    described = {}
    for mode, (name, what) in MODES.items():
        access = MODE_ACCESS[mode]
        if access == "full-access":
            described[mode] = (name, what)
        elif not confines(protections, access):
            instead = "commands refused" if access == "read-only" else "commands run unsandboxed"
            described[mode] = (name, f"{what.split(';')[0]}; {instead} (no sandbox here: {held})")
        else:
            described[mode] = (name, f"{what} ({held})")
    return described


#: How a session's title is written (the ``titles`` setting): ``prompt``, the first line of
#: its first prompt (`greenroom.session.session.title_of`); ``model``, that and then, once
#: its first turn has completed, one short call of its own model (`greenroom.actors.titles`).
TITLES: Final = ("prompt", "model")
Titles: TypeAlias = Literal["prompt", "model"]


def check_setting(agent_id: str, key: str, value: str, models: Iterable[str]) -> None:
    """Refuse a setting `Agent.configure` does not know: a `ValueError` naming the key, or
    the value and the known ones. ``mode`` is one of `MODES`, ``model`` one of `models`
    (the agent's), ``thought_level`` one of `THOUGHT_LEVELS`, ``titles`` one of `TITLES`,
    ``instructions`` any non-empty text (the system prompt)."""
    if key == "instructions":
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"agent {agent_id!r}: instructions must be non-empty text")
        return
    known = {"mode": MODES, "model": models, "thought_level": THOUGHT_LEVELS, "titles": TITLES}.get(
        key
    )
    if known is None:
        raise ValueError(
            f"agent {agent_id!r}: unknown setting {key!r}"
            " (known: mode, model, thought_level, titles, instructions)"
        )
    if value not in known:
        raise ValueError(f"agent {agent_id!r}: unknown {key} {value!r} (known: {', '.join(known)})")


T = TypeVar("T")


#: What a guard's check returns: None to pass, a message to trip (or an awaitable of one).
GuardVerdict: TypeAlias = str | Awaitable[str | None] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Guard:
    """Checks that can stop a turn, each a function (sync or async) that returns None to
    pass or a message to trip: `prompt(text)` sees the turn's prompt before its first
    step, `tool_call(name, arguments)` each tool call before permission is asked (its
    arguments the model's JSON text), `answer(text)` the answer before it settles. A
    guard that trips ends the turn ``guarded`` with its message (logged,
    ``guard/tripped``); one that raises ends it ``error`` naming the guard. At least one
    check; anything else is a `TypeError` or `ValueError` naming the field.
    """

    name: str = "guard"
    prompt: Callable[[str], GuardVerdict] | None = None
    tool_call: Callable[[str, str], GuardVerdict] | None = None
    answer: Callable[[str], GuardVerdict] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"Guard.name must be non-empty text, got {self.name!r}")
        checks = {"prompt": self.prompt, "tool_call": self.tool_call, "answer": self.answer}
        for field, check in checks.items():
            if check is not None and not callable(check):
                raise TypeError(
                    f"guard {self.name!r}: {field} must be a function, got {type(check).__name__}"
                )
        if all(check is None for check in checks.values()):
            raise ValueError(
                f"guard {self.name!r} checks nothing: give prompt, tool_call or answer"
            )


class AgentOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent asks its model for and what bounds its runs: the model name and its
    own system prompt; when its history is compacted (`CompactionPolicy`; None: the
    runtime's); the structured output `send` and `run` ask for when they name none
    (`output`); the `Limits` no turn may pass (a call's own limits narrow them); the
    `Guard`s that see its prompts, tool calls and answers; whom its decisions ask when
    its session's front end asks no one (`permissions`: None, the runtime's policy;
    `Defer`, no one: the embedder answers with `decide`), and how many seconds one may
    wait before the turn's prompts are answered ``requires-action`` (`decision_wait`;
    None: they wait as long as the decision does); how its session's title is written
    when its log sets none (`titles`, one of `TITLES`)."""

    model: str | None = None
    system_prompt: str | None = None
    compaction: CompactionPolicy | None = None
    output: type[Any] | None = None
    limits: Limits | None = None
    guards: tuple[Guard, ...] = ()
    permissions: Permissions | None = None
    decision_wait: float | None = None
    titles: Titles = "prompt"


class SpawnLimits(msgspec.Struct, frozen=True, kw_only=True):
    """How far agent teams may grow: how deep children nest (a top-level agent is at
    depth 0), and how many live children one parent may have at once."""

    max_depth: int = 3
    max_children: int = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class SpawnArgs:
    """What `AgentHandle.spawn` was asked for (see there), declared once: the child's
    `AgentSpec` (``spec``, typed loosely here: a spec is made above this module) or its
    ``agent_id``, and its ``session_id``; without a spec, its options, the runtime's tools
    it has (None: all) and its MCP servers."""

    spec: object = None
    agent_id: str | None = None
    session_id: str | None = None
    options: AgentOptions | None = None
    tools: Sequence[str] | None = None
    mcp_servers: Sequence[McpServer] = ()


class SpawnRefused(ValueError):
    """A child could not be spawned: a limit, or a parent that is being disposed."""


class AgentDisposed(RuntimeError):
    """The agent was disposed; it takes no more prompts."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent {agent_id!r} is disposed")
        self.agent_id = agent_id


class Agent(Protocol):
    """A live agent: an inbox in front of a turn driver.

    ``send``/``steer``/``inject``/``cancel`` are synchronous: they change the
    inbox (and the cancel marker) at once, and the agent's task acts on it at
    its next turn-decision point. ``send`` and ``steer`` return the `Prompt`,
    whose await is its `Answer`; ``run`` is both. ``when_idle()`` registers
    its wait at the call, so ``idle = agent.when_idle(); agent.cancel(); ...;
    await idle`` observes exactly what happened after the call.
    """

    @property
    def id(self) -> str: ...

    @property
    def options(self) -> AgentOptions: ...

    @property
    def session(self) -> Session: ...

    @property
    def status(self) -> StatusName: ...

    @property
    def client(self) -> SessionClient | None:
        """The front end its session runs in, if any (a child has its parent's)."""
        ...

    @overload
    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        limits: Limits | None = None,
    ) -> Prompt[Any]: ...

    @overload
    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[T],
        limits: Limits | None = None,
    ) -> Prompt[T]: ...

    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> Prompt[Any]: ...

    def steer(self, content: str, *, source: MessageSource | None = None) -> Prompt[None]: ...

    @overload
    async def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        limits: Limits | None = None,
    ) -> Answer[Any]: ...

    @overload
    async def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[T],
        limits: Limits | None = None,
    ) -> Answer[T]: ...

    async def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> Answer[Any]: ...

    def inject(self, content: str, *, source: MessageSource | None = None) -> str: ...

    def compact(self, instructions: str | None = None) -> None: ...

    def withdraw(self, message_id: str) -> bool: ...

    def cancel(self, reason: str | None = None) -> None: ...

    def configure(self, key: str, value: str) -> None: ...

    def when_idle(self) -> Awaitable[None]: ...

    def history(self) -> list[HistoryEntry]:
        """The session's conversation as typed values (`greenroom.session.history`), read
        off its log now: prompts, replies and thinking, tool calls with their results,
        compactions."""
        ...

    @property
    def decisions(self) -> DecisionDesk:
        """What its turns wait for someone to decide (`greenroom.actors.decisions`)."""
        ...

    def decide(self, decision_id: str, answer: str, by: str = "embedder") -> None:
        """Answer the open decision `decision_id` (the first answer wins); see
        `Decisions.decide`."""
        ...


class DecisionDesk(Protocol):
    """An agent's decisions as the tools see them: the one way a call asks and waits."""

    @property
    def pending(self) -> Sequence[DecisionRequested]: ...

    async def ask(
        self,
        call_id: str,
        kind: DecisionKind,
        asker: Callable[[], Awaitable[str | NamedAnswer]] | None,
        asker_name: str,
        *,
        tool: str = "",
        title: str = "",
        arguments: str = "",
        options: Sequence[str] = (),
        question: str = "",
        choices: Sequence[str] = (),
        free_text: bool = False,
    ) -> tuple[str, str]: ...


class PermissionRequest(msgspec.Struct, frozen=True, gc=False):
    """A tool call that waits for permission: who asks, and what the call would do.
    ``once``: only a once answer can be given (a command asked to run unsandboxed: an
    "always" would cover every later call of the tool, which only its sandbox bounds)."""

    session_id: str
    call_id: str
    tool: str
    kind: ToolKind
    title: str
    arguments: str  # the call's JSON arguments, as the model wrote them
    once: bool = False


class NamedAnswer(msgspec.Struct, frozen=True, gc=False):
    """An answer that names who gave it. What a `Permissions` or `Questions` that asks
    several people returns (a session several ACP clients share), so the log's
    ``decision/made`` names the one who answered rather than the client's `name`."""

    answer: str
    by: str


class Permissions(Protocol):
    """Decides whether a tool call that edits or executes may run: a decision, or an
    `NamedAnswer` naming who decided.

    A cancel of the turn cancels `decide` (it runs in the turn's scope): an
    implementation that asks someone withdraws its question then.
    """

    async def decide(self, request: PermissionRequest) -> PermissionDecision | NamedAnswer: ...


class Question(msgspec.Struct, frozen=True, gc=False):
    """What the ``ask_user`` tool asks: who asks (the session whose client is asked), the
    call, the question, and the answers offered (`choices`; with none, or with
    `free_text`, any text may be the answer)."""

    session_id: str
    call_id: str
    question: str
    choices: list[str] = []
    free_text: bool = True


class AskerGone(Exception):
    """Whoever a decision asked can answer no more (its front end left: an ACP client
    disconnected): the decision waits on, parked, for `decide` or the session's next
    holder, who asks again."""


class Defer:
    """A policy that asks no one: a decision (a permission, a question) waits, parked, for
    the embedder's answer (`Agent.decide`, `Runtime.decide`)."""

    async def decide(self, request: PermissionRequest) -> PermissionDecision:
        raise AssertionError("Defer asks no one: decisions wait for Agent.decide")

    async def ask(self, question: Question) -> str | None:
        raise AssertionError("Defer asks no one: decisions wait for Agent.decide")


class Questions(Protocol):
    """Asks the person at the front end a question; None if they declined to answer (an
    `NamedAnswer` naming who answered: its ``answer`` empty if they declined).

    A cancel of the turn cancels `ask` (it runs in the turn's scope): an
    implementation withdraws its question then.
    """

    async def ask(self, question: Question) -> str | NamedAnswer | None: ...


class EditorFiles(Protocol):
    """The files of the editor a session runs in: unsaved buffers read, edits landed there."""

    async def read_text(self, path: str, line: int | None, limit: int | None) -> str: ...

    async def write_text(self, path: str, content: str) -> None: ...


@dataclass(frozen=True, slots=True)
class SessionClient:
    """What the front end driving a session offers its tools: whom to ask, and its files.

    ``None`` for either means the runtime's default: its permission policy,
    the local disk. ``questions``: whom the ``ask_user`` tool asks (None: no one,
    and the tool is not offered).
    """

    permissions: Permissions | None = None
    files: EditorFiles | None = None
    questions: Questions | None = None
    #: Who answers what it asks, as the log names them (``decision/made``'s ``by``).
    name: str = "client"


class ChildHandle(Protocol):
    """What a spawner hands back: the child agent, and the capability to end it."""

    @property
    def agent(self) -> Agent: ...

    async def dispose(self) -> None: ...


class SpawnChild(Protocol):
    """Start a child of one agent (`AgentHandle.spawn`); see there for the contract."""

    async def __call__(
        self,
        spec: object = None,
        /,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        tools: Sequence[str] | None = None,
        mcp_servers: Sequence[McpServer] = (),
    ) -> ChildHandle: ...


@dataclass(frozen=True, slots=True)
class ToolInvocation:
    """One tool call as the loop executes it.

    ``cancel_scope`` is the turn's scope: `Agent.cancel` cancels it, and with
    it whatever the tool is awaiting. ``agent`` is None for a call made
    outside any agent; ``client`` is its session's front end, if any;
    ``on_start`` is called once the call is allowed, just before it runs;
    ``spawn`` starts a child of the calling agent (None outside an agent);
    ``progress(output, total)`` shows what the running call has written so far (the
    tail of its output, at most `PROGRESS_BYTES`, and how many bytes in all) to the
    session's live readers: never logged, each notice replacing the last (None
    outside an agent).
    """

    call_id: str
    name: str
    arguments: str
    agent: Agent | None
    cancel_scope: trio.CancelScope | None = None
    client: SessionClient | None = None
    on_start: Callable[[], None] | None = None
    spawn: SpawnChild | None = None
    progress: Callable[[str, int], None] | None = None


class ToolOutcome(msgspec.Struct, frozen=True):
    """What a tool call produced; an error is a result for the model, not an exception.

    ``diffs`` are the edits it made, for a reader to show.
    """

    content: str
    is_error: bool = False
    error: ToolError | None = None
    diffs: list[FileDiff] = []

    @classmethod
    def failed(cls, message: str, code: str, name: str = "ToolError") -> ToolOutcome:
        """An error result: `message` for the model; `code` and `name` (the error's kind,
        as `ToolError` has them) for a reader."""
        return cls(message, is_error=True, error=ToolError(name=name, code=code))


class ToolView(msgspec.Struct, frozen=True, gc=False):
    """What a call does: its kind, a short title, the places it touches, whether
    it may run beside the other concurrent calls of its step, whether running
    it twice does what running it once does (a continued turn runs it again), and
    whether it asks to run outside the session's sandbox (``unsandboxed``: always
    asked, never remembered, refused in read only)."""

    kind: ToolKind = "other"
    title: str = ""
    locations: list[Location] = []
    concurrent: bool = False
    idempotent: bool = False
    unsandboxed: bool = False


class ToolExecutor(Protocol):
    """The tool seam the loop calls: the tools it may offer, what a call does, how to run one."""

    def schemas(self) -> list[ToolSchema]: ...

    def describe(self, name: str, arguments: str) -> ToolView: ...

    async def execute(self, invocation: ToolInvocation) -> ToolOutcome: ...


class SessionServers(Protocol):
    """The servers one session owns (its MCP servers), and the tools it runs with them.

    Its `AgentLife` calls `start` before the agent goes live and `stop` after
    the agent's loop has stopped and the session's processes were released,
    on every path. `start` returns once each server is ready or has failed
    its first start (a failure is reported, never raised), or once the wait
    it was opened with is over (the rest go on starting). `stop` stops every
    server within its grace, even when its caller is cancelled.
    """

    @property
    def tools(self) -> ToolExecutor: ...

    async def start(self, agent: Agent) -> None: ...

    async def stop(self) -> None: ...


class ServerHub(Protocol):
    """Makes the `SessionServers` of a session from the specs it was given."""

    def open(
        self,
        session_id: str,
        cwd: str | None,
        servers: Sequence[McpServer],
        tools: ToolExecutor,
        wait: float = math.inf,
    ) -> SessionServers:
        """The session's servers, whose `tools` are theirs and then the agent's `tools`;
        their `start` waits at most `wait` seconds for them."""
        ...
