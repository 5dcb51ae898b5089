"""A model call beside a turn's steps (a compaction's summary, a session's title): its
text read, its retries logged, its stream closed, one way for each.
"""

from __future__ import annotations

from typing import NamedTuple

from greenroom.actors.step import retried
from greenroom.models.base import ModelAdapter
from greenroom.protocol.model import Finish, ModelRequest, Retry, TextDelta, Usage
from greenroom.session import Session

__all__ = ["SideText", "read_side_text"]


class SideText(NamedTuple):
    """What a side call answered: its text, its usage (None if the model told none), and
    whether it was cut (the model stopped at its most tokens, or reading stopped)."""

    text: str
    usage: Usage | None
    cut: bool


async def read_side_text(
    model: ModelAdapter, request: ModelRequest, session: Session, turn: int, step: int, most: int
) -> SideText:
    """The model's answer to `request`, read until it ends or past `most` characters (the
    rest is not read: ``cut``). Each retry is logged on `session` as ``model/retry`` of
    `turn` and `step`, as a step's are. Raises `RuntimeError` naming why when the model
    finishes with an error, aborted or refused. The stream is closed however it ends
    (checkpoints: a cancelled caller sees ``Cancelled``)."""
    parts: list[str] = []
    read = 0
    usage: Usage | None = None
    cut = False
    stream = model.stream(request)
    try:
        async for chunk in stream:
            if type(chunk) is TextDelta:
                parts.append(chunk.text)
                read += len(chunk.text)
                if read > most:
                    cut = True
                    break
            elif type(chunk) is Usage:
                usage = chunk
            elif type(chunk) is Finish:
                if chunk.reason in ("error", "aborted", "refusal"):
                    raise RuntimeError(chunk.message or f"the model finished {chunk.reason}")
                cut = chunk.reason == "max-tokens"
            elif type(chunk) is Retry:
                session.append(retried(chunk, turn, step))
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    return SideText("".join(parts), usage, cut)
