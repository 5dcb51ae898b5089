"""The model seam: one call per step, streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

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
    Raising (any `Exception`) ends the step with an error.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]: ...
