"""`Inbox`: the queued FIFO, the steering FIFO, and the agent task's wake-up."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

import trio

from greenroom.actors.prompt import Prompt
from greenroom.parking import Parking


class Inbox:
    """Two FIFOs and one parked reader.

    The agent's own task is the only reader: it parks in `wait` until a
    prompt is queued, a flush is requested or the inbox is closed (the
    agent is stopping). The steering FIFO drains whole;
    the queued FIFO drains its leading run of prompts that ask for the same
    output (a synchronous burst becomes one turn; prompts asking for
    different outputs never share one). Writers never block and never
    checkpoint.

    An empty FIFO is None, not a list: an idle agent holds neither.
    """

    __slots__ = ("_queued", "_reader", "_steering", "closed", "flush_requested")

    def __init__(self) -> None:
        self._queued: list[Prompt[Any]] | None = None
        self._steering: list[Prompt[Any]] | None = None
        self._reader = Parking()
        self.flush_requested = False
        self.closed = False

    @property
    def queued(self) -> int:
        return len(self._queued or ())

    @property
    def steering(self) -> int:
        return len(self._steering or ())

    def push(self, prompt: Prompt[Any]) -> None:
        if self._queued is None:
            self._queued = [prompt]
        else:
            self._queued.append(prompt)
        self._wake()

    def push_steering(self, prompt: Prompt[Any]) -> None:
        if self._steering is None:
            self._steering = [prompt]
        else:
            self._steering.append(prompt)

    def request_flush(self) -> None:
        self.flush_requested = True
        self._wake()

    def close(self) -> None:
        """Wake the reader for good: every `wait` from now on returns at once. Idempotent."""
        self.closed = True
        self._wake()

    def withdraw(self, message_id: str) -> Prompt[Any] | None:
        """Take a prompt back out of the queued FIFO; None if it is not there (any more)."""
        queued = self._queued or []
        for index, prompt in enumerate(queued):
            if prompt.id == message_id:
                del queued[index]
                return prompt
        return None

    def remove(self, prompt: Prompt[Any]) -> bool:
        """Take `prompt` out of whichever FIFO holds it; False if neither does (any more)."""
        for fifo in (self._queued or [], self._steering or []):
            for index, held in enumerate(fifo):
                if held is prompt:
                    del fifo[index]
                    return True
        return False

    def drain(self) -> list[Prompt[Any]]:
        """The next turn's prompts: the leading run of those asking for the same output."""
        queued = self._queued
        if not queued:
            return []
        output = queued[0].output
        end = 1
        while end < len(queued) and queued[end].output is output:
            end += 1
        if end >= len(queued):
            self._queued = None
            return queued
        drained, self._queued = queued[:end], queued[end:]
        return drained

    def drain_steering(self) -> Sequence[Prompt[Any]]:
        """The steering FIFO, emptied (an empty tuple when it was: a step that was not
        steered allocates nothing here)."""
        drained = self._steering
        if not drained:
            return ()
        self._steering = None
        return drained

    def requeue_steering(self) -> None:
        """Steering left when a turn ends leads the queued work of the next turn."""
        steering = self._steering
        if steering:
            self._steering = None
            self._queued = steering + (self._queued or [])

    def clear(self) -> list[Prompt[Any]]:
        """Empty both FIFOs; what they held, steering first."""
        cleared = (self._steering or []) + (self._queued or [])
        self._queued = self._steering = None
        return cleared

    def wait(self) -> Awaitable[None]:
        """Awaited, returns once something is queued, a flush requested or the inbox
        closed. Always checkpoints. Only the agent's own task may await it, at once.

        It hands back Trio's own awaitable instead of being a coroutine, so that a
        parked agent holds one frame less (~200 B each).
        """
        if self._queued or self.flush_requested or self.closed:
            return trio.lowlevel.checkpoint()  # noqa: ASYNC105 (the caller awaits it)
        return self._reader.park()

    def _wake(self) -> None:
        self._reader.wake()
