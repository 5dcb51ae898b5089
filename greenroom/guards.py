"""`Guards`: agents' `Guard` checks, run as handlers of the waterfalls a turn already has.

A guard's checks see the turn's prompt (``agent/request``, before the first
step's model call), each tool call (``tools/execute``, before permission is
asked) and the answer (``agent/step-result``, a step that called no tool,
before its message is logged). A check that trips raises `GuardTrip` out
of the waterfall; the turn driver ends the turn ``guarded`` (a check that
raises: ``error`` naming the guard). Each waterfall's handler is added once,
at the first agent whose guards use it, so a runtime without guards pays
nothing for them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Literal

from greenroom.actors.events import AGENT_REQUEST, AGENT_STEP_RESULT
from greenroom.actors.step import GuardTrip
from greenroom.actors.types import Agent, Guard, ToolInvocation, Verdict
from greenroom.hooks import Hooks
from greenroom.protocol.events import AssistantMessage, TurnStart, UserMessage
from greenroom.protocol.model import ModelRequest
from greenroom.tools.registry import TOOLS_EXECUTE

At = Literal["prompt", "tool_call", "answer"]


class Guards:
    """The runtime's guard handlers (see the module docstring). `watch` is told each
    agent's guards as it starts, and adds what they need."""

    __slots__ = ("_hooks", "_watched")

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._watched: set[At] = set()

    def watch(self, guards: Iterable[Guard]) -> None:
        """Make sure the handlers `guards` need run from now on."""
        for guard in guards:
            if guard.prompt is not None and "prompt" not in self._watched:
                self._watched.add("prompt")
                self._hooks.intercept(AGENT_REQUEST, self._prompt)
            if guard.tool_call is not None and "tool_call" not in self._watched:
                self._watched.add("tool_call")
                self._hooks.intercept(TOOLS_EXECUTE, self._tool_call)
            if guard.answer is not None and "answer" not in self._watched:
                self._watched.add("answer")
                self._hooks.intercept(AGENT_STEP_RESULT, self._answer)

    async def _prompt(
        self, request: ModelRequest, agent: Agent, turn: int, step: int
    ) -> ModelRequest:
        guards = agent.options.guards
        if guards and step == 1:
            text = _turn_prompt(agent)
            for guard in guards:
                if guard.prompt is not None:
                    await _check(guard, "prompt", guard.prompt, text)
        return request

    async def _tool_call(self, invocation: ToolInvocation) -> ToolInvocation:
        agent = invocation.agent
        if agent is not None:
            for guard in agent.options.guards:
                if guard.tool_call is not None:
                    await _check(
                        guard,
                        "tool_call",
                        guard.tool_call,
                        invocation.name,
                        invocation.arguments,
                        call_id=invocation.call_id,
                    )
        return invocation

    async def _answer(
        self, message: AssistantMessage, agent: Agent, turn: int, step: int
    ) -> AssistantMessage:
        if not message.tool_calls:
            for guard in agent.options.guards:
                if guard.answer is not None:
                    await _check(guard, "answer", guard.answer, message.content)
        return message


async def _check(
    guard: Guard,
    at: At,
    check: Callable[..., Verdict],
    *args: str,
    call_id: str | None = None,
) -> None:
    """Run `check`; raise `GuardTrip` when it trips (answers a message) or raises."""
    try:
        verdict = check(*args)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        raise GuardTrip(guard.name, at, message, call_id=call_id, raised=True) from exc
    if verdict is not None:
        raise GuardTrip(guard.name, at, str(verdict), call_id=call_id)


def _turn_prompt(agent: Agent) -> str:
    """The text of the turn's prompts (its ``user/message``s), as one text."""
    events = agent.session.events
    texts: list[str] = []
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if type(event) is TurnStart:
            break
        if type(event) is UserMessage:
            texts.append(event.content)
    return "\n\n".join(reversed(texts))
