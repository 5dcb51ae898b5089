"""Frames out: every frame of a connection queued for its one writer, each bounded.

`Outbox.send` never blocks and never raises: a frame is encoded once and
queued on the writer's channel; one past `frames.MAX_FRAME` goes as
`Outbox.send` says (the presenter bounds updates, so that is a last guard);
once the channel is closed (the peer gone, teardown under way) frames are
dropped. `write_frames` is the writer: frames leave in the order they were
queued, those waiting at once in one write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import msgspec
import trio

from greenroom.acp import frames
from greenroom.acp.client import ClientRequests
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    AgentMessageChunk,
    ErrorObject,
    ErrorResponse,
    Notification,
    OutgoingRequest,
    RequestId,
    Response,
    SessionNotificationParams,
    SessionUpdate,
    TextBlock,
)

logger = logging.getLogger("greenroom.acp")

_encoder = msgspec.json.Encoder()
_ECHOED_ID: Final = 65536  # characters of a request id an oversized answer's error still echoes


class Outbox:
    """The frames out of one connection, and its requests to the client (``requests``),
    whose replies come back through the reader."""

    __slots__ = ("_channel", "requests", "seq_of")

    def __init__(self, channel: trio.MemorySendChannel[bytes]) -> None:
        self._channel = channel
        self.requests = ClientRequests(self.send)
        #: Set (``greenroom serve``): every update carries ``_meta.greenroom.seq``, its
        #: place in the session's log, and this gives, for an update that names none, the
        #: session's latest (None: not a live session here).
        self.seq_of: Callable[[str], int | None] | None = None

    def send(self, frame: msgspec.Struct) -> None:
        """Queue `frame`. One too large for a reader is replaced: an answer by an error
        answer; a request of ours fails at once, as if the client had refused it; an
        update by a notice in its session; another notification is dropped. Each is
        logged."""
        data = _encoder.encode(frame)
        if len(data) > frames.MAX_FRAME:
            logger.warning("a %s frame of %d bytes was not sent", type(frame).__name__, len(data))
            replacement = self._too_large(frame, len(data))
            if replacement is None:
                return
            data = _encoder.encode(replacement)
        # Not `contextlib.suppress`: three calls a frame, six of the 275 a prompt cost.
        try:  # noqa: SIM105
            self._channel.send_nowait(data + b"\n")
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the writer is gone, and so is the peer: dropped (see the module)

    @property
    def idle(self) -> bool:
        """True when the writer has taken every frame queued (it may still be writing them):
        what paces live output (`greenroom.acp.live`)."""
        return self._channel.statistics().current_buffer_used == 0

    def respond(self, request_id: RequestId, result: object) -> None:
        self.send(Response(request_id, result))

    def fail(self, request_id: RequestId, code: int, message: str) -> None:
        self.send(ErrorResponse(request_id, ErrorObject(code, message)))

    def update(self, session_id: str, update: SessionUpdate, seq: int | None = None) -> None:
        """A ``session/update`` of `session_id`; `seq`: the log event it shows (None: the
        latest), told only where `seq_of` is set."""
        meta = None
        if self.seq_of is not None:
            if seq is None:
                seq = self.seq_of(session_id)
            if seq is not None:
                meta = {"greenroom": {"seq": seq}}
        params = SessionNotificationParams(session_id, update, meta)
        self.send(Notification("session/update", params))

    def tell(self, session_id: str, text: str) -> None:
        """A notice in `session_id`: an ``agent_message_chunk`` of its own."""
        self.update(session_id, AgentMessageChunk(TextBlock(text)))

    def _too_large(self, frame: msgspec.Struct, size: int) -> msgspec.Struct | None:
        why = f"{size} bytes, over the {frames.MAX_FRAME}-byte frame limit"
        if isinstance(frame, Response | ErrorResponse):
            # An id that itself fills the frame cannot be echoed: answered with id null.
            request_id = frame.id if len(str(frame.id)) <= _ECHOED_ID else None
            return ErrorResponse(request_id, ErrorObject(INTERNAL_ERROR, f"the answer was {why}"))
        if isinstance(frame, OutgoingRequest):
            self.requests.reply(frame.id, None, f"not sent: the request was {why}")
            return None
        if isinstance(frame, Notification) and isinstance(frame.params, SessionNotificationParams):
            notice = AgentMessageChunk(TextBlock(f"[an update of {why} was not sent]\n"))
            return Notification(
                "session/update", SessionNotificationParams(frame.params.session_id, notice)
            )
        return None


async def write_frames(
    queued: trio.MemoryReceiveChannel[bytes], stream: trio.abc.SendStream
) -> None:
    """The connection's only writer on a byte stream, until the end of its channel or the
    peer's going."""
    async for frame in queued:
        batch = [frame]
        while True:
            try:
                batch.append(queued.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        try:
            await stream.send_all(b"".join(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the peer is gone
