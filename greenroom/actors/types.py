"""The agent interface every plugin programs against, and the tool seam the loop calls.

Nothing here depends on the loop: the loop is one implementation of `Agent`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

import msgspec
import trio

from greenroom.protocol.events import MessageSource, StatusName, ToolError
from greenroom.protocol.model import ToolSchema
from greenroom.session import Session


class AgentOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent asks its model for: the model name and its own system prompt."""

    model: str | None = None
    system_prompt: str | None = None


class AgentDisposed(RuntimeError):
    """The agent was disposed; it takes no more prompts."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent {agent_id!r} is disposed")
        self.agent_id = agent_id


class Agent(Protocol):
    """A live agent: an inbox in front of a turn driver.

    ``send``/``steer``/``inject``/``cancel`` are synchronous: they change the
    inbox (and the cancel marker) at once, and the agent's task acts on it at
    its next turn-decision point. ``when_idle()`` registers its wait at the
    call, so ``idle = agent.when_idle(); agent.cancel(); ...; await idle``
    observes exactly what happened after the call.
    """

    @property
    def id(self) -> str: ...

    @property
    def options(self) -> AgentOptions: ...

    @property
    def session(self) -> Session: ...

    @property
    def status(self) -> StatusName: ...

    def send(self, content: str, *, source: MessageSource | None = None) -> str: ...

    def steer(self, content: str, *, source: MessageSource | None = None) -> str: ...

    def inject(self, content: str, *, source: MessageSource | None = None) -> str: ...

    def cancel(self, reason: str | None = None) -> None: ...

    def when_idle(self) -> Awaitable[None]: ...


@dataclass(frozen=True, slots=True)
class ToolInvocation:
    """One tool call as the loop executes it.

    ``cancel_scope`` is the turn's scope: `Agent.cancel` cancels it, and with
    it whatever the tool is awaiting. ``agent`` is None for a call made
    outside any agent.
    """

    call_id: str
    name: str
    arguments: str
    agent: Agent | None
    cancel_scope: trio.CancelScope | None = None


class ToolOutcome(msgspec.Struct, frozen=True):
    """What a tool call produced; an error is a result for the model, not an exception."""

    content: str
    is_error: bool = False
    error: ToolError | None = None


class ToolExecutor(Protocol):
    """The tool seam the loop calls: the tools it may offer, and how to run one."""

    def schemas(self) -> list[ToolSchema]: ...

    async def execute(self, invocation: ToolInvocation) -> ToolOutcome: ...
