"""The bash executor seam: what a tool asks for, what it gets, and the executor protocol.

The executor stores an optional opaque ``owner`` token on each background
task and hands it back through `BashExecutor.owner_of`; it never interprets
it. The access policy (compare the caller's token) lives in the tools that
consume the seam. Keeping the token on the executor is what keeps ownership
across a reload of those tools.

A request (`BashExecRequest`) is resolved into a spec that names its ``sandbox``;
`BashExecutor.run(spec, progress)` runs it in the caller's task, `start` as a background
task; `end_session` lets go of what a session's sandbox made once its tasks are released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal, Protocol, TypeAlias

import msgspec

from greenroom.hooks import Disposers
from greenroom.sandbox import Sandbox, Sandboxes

DEFAULT_TIMEOUT_MS: Final = 120_000
MAX_TIMEOUT_MS: Final = 600_000
TAIL_BYTES: Final = 64_000

TaskStatus: TypeAlias = Literal["running", "completed", "killed"]


class BashExecRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A command to run; ``sandbox``: how it is confined (None: not at all, and not
    contained in a cgroup either: the executor used on its own)."""

    command: str
    workdir: str | None = None
    timeout_ms: int | None = None
    owner: str | None = None
    sandbox: Sandbox | None = None


class BashExecSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A request resolved: an absolute existing workdir, a bounded timeout. A background
    task keeps its sandbox for its life (a mode changed since applies to new commands)."""

    command: str
    workdir: str
    timeout_ms: int
    owner: str | None = None
    sandbox: Sandbox | None = None


class StreamOutput(msgspec.Struct, frozen=True):
    """One stream's retained text; ``truncated`` when more was written than the tail keeps;
    ``dropped``: the bytes past the spill file's cap (counted, kept nowhere)."""

    text: str
    truncated: bool = False
    spill_path: str | None = None
    dropped: int = 0


class BashRunResult(msgspec.Struct, frozen=True, kw_only=True):
    """A finished foreground command. A non-zero exit is a result, not an error."""

    exit_code: int | None
    signal: str | None
    timed_out: bool
    timeout_ms: int
    stdout: StreamOutput
    stderr: StreamOutput


class BashTask(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a background task (the owner token is not on it: see `owner_of`)."""

    id: str
    command: str
    status: TaskStatus
    exit_code: int | None = None
    signal: str | None = None


class BashOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What `read_output` returns: the output since the previous read."""

    task: BashTask
    delta: str
    lossy: bool
    stdout_spill_path: str | None = None
    stderr_spill_path: str | None = None
    dropped: int = 0  # bytes of both streams past their spill files' cap, kept nowhere


TaskDoneListener = Callable[[BashTask], object]

#: Seconds between two progress notices of one running command, at least.
PROGRESS_INTERVAL: Final = 0.1

#: What `BashExecutor.run` tells while a command runs: ``(output, total)``, the last
#: `PROGRESS_BYTES` of its stdout and stderr as they arrived, and the bytes of both so far.
OutputProgress = Callable[[str, int], None]


class UnknownTask(KeyError):
    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id

    def __str__(self) -> str:
        return f"unknown background task {self.task_id!r}"


class BashExecutor(Protocol):
    """Runs commands: `run` in the caller's task, `start` as a background task with an id.

    Every method but `run`, `start` and `wait` is synchronous and never
    checkpoints. An unknown task id raises `UnknownTask` (``get`` and
    ``owner_of`` return None instead). ``default_workdir``: where a request
    without a workdir runs.
    """

    default_workdir: str

    def resolve(self, request: BashExecRequest) -> BashExecSpec: ...

    async def run(
        self, spec: BashExecSpec, progress: OutputProgress | None = None
    ) -> BashRunResult:
        """Run `spec` in the caller's task. With `progress`, call it with the output so far
        at most every `PROGRESS_INTERVAL` seconds while the command runs, and only when
        there is new output; never after `run` returns. It must not block or raise."""
        ...

    async def start(self, spec: BashExecSpec) -> BashTask: ...

    def owner_of(self, task_id: str) -> str | None: ...

    def read_output(self, task_id: str) -> BashOutput: ...

    def kill(self, task_id: str) -> bool:
        """Stop a running task's process group; False if it had already finished."""
        ...

    async def wait(self, task_id: str) -> BashTask:
        """Wait until the task has ended and been reaped; its final snapshot."""
        ...

    def forget(self, task_id: str) -> None:
        """Drop a finished task's record (and its spill files); a no-op while it runs."""
        ...

    def get(self, task_id: str) -> BashTask | None: ...

    def list(self) -> list[BashTask]: ...

    def on_task_done(
        self, listener: TaskDoneListener, *, scope: Disposers | None = None
    ) -> Callable[[], None]: ...

    @property
    def sandboxes(self) -> Sandboxes:
        """Where its commands are confined, and what the kernel enforces there."""
        ...

    async def end_session(self, session: str) -> None:
        """`session` ended (its tasks were released): the places its sandbox made for it
        (temporary directory, cgroups) go once its last process has."""
        ...
