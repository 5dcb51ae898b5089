"""`Inbox`: the queued FIFO, the steering FIFO, and the agent task's wake-up."""

from __future__ import annotations

import itertools
import secrets
from typing import NamedTuple

import trio

from greenroom.protocol.events import MessageSource

_PROCESS = secrets.token_hex(4)
_counter = itertools.count(1)


def new_message_id() -> str:
    """A message id unique across processes (with overwhelming probability)."""
    return f"msg-{_PROCESS}-{next(_counter)}"


class Prompt(NamedTuple):
    content: str
    source: MessageSource
    message_id: str


class Inbox:
    """Two FIFOs and one parked reader.

    The agent's own task is the only reader: it parks in `wait` until a
    prompt is queued or a flush is requested. Both FIFOs drain whole (a
    synchronous burst becomes one turn). Writers never block and never
    checkpoint.
    """

    __slots__ = ("_parked", "_queued", "_steering", "flush_requested")

    def __init__(self) -> None:
        self._queued: list[Prompt] = []
        self._steering: list[Prompt] = []
        self._parked: trio.lowlevel.Task | None = None
        self.flush_requested = False

    @property
    def queued(self) -> int:
        return len(self._queued)

    @property
    def steering(self) -> int:
        return len(self._steering)

    def push(self, prompt: Prompt) -> None:
        self._queued.append(prompt)
        self._wake()

    def push_steering(self, prompt: Prompt) -> None:
        self._steering.append(prompt)

    def request_flush(self) -> None:
        self.flush_requested = True
        self._wake()

    def withdraw(self, message_id: str) -> bool:
        """Take a prompt back out of the queued FIFO; False if it is not there (any more)."""
        for index, prompt in enumerate(self._queued):
            if prompt.message_id == message_id:
                del self._queued[index]
                return True
        return False

    def drain(self) -> list[Prompt]:
        drained, self._queued = self._queued, []
        return drained

    def drain_steering(self) -> list[Prompt]:
        drained, self._steering = self._steering, []
        return drained

    def requeue_steering(self) -> None:
        """Steering left when a turn ends leads the queued work of the next turn."""
        if self._steering:
            self._queued[:0] = self.drain_steering()

    def clear(self) -> None:
        self._queued.clear()
        self._steering.clear()

    async def wait(self) -> None:
        """Return once something is queued or a flush requested. Always checkpoints."""
        if self._queued or self.flush_requested:
            await trio.lowlevel.checkpoint()
            return
        self._parked = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, raise_cancel: object) -> trio.lowlevel.Abort:
        self._parked = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _wake(self) -> None:
        task, self._parked = self._parked, None
        if task is not None:
            trio.lowlevel.reschedule(task)
