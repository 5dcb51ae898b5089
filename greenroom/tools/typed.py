"""`@tool`: a typed Python function as a `Tool`, its arguments read off its signature.

The arguments Struct is built once, when the function is decorated
(``msgspec.defstruct``): one field per parameter, of its annotation, with its
default. A parameter is described by ``Annotated[T, "text"]`` (or
``Annotated[T, msgspec.Meta(description="text")]``), else by its entry in the
docstring's ``Args:`` (Google) or ``Parameters`` (NumPy) section; the rest of
the docstring, before its first section, describes the tool. A parameter
annotated `ToolInvocation` is not offered to the model: it receives the call
itself (the calling agent, its cancel scope, ``spawn``).

What the function returns is the result for the model: a ``str`` as it is, a
`ToolOutcome` as it is (to mark an error itself), anything else as JSON. An
exception it raises is an error result naming it (the registry's rule).

A sync function runs on the Trio thread, inside the turn: while it runs,
nothing else in the process does, and a cancel waits for it to return. A
function that blocks (a file walk, a network call without Trio) is decorated
``@tool(thread=True)``: it runs in ``trio.to_thread.run_sync`` with
``abandon_on_cancel=True``, so a cancel ends the call at once, and the thread,
which Python cannot stop, runs on until the function returns, its result
dropped.

`as_tool` is what registration accepts: a `Tool`, or a function ``@tool`` made one.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Final, TypeVar, get_args, get_origin, get_type_hints, overload

import msgspec
import trio

from greenroom.actors.types import ToolInvocation, ToolOutcome, ToolView
from greenroom.protocol.events import ToolKind
from greenroom.tools.registry import Tool

F = TypeVar("F", bound=Callable[..., Any])

#: Where a decorated function keeps its `Tool` (read it with `as_tool`).
_TOOL_ATTRIBUTE: Final = "__greenroom_tool__"
_KINDS: Final = get_args(ToolKind)
#: The names the model APIs accept for a tool.
_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_GOOGLE_SECTION: Final = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|Yields|"
    r"Raises|Examples?|Notes?|See Also|Warnings?|References|Attributes|Other Parameters)\s*:\s*$"
)
_NUMPY_UNDERLINE: Final = re.compile(r"^-{3,}\s*$")
_PARAMETER_SECTIONS: Final = frozenset(
    {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments",
     "other parameters"}
)  # fmt: skip
_GOOGLE_ENTRY: Final = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ENTRY: Final = re.compile(r"^(\*{0,2}\w+)\s*(?::.*)?$")


@overload
def tool(function: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    kind: ToolKind = "other",
    view: Callable[[Any], ToolView] | None = None,
    concurrent: bool = False,
    thread: bool = False,
    idempotent: bool = False,
) -> Callable[[F], F]: ...


def tool(
    function: F | None = None,
    /,
    *,
    name: str | None = None,
    kind: ToolKind = "other",
    view: Callable[[Any], ToolView] | None = None,
    concurrent: bool = False,
    thread: bool = False,
    idempotent: bool = False,
) -> F | Callable[[F], F]:
    """Make `function` a tool; it stays the same function, callable as before.

    ``name`` defaults to the function's; ``kind`` says what it does (an
    ``edit``, ``delete``, ``move`` or ``execute`` asks permission first);
    ``view(args)`` gives a reader its title and locations from the decoded
    arguments (attributes named as the parameters); ``concurrent`` calls of
    one step run at once; ``thread`` runs a sync function in a worker thread
    (see the module's docstring); ``idempotent`` says a second run does what
    one does, so a call a crash cut is run again when its turn is continued
    (`Tool.idempotent`). Pass the function to
    ``open_runtime(tools=[...])`` or `PluginContext.register_tool`.

    Raises `TypeError` at decoration, naming the parameter, for one without
    an annotation, of a type msgspec cannot decode from JSON, or that is
    ``*args``/``**kwargs``; and for an unknown ``kind``, a name a model API
    refuses, or ``thread=True`` on an async function.
    """

    def decorate(function: F) -> F:
        built = _build(function, name, kind, view, concurrent, thread, idempotent)
        setattr(function, _TOOL_ATTRIBUTE, built)
        return function

    return decorate if function is None else decorate(function)


def as_tool(candidate: object) -> Tool[Any]:
    """`candidate` as a `Tool`: a `Tool` itself, or a function decorated with `tool`.

    Raises `TypeError` saying what a tool is for anything else (a plain
    function, a plugin, a class).
    """
    if isinstance(candidate, Tool):
        return candidate
    found = getattr(candidate, _TOOL_ATTRIBUTE, None)
    if isinstance(found, Tool):
        return found
    what = getattr(candidate, "__qualname__", None) or type(candidate).__name__
    hint = (
        " (a plain function: decorate it with @greenroom.tool)" if inspect.isfunction(candidate)
        else ""
    )  # fmt: skip
    raise TypeError(
        f"{what!s} is not a tool{hint}: a tool is a greenroom.tools.Tool, or a function"
        " decorated with @greenroom.tool; a plugin goes to Runtime.plug"
    )


def _build(
    function: Callable[..., Any],
    name: str | None,
    kind: ToolKind,
    view: Callable[[Any], ToolView] | None,
    concurrent: bool,
    thread: bool,
    idempotent: bool,
) -> Tool[Any]:
    label = getattr(function, "__qualname__", repr(function))
    tool_name = name if name is not None else getattr(function, "__name__", "")
    if not _NAME.fullmatch(tool_name):
        raise TypeError(f"@tool on {label}: the name {tool_name!r} must be 1-64 of A-Z a-z 0-9 _ -")
    if kind not in _KINDS:
        raise TypeError(f"@tool on {label}: kind {kind!r} is not one of {', '.join(_KINDS)}")
    is_async = inspect.iscoroutinefunction(function)
    if thread and is_async:
        raise TypeError(f"@tool(thread=True) on {label}: an async function needs no thread")
    summary, documented = _docstring(inspect.getdoc(function) or "")
    try:
        hints = get_type_hints(function, include_extras=True)
    except Exception as exc:  # a forward reference that does not resolve
        raise TypeError(f"@tool on {label}: its annotations do not resolve: {exc}") from None
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    positional: list[str] = []
    keyword: list[str] = []
    invocation: str | None = None
    for parameter in inspect.signature(function).parameters.values():
        where = f"@tool on {label}: parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: *args and **kwargs cannot be a tool's arguments")
        names = keyword if parameter.kind is parameter.KEYWORD_ONLY else positional
        if parameter.name not in hints:
            if parameter.name in ("self", "cls"):
                raise TypeError(f"{where}: a method cannot be a tool; decorate a function")
            raise TypeError(f"{where} has no annotation (the model needs its type)")
        annotation = hints[parameter.name]
        names.append(parameter.name)
        if annotation is ToolInvocation:
            invocation = parameter.name
            continue
        annotation = _described(annotation, documented.get(parameter.name))
        try:
            msgspec.json.schema(annotation)
            msgspec.json.Decoder(annotation)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{where}: {annotation!r} is not a JSON type msgspec decodes: {exc}"
            ) from None
        default = parameter.default
        fields.append(
            (parameter.name, annotation)
            if default is parameter.empty
            else (parameter.name, annotation, msgspec.field(default=default))
        )
    try:
        args = msgspec.defstruct(
            f"{tool_name}_args", fields, kw_only=True, forbid_unknown_fields=True
        )
    except (TypeError, ValueError) as exc:  # a default msgspec cannot hold
        raise TypeError(f"@tool on {label}: {exc}") from None
    call = _Call(function, tuple(positional), tuple(keyword), invocation, is_async, thread)
    return Tool(tool_name, summary or tool_name, args, call, kind, view, concurrent, idempotent)


class _Call:
    """Runs the function on one call's decoded arguments (built once per tool).

    ``positional`` and ``keyword`` name the parameters in the signature's
    order; the one named ``invocation`` (if any) gets the call itself.
    """

    __slots__ = ("_function", "_invocation", "_is_async", "_keyword", "_positional", "_thread")

    def __init__(
        self,
        function: Callable[..., Any],
        positional: tuple[str, ...],
        keyword: tuple[str, ...],
        invocation: str | None,
        is_async: bool,
        thread: bool,
    ) -> None:
        self._function = function
        self._positional = positional
        self._keyword = keyword
        self._invocation = invocation
        self._is_async = is_async
        self._thread = thread

    async def __call__(self, args: Any, invocation: ToolInvocation) -> str | ToolOutcome:
        def value(name: str) -> Any:
            return invocation if name == self._invocation else getattr(args, name)

        positional = [value(name) for name in self._positional]
        keyword = {name: value(name) for name in self._keyword}
        if self._is_async:
            result = await self._function(*positional, **keyword)
        elif self._thread:
            call = partial(self._function, *positional, **keyword)
            result = await trio.to_thread.run_sync(call, abandon_on_cancel=True)
        else:
            result = self._function(*positional, **keyword)
            await trio.lowlevel.checkpoint()
        if isinstance(result, str | ToolOutcome):
            return result
        return msgspec.json.encode(result).decode()


def _described(annotation: Any, documented: str | None) -> Any:
    """`annotation` with its description as msgspec's ``Meta``: an ``Annotated`` string first,
    else the docstring's; a type with neither is returned as it is."""
    if get_origin(annotation) is Annotated:
        base, *extras = get_args(annotation)
        texts = [e for e in extras if isinstance(e, str)]
        if texts:
            kept = [e for e in extras if not isinstance(e, str)]
            meta = msgspec.Meta(description=" ".join(texts))
            return Annotated[(base, *kept, meta)]
        if any(isinstance(e, msgspec.Meta) and e.description for e in extras):
            return annotation
    if documented:
        return Annotated[annotation, msgspec.Meta(description=documented)]
    return annotation


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The tool's description (the text before the first section) and each documented
    parameter's text, from a Google (``Args:``) or NumPy (``Parameters`` + dashes) docstring."""
    lines = doc.splitlines()
    sections: list[tuple[str, int, int, bool]] = []  # (title, body's first line, start, numpy)
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if _GOOGLE_SECTION.match(line) and not lines[i].startswith((" ", "\t")):
            sections.append((line.rstrip(":").strip().lower(), i + 1, i, False))
        elif i + 1 < len(lines) and line and _NUMPY_UNDERLINE.match(lines[i + 1].strip()):
            sections.append((line.lower(), i + 2, i, True))
            i += 1
        i += 1
    starts = [start for _, _, start, _ in sections]
    summary = "\n".join(lines[: starts[0]] if starts else lines).strip()
    documented: dict[str, str] = {}
    for n, (title, body, _, numpy) in enumerate(sections):
        if title not in _PARAMETER_SECTIONS:
            continue
        end = starts[n + 1] if n + 1 < len(sections) else len(lines)
        documented.update(_entries(lines[body:end], numpy=numpy))
    return summary, documented


def _entries(body: list[str], *, numpy: bool) -> dict[str, str]:
    """``name: text`` (Google, ``name (type): text``) or ``name : type`` then indented text
    (NumPy), continuation lines indented deeper; names stripped of ``*``."""
    indents = [len(line) - len(line.lstrip()) for line in body if line.strip()]
    if not indents:
        return {}
    base = min(indents)
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in body:
        text = line.strip()
        if not text:
            continue
        if len(line) - len(line.lstrip()) == base:
            match = (_NUMPY_ENTRY if numpy else _GOOGLE_ENTRY).match(text)
            if match is None:
                current = None
                continue
            current = entries.setdefault(match[1].lstrip("*"), [])
            if not numpy and match[2]:
                current.append(match[2])
        elif current is not None:
            current.append(text)
    return {name: " ".join(words) for name, words in entries.items() if words}
