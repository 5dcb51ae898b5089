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

from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from greenroom.actors.events import AGENT_REQUEST, AGENT_STEP_RESULT
from greenroom.actors.step import GuardTrip
from greenroom.actors.types import Agent, Guard, GuardVerdict, ToolInvocation
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
            events = agent.session.events  # the turn's prompts: its user/messages
            texts: list[str] = []
            for index in range(len(events) - 1, -1, -1):
                event = events[index]
                if type(event) is TurnStart:
                    break
                if type(event) is UserMessage:
                    texts.append(event.content)
            text = "\n\n".join(reversed(texts))
            for guard in guards:
                check = guard.prompt
                if check is not None:  # the sync path inline: a turn's cost is in calls
                    try:
                        verdict = check(text)
                    except Exception as exc:
                        raise _raised(guard, "prompt", exc, None) from exc
                    if verdict is not None and (waiting := _judged(guard, "prompt", verdict)):
                        await waiting
        return request

    async def _tool_call(self, invocation: ToolInvocation) -> ToolInvocation:
        agent = invocation.agent
        if agent is not None:
            for guard in agent.options.guards:
                if guard.tool_call is not None:
                    waiting = _check(
                        guard,
                        "tool_call",
                        guard.tool_call,
                        invocation.name,
                        invocation.arguments,
                        call_id=invocation.call_id,
                    )
                    if waiting is not None:
                        await waiting
        return invocation

    async def _answer(
        self, message: AssistantMessage, agent: Agent, turn: int, step: int
    ) -> AssistantMessage:
        if not message.tool_calls:
            for guard in agent.options.guards:
                if guard.answer is not None:
                    waiting = _check(guard, "answer", guard.answer, message.content)
                    if waiting is not None:
                        await waiting
        return message


def _check(
    guard: Guard,
    at: At,
    check: Callable[..., GuardVerdict],
    *args: str,
    call_id: str | None = None,
) -> Awaitable[None] | None:
    """Run `check`; raise `GuardTrip` when it trips (answers a message) or raises. A sync
    check answers at once (None: it passed); an async one is awaited by the caller, in
    what this returns."""
    try:
        verdict = check(*args)
    except Exception as exc:
        raise _raised(guard, at, exc, call_id) from exc
    return None if verdict is None else _judged(guard, at, verdict, call_id)


def _judged(
    guard: Guard, at: At, verdict: str | Awaitable[str | None], call_id: str | None = None
) -> Awaitable[None]:
    """A check's verdict that is not a pass: a message trips (`GuardTrip`, raised now), an
    awaitable is returned to be awaited (it raises when its answer trips)."""
    if isinstance(verdict, str):
        raise GuardTrip(guard.name, at, verdict, call_id=call_id)
    return _awaited(guard, at, verdict, call_id)


async def _awaited(
    guard: Guard, at: At, verdict: Awaitable[str | None], call_id: str | None
) -> None:
    try:
        answer = await verdict
    except Exception as exc:
        raise _raised(guard, at, exc, call_id) from exc
    if answer is not None:
        raise GuardTrip(guard.name, at, str(answer), call_id=call_id)


def _raised(guard: Guard, at: At, exc: Exception, call_id: str | None) -> GuardTrip:
    message = f"{type(exc).__name__}: {exc}"
    return GuardTrip(guard.name, at, message, call_id=call_id, raised=True)
