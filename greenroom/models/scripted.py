"""`ScriptedModel`: a deterministic model for tests, demos and benchmarks.

Each model call plays the next script (a list of actions); when the scripts
run out it echoes the last user message back word by word. Echoing, a prompt
``bash: COMMAND`` becomes a call of the ``bash`` tool (when it is offered),
and the call's result is echoed back: a way to try tool calls, and the
permission they ask, without a model API. So does ``todo: ENTRIES`` (a JSON
list of plan entries, or the tool's whole arguments) for the ``todo`` tool,
``ask: QUESTION | CHOICE | ...`` for ``ask_user`` (no choices: free text),
and ``tool: NAME {JSON}`` for any offered tool. Delays are `trio.sleep`s, so under
a `MockClock` they cost no real time.

A script's actions: `Say`, `Think`, `CallTool`, `Tokens` (a usage with cache and reasoning
counts), `Wait`, `Fail`, `Hang`, `End`. The echo stops at a request's
``max_output_tokens`` words. `play` turns a script into a reply (also
`greenroom.testing.FunctionModel`'s).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Final, TypeAlias

import msgspec
import trio

from greenroom.models.base import ModelError
from greenroom.protocol.model import (
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    ToolTurn,
    Usage,
    UserTurn,
)


class Say(msgspec.Struct, frozen=True):
    """Stream ``text`` as one text delta."""

    text: str


class Think(msgspec.Struct, frozen=True):
    """Stream ``text`` as one reasoning delta."""

    text: str


class CallTool(msgspec.Struct, frozen=True):
    """Call a tool; ``arguments`` is JSON text or a dict to encode."""

    name: str
    arguments: str | dict[str, object] = "{}"
    call_id: str | None = None


class Wait(msgspec.Struct, frozen=True):
    """Sleep ``seconds`` (virtual under a MockClock)."""

    seconds: float


class Fail(msgspec.Struct, frozen=True):
    """Raise `ModelError(message)`."""

    message: str


class Hang(msgspec.Struct, frozen=True):
    """Stream nothing more until cancelled."""


class Tokens(msgspec.Struct, frozen=True):
    """Report the reply's usage (as a provider's usage event): `input` and `output` tokens,
    of the input `cache_read` read from the prompt cache and `cache_write` written to it,
    of the output `reasoning` spent thinking."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0


class End(msgspec.Struct, frozen=True):
    """Finish with ``reason`` now (without it, a script finishes ``tool-calls`` or ``stop``)."""

    reason: FinishReason = "stop"
    message: str | None = None


KEPT_REQUESTS: Final = 64

Action: TypeAlias = Say | Think | CallTool | Tokens | Wait | Fail | Hang | End


#: An echoed prompt that starts with this runs the rest as a ``bash`` command.
BASH_PROMPT: Final = "bash: "
#: An echoed prompt ``tool: NAME {JSON}`` calls the offered tool NAME with those arguments.
TOOL_PROMPT: Final = "tool: "
#: An echoed prompt ``todo: [ENTRIES]`` (JSON) sets the plan through the ``todo`` tool.
TODO_PROMPT: Final = "todo: "
#: An echoed prompt ``ask: QUESTION | CHOICE | ...`` asks it through ``ask_user``.
ASK_PROMPT: Final = "ask: "


