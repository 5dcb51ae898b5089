"""A user message's parts as the HTTP adapters send them: what both wire formats share.

Each adapter maps a part to its own block; this module decides what a part
is on the wire: a `Text` its text; a text `Resource` a text naming its uri; an
image (an `ImageRef`, or a `ResourceRef` of an image type) its bytes, base64,
when the model takes images; anything else a text saying what was left out.
A model that takes text only (``images=False``, or its family's default,
`IMAGE_INPUT`) refuses an image of the prompt being answered (the request's
last message) with `ModelError` before any request is made; an image of an
earlier prompt is sent as a text saying it was left out, so the session goes
on (and one that switched models too).
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Final, TypeAlias

from greenroom.models.base import ModelError
from greenroom.protocol.content import (
    IMAGE_TYPES,
    ImageRef,
    Part,
    Resource,
    ResourceRef,
    Text,
    missing,
)
from greenroom.protocol.model import Message, UserTurn

#: Whether a model family takes images, by the longest prefix of its name; a model of no
#: family listed is taken to (its server says if not).
IMAGE_INPUT: Final[Mapping[str, bool]] = MappingProxyType(
    {
        "claude-": True,
        "claude-2": False,
        "claude-instant": False,
        "deepseek-": False,
        "gpt-3.5": False,
        "gpt-4": False,
        "gpt-4-turbo": True,
        "gpt-4.1": True,
        "gpt-4o": True,
        "gpt-5": True,
        "o1": True,
        "o1-mini": False,
        "o3": True,
        "o3-mini": False,
        "o4-mini": True,
    }
)


def takes_images(model: str) -> bool:
    """Whether `model` takes images, by its family (`IMAGE_INPUT`)."""
    best = ""
    for prefix in IMAGE_INPUT:
        if model.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return IMAGE_INPUT[best] if best else True


class WireImage:
    """An image to send: its type and its bytes in base64."""

    __slots__ = ("data", "mime_type")

    def __init__(self, mime_type: str, data: str) -> None:
        self.mime_type = mime_type
        self.data = data


#: Base64 characters an adapter keeps of the images it sent lately (`Encoded`).
ENCODED_CHARS: Final = 64 * 1024 * 1024


class Encoded:
    """The base64 of the images an adapter sent lately, by SHA-256, the least recently sent
    dropped past `ENCODED_CHARS`: every step of a session sends its images again, and
    encoding a 5 MiB image costs milliseconds each time. One per adapter (no lock: Trio)."""

    __slots__ = ("_chars", "_texts")

    def __init__(self) -> None:
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._chars = 0

    def of(self, digest: str, data: bytes) -> str:
        text = self._texts.get(digest)
        if text is not None:
            self._texts.move_to_end(digest)
            return text
        text = base64.b64encode(data).decode("ascii")
        self._texts[digest] = text
        self._chars += len(text)
        while self._chars > ENCODED_CHARS and len(self._texts) > 1:
            self._chars -= len(self._texts.popitem(last=False)[1])
        return text


#: A part on the wire: a text, or an image.
WirePart: TypeAlias = str | WireImage


def wire_parts(
    message: UserTurn,
    blobs: Mapping[str, bytes],
    encoded: Encoded,
    images: bool,
    model: str,
    current: bool,
) -> Iterator[WirePart]:
    """`message`'s parts as texts and images. `current`: it is a message of the prompt
    being answered, so an image it has that `model` cannot take (`images` false) is a
    `ModelError` naming the model and the block; otherwise a text saying it was left out."""
    for index, part in enumerate(message.parts):
        match part:
            case Text(text=text):
                yield text
            case Resource(uri=uri, text=text):
                yield f'<resource uri="{uri}">\n{text}\n</resource>'
            case ImageRef() | ResourceRef() if _is_image(part):
                if not images:
                    if current:
                        raise ModelError(
                            f"model {model!r} takes text only (images=False): content block"
                            f" {index} of the prompt is an image ({part.mime_type}); send"
                            " it to a model that takes images",
                            "unsupported-content",
                        )
                    yield f"[an image ({part.mime_type}) was left out: {model} takes text only]"
                    continue
                data = blobs.get(part.sha256)
                if data is None:
                    yield missing(part)
                else:
                    yield WireImage(part.mime_type, encoded.of(part.sha256, data))
            case ResourceRef(uri=uri, mime_type=mime_type, size=size):
                yield f"[resource {uri} ({mime_type}, {size:,} bytes): binary, not shown]"


def _is_image(part: Part) -> bool:
    return type(part) is ImageRef or (type(part) is ResourceRef and part.mime_type in IMAGE_TYPES)


def answering(messages: Sequence[Message]) -> int:
    """The index of the prompt being answered: the last message when it is a user's (a
    turn's first request), else none (`len(messages)`). An earlier prompt's image, one of a
    turn that failed for it among them, is left out, not refused again."""
    last = len(messages) - 1
    return last if last >= 0 and type(messages[last]) is UserTurn else len(messages)
