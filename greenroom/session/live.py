"""`LiveCalls`: what the running tool calls of one session have shown so far.

Transient by design: a call's progress is a snapshot (`ToolProgress`: the
tail of its output), so the latest one stands for every earlier one and the
call's ``tool/result`` for all of them. Nothing here is logged or replayed.
"""

from __future__ import annotations

from greenroom.protocol.events import ToolProgress


class LiveCalls:
    """The latest `ToolProgress` of each running call, each with a version (a counter of
    this session's notices), so a reader can ask for what it has not seen yet.

    Bounded by the calls running at once: a new notice of a call replaces its
    last, and a call's entry goes when its ``tool/result`` is logged.
    """

    __slots__ = ("_latest", "_version")

    def __init__(self) -> None:
        self._latest: dict[str, tuple[int, ToolProgress]] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """The version of the latest notice so far (0 before any)."""
        return self._version

    def publish(self, progress: ToolProgress) -> None:
        self._version += 1
        self._latest[progress.call_id] = (self._version, progress)

    def end(self, call_id: str) -> None:
        self._latest.pop(call_id, None)

    def after(self, version: int) -> tuple[int, ToolProgress] | None:
        """The oldest notice still held that is newer than `version`, with its version."""
        found: tuple[int, ToolProgress] | None = None
        for entry in self._latest.values():
            if entry[0] > version and (found is None or entry[0] < found[0]):
                found = entry
        return found
