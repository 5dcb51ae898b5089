"""A prompt's content: text, or a sequence of blocks (text, images, embedded resources).

`Agent.send` and `Agent.run` take a ``str`` or a sequence of `ContentBlock`s.
The log never holds a large blob: `stored` turns the blocks into their `Part`s
(an image or a blob resource becomes a reference to its bytes by SHA-256, the
bytes kept beside the log, docs/semantics.md "Images and embedded context")
and the blobs to keep. A text resource stays in the log: it is text the model
reads, like a prompt's.

The blocks: `Text`, `Image`, `Resource` (`ContentBlock`), checked against `MAX_IMAGE_BYTES`
and `MAX_PROMPT_BYTES`; their log form: `Text`, a text `Resource`, or `ImageRef` /
`ResourceRef` naming the bytes by SHA-256 (`Part`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final, TypeAlias, final

import msgspec

#: The bytes one image (or blob resource) may have, and the bytes a prompt's blocks may
#: have in all (text included, UTF-8). A prompt past either is refused before it is queued.
MAX_IMAGE_BYTES: Final = 5 * 1024 * 1024
MAX_PROMPT_BYTES: Final = 20 * 1024 * 1024
#: The image types both providers take.
IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


@final
class Text(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="text"):
    text: str


@final
class Image(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="image"):
    """An image's bytes (not base64) and its type, one of `IMAGE_TYPES`."""

    data: bytes
    mime_type: str


@final
class Resource(
    msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="resource", omit_defaults=True
):
    """An embedded resource (a file's contents, say) named by its `uri`: its `text`, or its
    `blob` bytes with their `mime_type`; exactly one of the two."""

    uri: str
    text: str | None = None
    blob: bytes | None = None
    mime_type: str | None = None


ContentBlock: TypeAlias = Text | Image | Resource
#: What `Agent.send` takes.
Content: TypeAlias = str | Sequence[ContentBlock]


@final
class ImageRef(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="image-ref"):
    """An image in the log: its bytes are the blob `sha256` (hex) names, `size` long."""

    mime_type: str
    sha256: str
    size: int


@final
class ResourceRef(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="resource-ref"):
    """A blob resource in the log: its bytes are the blob `sha256` (hex) names."""

    uri: str
    mime_type: str
    sha256: str
    size: int


#: A block as the log (and the model history) holds it: a `Resource` here is a text one.
Part: TypeAlias = Text | Resource | ImageRef | ResourceRef


def checked(blocks: object) -> tuple[ContentBlock, ...]:
    """`blocks` as a tuple of content blocks, or `ValueError`/`TypeError` naming the first
    block that is wrong (its index) and why: not a block, an empty text, an image type
    other than `IMAGE_TYPES`, a resource with neither or both of text and blob, an image's
    or blob's data that is not bytes (base64 text, say) or over `MAX_IMAGE_BYTES`, all of
    them over `MAX_PROMPT_BYTES`, no block at all."""
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Sequence):
        raise TypeError(
            f"content must be text (str), got {type(blocks).__name__}; or a sequence of"
            " content blocks (greenroom.protocol.content)"
        )
    if not blocks:
        raise ValueError("content must have at least one block")
    total = 0
    for index, block in enumerate(blocks):
        where = f"content block {index}"
        total += block_size(where, block)
        check_total(where, total)
    return tuple(blocks)


def check_total(where: str, total: int) -> None:
    """`ValueError` naming `where` (the block that passed it) when a prompt's `total` bytes
    are over `MAX_PROMPT_BYTES`."""
    if total > MAX_PROMPT_BYTES:
        raise ValueError(
            f"{where}: the prompt's blocks pass the limit of {MAX_PROMPT_BYTES:,} bytes in all"
        )


def block_size(where: str, block: object) -> int:
    """The bytes `block` adds to a prompt; `ValueError`/`TypeError` naming `where` (the
    block, as the caller names it) for a block `checked` refuses."""
    match block:
        case Text(text=text):
            if not text.strip():
                raise ValueError(f"{where}: the text is empty")
            return len(text.encode())
        case Image(data=data, mime_type=mime_type):
            if mime_type not in IMAGE_TYPES:
                kinds = ", ".join(sorted(IMAGE_TYPES))
                raise ValueError(f"{where}: image type {mime_type!r} is not one of {kinds}")
            return _blob_size(where, "image", data)
        case Resource(text=text, blob=blob, uri=uri):
            if (text is None) == (blob is None):
                raise ValueError(f"{where}: resource {uri!r} needs exactly one of text and blob")
            if blob is not None:
                if not block.mime_type:
                    raise ValueError(f"{where}: blob resource {uri!r} needs its mime_type")
                return _blob_size(where, "blob", blob)
            assert text is not None
            return len(text.encode())
    raise TypeError(f"{where}: expected Text, Image or Resource, got {type(block).__name__}")


def _blob_size(where: str, what: str, data: object) -> int:
    if not isinstance(data, bytes):  # base64 text would reach the log's hash, and fail there
        raise TypeError(
            f"{where}: the {what}'s data must be bytes (not base64 text), got {type(data).__name__}"
        )
    if not data:
        raise ValueError(f"{where}: the {what} is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(
            f"{where}: the {what} is {len(data):,} bytes, over the limit of"
            f" {MAX_IMAGE_BYTES:,} bytes"
        )
    return len(data)


def stored(blocks: Sequence[ContentBlock]) -> tuple[list[Part], dict[str, bytes]]:
    """The log's parts for `blocks` (checked ones), and the blobs they name by SHA-256."""
    parts: list[Part] = []
    blobs: dict[str, bytes] = {}
    for block in blocks:
        match block:
            case Image(data=data, mime_type=mime_type):
                digest = hashlib.sha256(data).hexdigest()
                blobs[digest] = data
                parts.append(ImageRef(mime_type, digest, len(data)))
            case Resource(blob=bytes() as blob, uri=uri, mime_type=mime_type):
                digest = hashlib.sha256(blob).hexdigest()
                blobs[digest] = blob
                parts.append(ResourceRef(uri, mime_type or "", digest, len(blob)))
            case Text() | Resource():
                parts.append(block)
    return parts, blobs


def text_of(blocks: Sequence[ContentBlock | Part]) -> str:
    """A prompt's text: its text blocks, blank-line separated (its title comes from it)."""
    return "\n\n".join(block.text for block in blocks if type(block) is Text)


def referenced(parts: Sequence[Part]) -> list[str]:
    """The blobs `parts` point at."""
    return [part.sha256 for part in parts if type(part) is ImageRef or type(part) is ResourceRef]


def missing(part: ImageRef | ResourceRef) -> str:
    """What stands for a blob the store no longer holds."""
    what = f"resource {part.uri}" if isinstance(part, ResourceRef) else "image"
    return (
        f"[{what} ({part.mime_type}, {part.size:,} bytes, sha256 {part.sha256[:12]}) is missing"
        " from the session's store]"
    )


def described(part: Part) -> str:
    """One line for a reader: a part's text, or what the blob it points at is."""
    match part:
        case Text(text=text):
            return text
        case Resource(uri=uri, text=text):
            return f"[resource {uri}: {len(text or ''):,} characters]"
        case ImageRef(mime_type=mime_type, size=size, sha256=digest):
            return f"[image {mime_type}, {size:,} bytes, sha256 {digest[:12]}]"
        case ResourceRef(uri=uri, mime_type=mime_type, size=size, sha256=digest):
            return f"[resource {uri}: {mime_type}, {size:,} bytes, sha256 {digest[:12]}]"
    raise AssertionError(part)