class ScriptedModel:
    """Plays `scripts` one per model call, then echoes with ``delay`` seconds per word.

    ``requests`` keeps the last `KEPT_REQUESTS` requests received, for tests
    to inspect (bounded: the scripted model is also the demo's long-running default).
    An echo stops after a request's ``max_output_tokens`` words (a word counted as a
    token) and finishes ``max-tokens``; a script plays as written.
    """

    def __init__(self, scripts: Iterable[Sequence[Action]] = (), *, delay: float = 0.02) -> None:
        if delay < 0:
            raise ValueError(f"ScriptedModel delay must be >= 0 seconds, got {delay!r}")
        self._scripts: deque[Sequence[Action]] = deque(scripts)
        self._delay = delay
        self._calls = 0
        self.requests: deque[ModelRequest] = deque(maxlen=KEPT_REQUESTS)

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        if self._scripts:
            return self._play(self._scripts.popleft())
        return self._echo(request)

    def _play(self, script: Sequence[Action]) -> AsyncIterator[StreamChunk]:
        return play(script, self._call_id)

    def _call_id(self) -> str:
        self._calls += 1
        return f"call-{self._calls}"

    def _echo(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        messages = request.messages
        last = messages[-1] if len(messages) else None
        if type(last) is UserTurn:
            call = _asked_call(last, request) if last.content.startswith(_ASKING) else None
            if call is not None:
                self._calls += 1
                return _Echo([ToolCallChunk(f"echo-{self._calls}", *call), _CALLED], 0)
            prompt = last.content
        elif type(last) is ToolTurn:
            prompt = last.content
        else:
            prompt = next((m.content for m in reversed(messages) if type(m) is UserTurn), "")
        words = prompt.split(" ")
        finish = _STOPPED
        limit = request.max_output_tokens
        if limit is not None and len(words) > limit:  # a word a token: cut as a provider cuts
            words, finish = words[: max(limit, 1)], _LIMITED
        chunks: list[StreamChunk] = [TextDelta(word + " ") for word in words[:-1]]
        chunks += (TextDelta(words[-1]), finish)
        return _Echo(chunks, self._delay)


async def play(script: Sequence[Action], call_id: Callable[[], str]) -> AsyncIterator[StreamChunk]:
    """`script` as a model's reply: each action in order (a `CallTool` without an id gets
    ``call_id()``), then a `Finish` (``tool-calls`` if it called one, else ``stop``) unless
    an `End` finished it."""
    called = False
    for action in script:
        match action:
            case Say(text=text):
                yield TextDelta(text)
            case Think(text=text):
                yield ReasoningDelta(text)
            case CallTool(name=name, arguments=arguments, call_id=given):
                called = True
                yield ToolCallChunk(
                    call_id=given or call_id(),
                    name=name,
                    arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                )
            case Tokens():
                yield Usage(
                    action.input,
                    action.output,
                    action.cache_read,
                    action.cache_write,
                    action.reasoning,
                )
            case Wait(seconds=seconds):
                await trio.sleep(seconds)
            case Fail(message=message):
                raise ModelError(message)
            case Hang():
                await trio.sleep_forever()
            case End(reason=reason, message=message):
                yield Finish(reason, message)
                return
    yield Finish("tool-calls" if called else "stop")


#: The prompts `_asked_call` reads; any other is echoed without a look at the tools.
_ASKING: Final = (BASH_PROMPT, TOOL_PROMPT, TODO_PROMPT, ASK_PROMPT)
_CALLED: Final = Finish("tool-calls")
_STOPPED: Final = Finish("stop")
_LIMITED: Final = Finish("max-tokens")


class _Echo:
    """The echo's reply: its chunks, each text delta after ``delay`` seconds.

    An async iterator rather than an async generator: a generator is registered with
    Trio's generator hooks at its first step and again when collected, which cost the
    echo more than its words did.
    """

    __slots__ = ("_chunks", "_delay", "_next")

    def __init__(self, chunks: list[StreamChunk], delay: float) -> None:
        self._chunks = chunks
        self._delay = delay
        self._next = 0

    def __aiter__(self) -> _Echo:
        return self

    async def __anext__(self) -> StreamChunk:
        index = self._next
        if index == len(self._chunks):
            raise StopAsyncIteration
        self._next = index + 1
        chunk = self._chunks[index]
        if self._delay and type(chunk) is TextDelta:
            await trio.sleep(self._delay)
        return chunk


def _asked_call(last: UserTurn, request: ModelRequest) -> tuple[str, str] | None:
    """The (tool, arguments) a ``bash:`` or ``tool:`` prompt asks for, if that tool is offered."""
    offered = {tool.name for tool in request.tools}
    if last.content.startswith(BASH_PROMPT) and "bash" in offered:
        command = last.content.removeprefix(BASH_PROMPT)
        return "bash", json.dumps({"command": command, "description": "asked by the prompt"})
    if last.content.startswith(TODO_PROMPT) and "todo" in offered:
        entries = last.content.removeprefix(TODO_PROMPT).strip()
        return "todo", f'{{"entries": {entries}}}' if entries.startswith("[") else entries
    if last.content.startswith(ASK_PROMPT) and "ask_user" in offered:
        question, *choices = (p.strip() for p in last.content.removeprefix(ASK_PROMPT).split("|"))
        return "ask_user", json.dumps({"question": question, "choices": choices})
    if last.content.startswith(TOOL_PROMPT):
        name, _, arguments = last.content.removeprefix(TOOL_PROMPT).partition(" ")
        if name in offered:
            return name, arguments.strip() or "{}"
    return None
