"""Models for testing agents without a network: `TestModel` and `FunctionModel`.

`TestModel`: each turn's first step calls every offered tool (or those of ``call_tools``)
once, with arguments made for its schema, then ``final_answer`` with a value for the
output's schema, or text (the turn's tool results as JSON by name); a word a token of
usage. `FunctionModel(fn)`: its function's reply, text or `greenroom.models` actions.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal, TypeAlias, cast

from greenroom.actors.prompt import OUTPUT_TOOL
from greenroom.models.base import ModelError
from greenroom.models.scripted import Action, CallTool, Say, Tokens, play
from greenroom.protocol.model import (
    AssistantTurn,
    ModelRequest,
    StreamChunk,
    ToolSchema,
    ToolTurn,
    UserTurn,
)
from greenroom.testing.values import SchemaError, value_for

#: What a `FunctionModel`'s function returns: the reply's text, or its actions in order
#: (`Say`, `Think`, `CallTool`, `Tokens`, `Wait`, `Fail`, `Hang`, `End` of
#: `greenroom.models`).
Reply: TypeAlias = str | Sequence[Action]


class TestModel:
    """A model that exercises an agent's tools and output, deterministically.

    At the first step of each turn (the first request after a prompt) it calls each tool
    the request offers, once (or only those named in `call_tools`, in that order), with
    arguments made for the tool's own schema (`greenroom.testing.values.value_for`, seeded
    by `seed` and the tool's name). At the next step it answers: with a turn asking for a
    structured output, a call of ``final_answer`` whose arguments are `output` (default: a
    value made for the output's schema); else `text` (default: the JSON of the turn's tool
    results by tool name, as pydantic-ai's ``TestModel`` answers, or ``"success (no tool
    calls)"``), streamed word by word. Every reply reports its usage, a word a token (the
    request's words in, the reply's out), so token `Limits` can be tested.

    A tool named in `call_tools` that the request does not offer, or a schema no value can
    be made for, fails the step with a `ModelError` naming it. ``requests`` keeps every
    request, in order. The same agent, seed and prompts make the same calls and answers.
    """

    __test__ = False  # not a test class, for pytest's collection

    def __init__(
        self,
        *,
        call_tools: Sequence[str] | Literal["all"] = "all",
        text: str | None = None,
        output: object = None,
        seed: int = 0,
    ) -> None:
        if isinstance(call_tools, str) and call_tools != "all":
            raise TypeError(
                f"TestModel call_tools must be 'all' or a list of names, got {call_tools!r}"
            )
        self.call_tools = call_tools
        self.text = text
        self.output = output
        self.seed = seed
        self.requests: list[ModelRequest] = []
        self._calls = 0

    def __repr__(self) -> str:
        return f"TestModel(call_tools={self.call_tools!r}, seed={self.seed})"

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        try:
            actions = self._reply(request)
        except (SchemaError, LookupError) as exc:
            return _failed(f"TestModel: {exc}")
        return play([*actions, _usage(request, actions)], self._call_id)

    def _reply(self, request: ModelRequest) -> Sequence[Action]:
        turn = _this_turn(request.messages)
        if not any(type(message) is AssistantTurn for message in turn):
            calls = [self._call(tool) for tool in self._to_call(request)]
            if calls:
                return calls
        if request.output is not None:
            arguments = self.output
            if arguments is None:
                arguments = value_for(request.output.parameters, f"{self.seed}:{OUTPUT_TOOL}")
            return [CallTool(OUTPUT_TOOL, json.dumps(arguments))]
        text = self.text if self.text is not None else _results_text(turn)
        words = text.split(" ")
        return [Say(word + " ") for word in words[:-1]] + [Say(words[-1])]

    def _to_call(self, request: ModelRequest) -> list[ToolSchema]:
        offered = {tool.name: tool for tool in request.tools if tool.name != OUTPUT_TOOL}
        if self.call_tools == "all":
            return list(offered.values())
        missing = [name for name in self.call_tools if name not in offered]
        if missing:
            raise LookupError(
                f"call_tools names {missing}, which the request does not offer"
                f" (it offers {sorted(offered)})"
            )
        return [offered[name] for name in self.call_tools]

    def _call(self, tool: ToolSchema) -> CallTool:
        try:
            arguments = value_for(tool.parameters, f"{self.seed}:{tool.name}")
        except SchemaError as exc:
            raise SchemaError(f"tool {tool.name!r}: {exc}") from None
        return CallTool(tool.name, json.dumps(arguments))

    def _call_id(self) -> str:
        self._calls += 1
        return f"test-{self._calls}"


class FunctionModel:
    """A model whose every reply is `fn`'s: ``fn(request)``, sync or async, sees the whole
    `ModelRequest` (``messages``, ``tools``, ``system``, ``output``) and returns the reply
    (`Reply`: its text, or its actions). What `fn` raises fails the step, as a provider's
    error does (a `ModelError` keeps its message). ``requests`` keeps every request."""

    def __init__(self, fn: Callable[[ModelRequest], Reply | Awaitable[Reply]]) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionModel takes a function, got {type(fn).__name__}")
        self.fn = fn
        self.requests: list[ModelRequest] = []
        self._calls = 0

    def __repr__(self) -> str:
        return f"FunctionModel({getattr(self.fn, '__qualname__', self.fn)!r})"

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        return self._reply(request)

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        reply = self.fn(request)
        if inspect.isawaitable(reply):
            reply = await reply
        actions: Sequence[Action]
        if isinstance(reply, str):
            actions = [Say(reply)]
        elif isinstance(reply, Sequence):
            actions = cast(Sequence[Action], reply)  # (a str is one too, and was taken above)
        else:
            raise ModelError(
                f"FunctionModel: {self!r} returned {type(reply).__name__}, not text or a list"
                " of actions"
            )
        async for chunk in play(actions, self._call_id):
            yield chunk

    def _call_id(self) -> str:
        self._calls += 1
        return f"fn-{self._calls}"


def _this_turn(messages: Sequence[object]) -> Sequence[object]:
    """The messages since the latest prompt (the turn's: its steps' replies and results)."""
    for index in range(len(messages) - 1, -1, -1):
        if type(messages[index]) is UserTurn:
            return messages[index + 1 :]
    return messages


def _results_text(turn: Sequence[object]) -> str:
    """The turn's tool results as JSON by tool name (pydantic-ai's TestModel's answer)."""
    names = {
        call.call_id: call.name
        for message in turn
        if type(message) is AssistantTurn
        for call in message.tool_calls
    }
    results = {
        names.get(message.call_id, message.call_id): message.content
        for message in turn
        if type(message) is ToolTurn
    }
    return json.dumps(results) if results else "success (no tool calls)"


def _usage(request: ModelRequest, actions: Sequence[Action]) -> Tokens:
    words_in = sum(len(_text_of(m).split()) for m in request.messages)
    words_out = sum(
        len(a.text.split()) if isinstance(a, Say) else len(str(a.arguments).split())
        for a in actions
        if isinstance(a, Say | CallTool)
    )
    return Tokens(input=words_in, output=words_out)


def _text_of(message: object) -> str:
    if isinstance(message, UserTurn | AssistantTurn | ToolTurn):
        return message.content
    return ""


async def _failed(message: str) -> AsyncIterator[StreamChunk]:
    raise ModelError(message)
    yield  # pragma: no cover  (an async generator: the step fails at its first chunk)
