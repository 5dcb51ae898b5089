"""The model seam: one call per step, streamed.

`ModelAdapter` is the contract every adapter keeps (its docstring; checked by
`greenroom.models.conformance`). Beside it: `ModelError`, and `ContextOverflow`, a
provider's refusal of a request over the model's window (its ``window``: the limit the
refusal names, read by `context_limit`); the known families' context windows
(`CONTEXT_WINDOWS`, `context_window_of`); `open_models`, which holds each adapter's
connection pool for the runtime's life. Each adapter sends back only the thoughts
(`Thought`) of its own wire format (``Thought.source``).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import MappingProxyType
from typing import Final, Protocol, runtime_checkable

from greenroom.protocol.model import ModelRequest, StreamChunk


class ModelError(Exception):
    """A model call failed; the step (and its turn) ends ``error`` with this message."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ContextOverflow(ModelError):
    """The provider refused the request as longer than the model's context window (OpenAI's
    400 ``context_length_exceeded``, Anthropic's 400 ``invalid_request_error`` "prompt is too
    long"): the turn compacts the history and tries the step once more. ``window`` is the
    limit the refusal named (`context_limit`), None when it named none."""

    def __init__(self, message: str, code: str | None = None, *, window: int | None = None) -> None:
        super().__init__(message, code)
        self.window = window


#: How refusals name the window: OpenAI's wording (which vLLM, DeepSeek, OpenRouter and most
#: OpenAI-compatible servers copy), Anthropic's, Gemini's.
_LIMITS: Final = (
    re.compile(r"maximum context length is (\d[\d,]*) tokens"),
    re.compile(r"prompt is too long: \d[\d,]* tokens > (\d[\d,]*) maximum"),
    re.compile(r"exceeds the maximum number of tokens allowed \((\d[\d,]*)\)"),
)


def context_limit(message: str) -> int | None:
    """The context window an over-long request's refusal names, if it names one:
    "maximum context length is N tokens" (OpenAI and the servers that copy it), "prompt is
    too long: M tokens > N maximum" (Anthropic), "... exceeds the maximum number of tokens
    allowed (N)" (Gemini). None for any other text, and for 0."""
    for pattern in _LIMITS:
        found = pattern.search(message)
        if found is not None:
            return int(found.group(1).replace(",", "")) or None
    return None


#: Tokens a model is taken to hold when neither its adapter nor its family says.
DEFAULT_CONTEXT_WINDOW: Final = 128_000

#: The context windows of known model families, by name prefix (the longest prefix wins).
CONTEXT_WINDOWS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "claude-": 200_000,
        "deepseek-": 128_000,
        "deepseek-v4": 1_000_000,
        "gemini-": 1_048_576,
        "gemini-1.5-pro": 2_097_152,
        "gpt-3.5-turbo": 16_385,
        "gpt-4": 8_192,
        "gpt-4-turbo": 128_000,
        "gpt-4o": 128_000,
        "gpt-4.1": 1_047_576,
        "gpt-5": 400_000,
        "o1": 200_000,
        "o3": 200_000,
        "o4-mini": 200_000,
    }
)


def context_window_of(model: str) -> int:
    """The context window of `model` by its family (`CONTEXT_WINDOWS`), else
    `DEFAULT_CONTEXT_WINDOW`: a local OpenAI-compatible server's model usually needs its
    own (``context_window=``, ``--context-window``)."""
    best = ""
    for prefix in CONTEXT_WINDOWS:
        if model.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return CONTEXT_WINDOWS[best] if best else DEFAULT_CONTEXT_WINDOW


class ModelAdapter(Protocol):
    """Streams one model response for `request`: the contract every adapter keeps.

    *Chunks.* Text and reasoning stream as `TextDelta` / `ReasoningDelta` as they arrive; a
    tool call streams once, whole (`ToolCallChunk`: an id, the name, the arguments as JSON
    text), however its wire format splits it. What the provider needs back on a later call
    (a signed thinking block, an encrypted reasoning item, a thought signature) streams as a
    `Thought` whose ``source`` names the wire format; an adapter sends back only its own
    format's thoughts. At most one `Usage`: ``input_tokens`` the whole prompt, cached parts
    included, and every count the provider reports (cache reads and writes, reasoning
    tokens), 0 where it reports none. The stream ends with one `Finish`.

    *Failures.* Raising ends the step (and its turn) with an error: `ModelError` with a
    ``code`` and a message naming the provider's endpoint and its own message,
    `greenroom.models.http.ModelConfigError` for refused credentials, `ContextOverflow` for
    a prompt longer than the model holds (the turn compacts and tries once more). A stream
    that ends before its finish, or is cut, raises; what streamed before stays with the
    caller.

    *Retries.* A failure worth another attempt (a rate limit, an overload, a server fault, a
    connection lost before the reply began) is tried again only while nothing of the reply
    has streamed, within a wait budget, with the same request bytes; before each wait the
    stream yields a `Retry` (the attempt, the wait, the error, its code: ``http-STATUS`` for
    a status, the provider's code for an error event). A `Retry` is no part of the reply.

    *Cancellation.* The caller may stop iterating at any time, or be cancelled: the
    adapter then releases its connection at once (when the iterator is closed or the task
    cancelled), and a wait between attempts ends at once.

    *Connections.* An adapter that keeps connections is a `PooledModel`: whoever holds its
    ``connections`` (the runtime, for its life: `open_models`) keeps them for reuse, and
    none outlives the last holder.

    *The request.* `ModelRequest.max_output_tokens` caps the reply: the adapter sends the
    smaller of it and its own maximum, and keeps any thinking budget under it;
    ``thought_level`` says how hard the model thinks (off / low / medium / high);
    ``session_id`` may key the provider's prompt cache. An adapter may say how many tokens
    its model holds (``context_window``: an int); one that does not is never compacted
    ahead of a call, only after a `ContextOverflow`.

    The conformance suite, `greenroom.models.conformance`, checks this contract against a
    loopback server speaking the adapter's wire format: an adapter of an embedder's own
    binds to it by a `greenroom.models.conformance.Binding` (its replies' bytes, how to read
    its request body) and runs each of ``SCENARIOS`` on the real clock.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]: ...


class Pool(Protocol):
    def held(self) -> AbstractAsyncContextManager[None]: ...


@runtime_checkable
class PooledModel(Protocol):
    """An adapter whose connections are pooled (the HTTP adapters): whoever holds
    ``connections`` keeps them open for reuse, and the last holder's exit closes them."""

    @property
    def connections(self) -> Pool: ...


@asynccontextmanager
async def open_models(models: Iterable[ModelAdapter]) -> AsyncIterator[None]:
    """Hold every pooled adapter's connections until the block ends (a runtime's life).

    Nothing is opened here: a pool opens its first connection when a call needs it.
    On exit each pool this block held is closed, unless another holder (a second
    runtime sharing the adapter) still holds it.
    """
    async with AsyncExitStack() as stack:
        for model in models:
            if isinstance(model, PooledModel):
                await stack.enter_async_context(model.connections.held())
        yield
