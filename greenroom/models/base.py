"""The model seam: one call per step, streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Protocol, runtime_checkable

from greenroom.protocol.model import ModelRequest, StreamChunk


class ModelError(Exception):
    """A model call failed; the step (and its turn) ends ``error`` with this message."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ModelAdapter(Protocol):
    """Streams one model response for `request`.

    The stream yields `StreamChunk`s and should end with a `Finish`. The
    caller may stop iterating at any time (a cancel): an adapter that holds a
    connection releases it when the iterator is closed or the task cancelled.
    Raising (any `Exception`) ends the step with an error. A `Retry` chunk is no
    part of the reply: it tells the caller an attempt failed and another follows.
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
