"""The adapter conformance suite: the contract of `greenroom.models.base.ModelAdapter`, written
once as scenarios that any adapter, bound to a loopback server speaking its wire format,
must pass.

A `Binding` says how one wire format is spoken: the adapter under test, made for the
server's URL, and the bytes of each kind of reply. Each scenario in `SCENARIOS` serves
those bytes from a `greenroom.models.loopback` server on 127.0.0.1, runs the adapter
against it and raises `ConformanceError` naming what the adapter did wrong. The
scenarios use real sockets: run them on the real clock (each bounds itself to `LIMIT`
seconds). greenroom's own adapters are bound in its test suite; an embedder's adapter
binds the same way::

    for name, scenario in SCENARIOS.items():
        trio.run(scenario, MyBinding())  # or one pytest test per name
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Protocol

import msgspec
import trio

from greenroom.models.base import ModelAdapter, ModelError
from greenroom.models.loopback import CutOff, Hold, Piece, Served, serve
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    ReasoningDelta,
    Retry,
    StreamChunk,
    TextDelta,
    Thought,
    ToolCallChunk,
    ToolSchema,
    Usage,
    UserTurn,
)

#: Seconds a scenario may take (a loopback exchange takes milliseconds).
LIMIT: Final = 10.0
#: The usage a reply reports in the text scenario; a wire format that does not report a count
#: is expected to say 0 for it (`Binding.counts`).
USAGE: Final = Usage(
    input_tokens=1200,
    output_tokens=40,
    cache_read_tokens=1000,
    cache_write_tokens=150,
    reasoning_tokens=12,
)
#: `Usage`'s counts (its other field, the cost, no adapter reports: it is unknown, None).
COUNTS: Final = tuple(f for f in Usage.__struct_fields__ if f != "cost")
#: The output limit the max_output_tokens scenario asks for.
ASKED_LIMIT: Final = 1000

_REQUEST: Final = ModelRequest(messages=[UserTurn("hi")], system="be brief", session_id="s-1")
_LOOKUP: Final = ToolSchema(
    "lookup",
    "look a word up",
    {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
)


class ConformanceError(AssertionError):
    """The adapter broke the contract; the message says how."""


class Binding(Protocol):
    """How the suite speaks one adapter's wire format. Each method returns what a provider
    would send, as the provider documents it; pieces are whole server-sent events (one
    chunk of the body each)."""

    #: The `Usage` counts the wire format reports (the names of `Usage`'s fields).
    counts: frozenset[str]

    def adapter(self, url: str) -> ModelAdapter:
        """The adapter under test, for the server at `url` (``http://127.0.0.1:PORT``, no
        path): its retries waiting milliseconds, not seconds (the 5xx scenario waits its
        backoff), its own output maximum, if any, above `ASKED_LIMIT`."""
        ...

    def text(self, text: str, usage: Usage) -> Sequence[Piece]:
        """A whole reply of `text` reporting `usage` (split as the wire format splits it),
        finishing normally."""
        ...

    def partial(self, text: str) -> Sequence[Piece]:
        """The start of a reply up to a delta of `text`, and nothing after it."""
        ...

    def tool_call(self, call_id: str, name: str, arguments: str) -> Sequence[Piece]:
        """A whole reply calling tool `name` with `arguments` (JSON), finishing to have it
        run."""
        ...

    def thinking(self, thought: str, text: str) -> Sequence[Piece]:
        """A whole reply that thinks `thought`, then answers `text`."""
        ...

    def overloaded(self) -> Sequence[Piece]:
        """A 200 reply that fails before any of its content with the error event by which
        the provider says it is overloaded or busy."""
        ...

    def error(self, status: int, message: str) -> bytes:
        """The body of an error answer of `status` carrying `message`."""
        ...

    def limits(self, body: Any) -> tuple[int | None, int | None]:
        """The output limit and the thinking budget a request body asks for (None: none)."""
        ...

    def thinks(self, body: Any) -> bool:
        """Whether a request body asks the model to think."""
        ...


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


async def _collect(model: ModelAdapter, request: ModelRequest) -> list[StreamChunk]:
    return [chunk async for chunk in model.stream(request)]


def _text(chunks: Sequence[StreamChunk], kind: type[TextDelta | ReasoningDelta]) -> str:
    return "".join(c.text for c in chunks if type(c) is kind)


def _last(chunks: Sequence[StreamChunk]) -> StreamChunk | None:
    return chunks[-1] if chunks else None


async def text(binding: Binding) -> None:
    """A text reply streams as text deltas, reports its usage (every count the wire format
    carries, the cached and reasoning ones among them) and finishes ``stop``."""
    with trio.fail_after(LIMIT):
        async with serve([Served(pieces=binding.text("Hello world", USAGE))]) as server:
            chunks = await _collect(binding.adapter(server.url), _REQUEST)
    said = _text(chunks, TextDelta)
    _expect(said == "Hello world", f"the reply's text is {said!r}, not 'Hello world'")
    expected = msgspec.structs.replace(USAGE, **{f: 0 for f in COUNTS if f not in binding.counts})
    usages = [c for c in chunks if type(c) is Usage]
    _expect(usages == [expected], f"the usage reported is {usages}, not [{expected}]")
    _expect(_last(chunks) == Finish("stop"), f"the reply ends {_last(chunks)}, not stop")
    _expect(len(server.requests) == 1, f"{len(server.requests)} requests were made, not 1")


async def tool_call(binding: Binding) -> None:
    """A tool call streams once, whole (an id, the name, the arguments), and the reply
    finishes ``tool-calls``."""
    request = msgspec.structs.replace(_REQUEST, tools=[_LOOKUP])
    pieces = binding.tool_call("call_1", "lookup", '{"word": "trio"}')
    with trio.fail_after(LIMIT):
        async with serve([Served(pieces=pieces)]) as server:
            chunks = await _collect(binding.adapter(server.url), request)
    calls = [c for c in chunks if type(c) is ToolCallChunk]
    _expect(len(calls) == 1, f"{len(calls)} tool calls streamed, not 1")
    (call,) = calls
    _expect(bool(call.call_id), "the tool call has no id")
    _expect(call.name == "lookup", f"the tool call names {call.name!r}, not 'lookup'")
    try:
        arguments = msgspec.json.decode(call.arguments)
    except msgspec.DecodeError:
        raise ConformanceError(f"the call's arguments are not JSON: {call.arguments!r}") from None
    _expect(arguments == {"word": "trio"}, f"the call's arguments are {arguments!r}")
    _expect(_last(chunks) == Finish("tool-calls"), f"the reply ends {_last(chunks)}")


async def thinking(binding: Binding) -> None:
    """A thought level of high asks the model to think and off does not; a thinking reply
    streams its thinking as reasoning deltas ahead of its text, and any `Thought` it keeps
    comes before the finish."""
    replies = [
        Served(pieces=binding.thinking("Let me think.", "Yes.")),
        Served(pieces=binding.text("No.", USAGE)),
    ]
    high = msgspec.structs.replace(_REQUEST, thought_level="high")
    off = msgspec.structs.replace(_REQUEST, thought_level="off")
    with trio.fail_after(LIMIT):
        async with serve(replies) as server:
            model = binding.adapter(server.url)
            chunks = await _collect(model, high)
            await _collect(model, off)
    asked, not_asked = (seen.body for seen in server.requests)
    _expect(binding.thinks(asked), "a thought level of high did not ask the model to think")
    _expect(not binding.thinks(not_asked), "a thought level of off asked the model to think")
    thought = _text(chunks, ReasoningDelta)
    _expect(thought == "Let me think.", f"the reasoning streamed is {thought!r}")
    _expect(_text(chunks, TextDelta) == "Yes.", "the reply's text is not 'Yes.'")
    first_text = next(i for i, c in enumerate(chunks) if type(c) is TextDelta)
    _expect(
        all(i < first_text for i, c in enumerate(chunks) if type(c) is ReasoningDelta),
        "reasoning streamed after the text began",
    )
    finish = next(i for i, c in enumerate(chunks) if type(c) is Finish)
    _expect(
        all(i < finish for i, c in enumerate(chunks) if type(c) is Thought),
        "a Thought came after the finish",
    )
    _expect(_last(chunks) == Finish("stop"), f"the reply ends {_last(chunks)}, not stop")


async def cut_stream(binding: Binding) -> None:
    """A stream cut after its first text delta keeps what streamed, then raises
    `ModelError` (code ``connection``), and is not tried again."""
    chunks: list[StreamChunk] = []
    with trio.fail_after(LIMIT):
        async with serve([Served(pieces=[*binding.partial("Hello"), CutOff()])]) as server:
            try:
                async for chunk in binding.adapter(server.url).stream(_REQUEST):
                    chunks.append(chunk)
            except ModelError as exc:
                _expect(exc.code == "connection", f"the cut raised code {exc.code!r}")
            else:
                raise ConformanceError("the cut stream ended without an error")
    _expect(_text(chunks, TextDelta) == "Hello", "the text before the cut was not streamed")
    _expect(not any(type(c) is Retry for c in chunks), "a cut after text was retried")
    _expect(len(server.requests) == 1, f"{len(server.requests)} requests were made, not 1")


async def rate_limited(binding: Binding) -> None:
    """A 429 asking for no wait is tried again at once: a `Retry` (code ``http-429``, the
    provider's message) before the reply, the same bytes sent again."""
    limited = Served(429, headers={"Retry-After": "0"}, body=binding.error(429, "slow down"))
    await _retried(binding, limited, "http-429", "slow down")


async def server_error(binding: Binding) -> None:
    """A 503 is tried again after the backoff: a `Retry` (code ``http-503``) before the
    reply."""
    failed = Served(503, body=binding.error(503, "the service is overloaded"))
    await _retried(binding, failed, "http-503", "the service is overloaded")


async def overloaded_event(binding: Binding) -> None:
    """An overload error event in a 200 stream, before any content, is tried again."""
    await _retried(binding, Served(pieces=binding.overloaded()), None, None)


async def _retried(binding: Binding, first: Served, code: str | None, message: str | None) -> None:
    with trio.fail_after(LIMIT):
        async with serve([first, Served(pieces=binding.text("Hello world", USAGE))]) as server:
            chunks = await _collect(binding.adapter(server.url), _REQUEST)
    retries = [c for c in chunks if type(c) is Retry]
    _expect(len(retries) == 1, f"{len(retries)} retries were told, not 1")
    (retry,) = retries
    _expect(chunks[0] == retry, "the retry was not told before the reply")
    _expect(code is None or retry.code == code, f"the retry's code is {retry.code!r}")
    _expect(message is None or message in retry.error, f"the retry says {retry.error!r}")
    _expect(_text(chunks, TextDelta) == "Hello world", "the retried reply's text is wrong")
    _expect(len(server.requests) == 2, f"{len(server.requests)} requests were made, not 2")
    first_sent, second_sent = (seen.raw for seen in server.requests)
    _expect(first_sent == second_sent, "the retry sent other bytes")


async def cancel(binding: Binding) -> None:
    """A cancel mid-stream ends the call at once and closes its connection."""
    with trio.fail_after(LIMIT):
        async with serve([Served(pieces=[*binding.partial("Hello"), Hold()])]) as server:
            stream = binding.adapter(server.url).stream(_REQUEST)
            with trio.CancelScope() as scope:
                try:
                    async for chunk in stream:
                        if type(chunk) is TextDelta:
                            scope.cancel()
                finally:
                    aclose: Callable[[], Awaitable[None]] | None = getattr(stream, "aclose", None)
                    if aclose is not None:
                        with trio.CancelScope(shield=True):
                            await aclose()
            _expect(scope.cancelled_caught, "the cancel did not end the stream")
            await server.client_left.wait()  # within LIMIT, or the connection stayed open
    _expect(len(server.requests) == 1, f"{len(server.requests)} requests were made, not 1")


async def max_output_tokens(binding: Binding) -> None:
    """`ModelRequest.max_output_tokens` is sent as the request's output limit, and a
    thinking budget never exceeds it."""
    request = msgspec.structs.replace(_REQUEST, max_output_tokens=ASKED_LIMIT, thought_level="high")
    with trio.fail_after(LIMIT):
        async with serve([Served(pieces=binding.text("Hello world", USAGE))]) as server:
            await _collect(binding.adapter(server.url), request)
    limit, budget = binding.limits(server.requests[0].body)
    _expect(limit == ASKED_LIMIT, f"the output limit sent is {limit}, not {ASKED_LIMIT}")
    _expect(budget is None or budget <= ASKED_LIMIT, f"the thinking budget {budget} exceeds it")


#: The scenarios, by name.
SCENARIOS: Final[Mapping[str, Callable[[Binding], Awaitable[None]]]] = MappingProxyType(
    {
        "text": text,
        "tool call": tool_call,
        "thinking": thinking,
        "cut stream": cut_stream,
        "429": rate_limited,
        "5xx": server_error,
        "overloaded event": overloaded_event,
        "cancel": cancel,
        "max_output_tokens": max_output_tokens,
    }
)
