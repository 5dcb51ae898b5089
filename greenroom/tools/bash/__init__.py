"""Bash: the executor seam, the local executor, and the tools over it."""

from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.seam import (
    BashExecRequest,
    BashExecSpec,
    BashExecutor,
    BashOutput,
    BashRunResult,
    BashTask,
    StreamOutput,
    UnknownTask,
)

__all__ = [
    "BashExecRequest",
    "BashExecSpec",
    "BashExecutor",
    "BashOutput",
    "BashRunResult",
    "BashTask",
    "LocalBashExecutor",
    "StreamOutput",
    "UnknownTask",
]
