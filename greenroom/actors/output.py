"""Structured output: a turn asked for a type gives its final answer as a call of a tool.

The model is offered `OUTPUT_TOOL`, whose parameters are the type's JSON
schema, beside the turn's tools (every provider has tools), and the same
schema as `ModelRequest.output`, for an adapter that can ask its provider
for JSON-schema output natively. A step's call of that tool, or the text of
a step that called no tool, is one attempt: it validates as the type, or the
model gets the validation error and one more step; a second invalid attempt
fails the turn, naming what was wrong.

`OutputSpec` is what one type is offered as and validated with, `OutputTurn` judges each
step's attempt, `OutputTools` offers `OUTPUT_TOOL` beside the agent's tools.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import msgspec

from greenroom.actors.prompt import OUTPUT_TOOL
from greenroom.actors.types import ToolExecutor, ToolInvocation, ToolOutcome, ToolView
from greenroom.protocol.model import ToolSchema

#: How many invalid attempts fail the turn.
ATTEMPTS: Final = 2

#: What a step did for the output: gave it, gave an invalid one (another step follows, or
#: the turn fails), or neither (it is still working with tools).
Verdict: TypeAlias = Literal["done", "retry", "failed", "working"]

_VIEW: Final = ToolView(kind="other", title="final answer")
_ACCEPTED: Final = ToolOutcome("The final answer was accepted.")


class OutputSpec:
    """What one output type is offered as and validated with (made once per type)."""

    __slots__ = ("decoder", "name", "schema")

    def __init__(self, name: str, schema: ToolSchema, decoder: msgspec.json.Decoder[Any]) -> None:
        self.name = name
        self.schema = schema
        self.decoder = decoder


def output_spec(kind: type[Any]) -> OutputSpec:
    """The spec of `kind`, made at its first use; `TypeError` naming it unless its JSON
    form is an object (a msgspec Struct, a dataclass, a TypedDict, ...)."""
    spec = _SPECS.get(kind)
    if spec is None:
        spec = _SPECS[kind] = _spec(kind)
    return spec


_SPECS: dict[type[Any], OutputSpec] = {}


def _spec(kind: type[Any]) -> OutputSpec:
    name = getattr(kind, "__name__", repr(kind))
    try:
        schema: dict[str, Any] = msgspec.json.schema(kind)
        decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(kind)
    except TypeError as exc:
        raise TypeError(f"output={name}: not a type msgspec can validate: {exc}") from None
    ref = schema.get("$ref")
    if isinstance(ref, str):  # a named type: its definition, beside every definition it uses
        defs = schema["$defs"]
        schema = {**defs[ref.rsplit("/", 1)[-1]], "$defs": defs}
    if schema.get("type") != "object":
        raise TypeError(
            f"output={name}: a final answer must be a JSON object (a msgspec Struct,"
            f" a dataclass, a TypedDict), but {name} is {schema.get('type', 'not one')!r}"
        )
    description = (
        f"Give your final answer, a {name}, by calling this tool once with the answer as its"
        " arguments. Call it only when you are done; nothing after it is read."
    )
    return OutputSpec(name, ToolSchema(OUTPUT_TOOL, description, schema), decoder)


class OutputTurn:
    """The structured output of one turn: its attempts so far, and the value once one
    validated (``given``). ``error`` is the last attempt's validation error."""

    __slots__ = ("_invalid_call", "error", "failures", "given", "spec", "value")

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec
        self.value: object = None
        self.given = False
        self.failures = 0
        self.error = ""
        self._invalid_call = False  # this step called the tool with an invalid answer

    def take_call(self, arguments: str) -> ToolOutcome:
        """One call of `OUTPUT_TOOL`: its result for the model."""
        if self._take(arguments):
            return _ACCEPTED
        self._invalid_call = True
        return ToolOutcome.failed(
            f"{self.error}. Call {OUTPUT_TOOL} again with a valid answer.",
            "invalid-output",
            "ValidationError",
        )

    def judge(self, called_tools: bool, text: str) -> Verdict:
        """What the step that just ended did for the output (its calls ran already;
        `text` is its assistant text). A step that called no tool gave its text."""
        invalid_call, self._invalid_call = self._invalid_call, False
        if self.given:
            return "done"
        if not invalid_call:
            if called_tools:
                return "working"
            if self._take(_unfenced(text)):
                return "done"
        self.failures += 1
        return "failed" if self.failures >= ATTEMPTS else "retry"

    def feedback(self) -> str:
        """What the model is told after a text answer that did not validate."""
        return f"{self.error}. Give your final answer by calling {OUTPUT_TOOL}."

    def _take(self, text: str) -> bool:
        try:
            self.value = self.spec.decoder.decode(text)
        except msgspec.ValidationError as exc:
            self.error = f"the final answer did not validate as {self.spec.name}: {exc}"
            return False
        except msgspec.DecodeError as exc:
            self.error = f"the final answer is not JSON of a {self.spec.name}: {exc}"
            return False
        except RecursionError:  # past msgspec's depth limit: invalid, like any answer that fails
            self.error = f"the final answer is nested too deep to decode as a {self.spec.name}"
            return False
        self.given = True
        return True


class OutputTools:
    """The tools of a turn asked for an output: the agent's, and `OUTPUT_TOOL` (which takes
    precedence over a tool of the same name)."""

    __slots__ = ("_output", "_tools")

    def __init__(self, tools: ToolExecutor, output: OutputTurn) -> None:
        self._tools = tools
        self._output = output

    @property
    def output(self) -> ToolSchema:
        """The output's schema, for `ModelRequest.output`."""
        return self._output.spec.schema

    def schemas(self) -> list[ToolSchema]:
        return [*self._tools.schemas(), self._output.spec.schema]

    def describe(self, name: str, arguments: str) -> ToolView:
        return _VIEW if name == OUTPUT_TOOL else self._tools.describe(name, arguments)

    async def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        if invocation.name != OUTPUT_TOOL:
            return await self._tools.execute(invocation)
        if invocation.on_start is not None:
            invocation.on_start()
        return self._output.take_call(invocation.arguments)


def _unfenced(text: str) -> str:
    """`text` without a Markdown code fence around it (models often fence their JSON)."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```") and len(body) >= 6:
        body = body[3:-3]
        first, _, rest = body.partition("\n")
        body = rest if first.strip().isalpha() or not first.strip() else body
    return body.strip()
