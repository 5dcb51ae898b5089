"""Commands confined and contained by the kernel: `Sandboxes`, `Sandbox`, `SandboxSettings`."""

from greenroom.sandbox.sandboxes import (
    ACCESSES,
    Access,
    Child,
    Sandbox,
    Sandboxes,
    SandboxSettings,
    confines,
    describe,
    launching,
)

__all__ = [
    "ACCESSES",
    "Access",
    "Child",
    "Sandbox",
    "SandboxSettings",
    "Sandboxes",
    "confines",
    "describe",
    "launching",
]
