"""A ``session/prompt``'s blocks as what `Agent.send` takes.

A prompt of text and resource links only is text, as before (slash commands
read it). One with an ``image`` (base64 ``data`` and ``mimeType``) or an
embedded ``resource`` (``text``, or a base64 ``blob`` with its ``mimeType``)
becomes content blocks (`greenroom.protocol.content`), checked against the
limits there: a bad block or one past a limit is -32602 naming its index in
``prompt`` and the limit. Over ACP the frame limit (`frames.MAX_FRAME`, 8
MiB) bounds a prompt first: one image of up to `MAX_IMAGE_BYTES` fits in one.

A ``resource_link`` whose uri is a ``file://`` path inside the session's
directories (its cwd and additional directories, through the confined open of
the file tools, `greenroom.tools.confine`) to a regular UTF-8 file of at most
`LINK_BYTES` is inlined as an embedded text resource; any other link (another
scheme, outside the roots, too large, not UTF-8, unreadable) stays a Markdown
link the model can follow with its tools. The read is bounded and runs on the
Trio thread, so prompts are queued in the order they came.
"""

from __future__ import annotations

import binascii
import os
import urllib.parse
from base64 import b64decode
from typing import Final

from greenroom.acp.params import RpcError
from greenroom.protocol.acp import (
    INVALID_PARAMS,
    AcpContentBlock,
    ImageBlock,
    ResourceBlock,
    ResourceLinkBlock,
    TextBlock,
)
from greenroom.protocol.content import (
    MAX_IMAGE_BYTES,
    Content,
    ContentBlock,
    Image,
    Resource,
    Text,
    block_size,
    check_total,
)
from greenroom.protocol.events import SessionHeader
from greenroom.tools.confine import PathRefused, Roots, open_regular

#: The bytes of a linked file that are inlined at most; a larger one stays a link.
LINK_BYTES: Final = 256 * 1024


def prompt_content(prompt: list[AcpContentBlock], header: SessionHeader) -> Content:
    """`prompt` as text (text and links only, none inlined) or as content blocks; -32602
    naming the block (``prompt[N]``) for a blank prompt, bad base64, or a block `checked`
    would refuse (a limit among them). Blank text blocks are left out. The roots a link
    may be inlined from are the session's (`header`), worked out for a link only."""
    blocks: list[ContentBlock] = []
    plain = True
    total = 0
    for index, block in enumerate(prompt):
        match block:
            case TextBlock(text=text):
                if not text.strip():
                    continue
                new: ContentBlock = Text(text)
            case ResourceLinkBlock():
                inlined = _inlined(block, header)
                plain = plain and inlined is None
                new = inlined or Text(_link(block))
            case ImageBlock(data=data, mime_type=mime_type):
                plain = False
                new = Image(_bytes(index, "image", data), mime_type)
            case ResourceBlock(resource=resource):
                plain = False
                blob = None if resource.blob is None else _bytes(index, "blob", resource.blob)
                new = Resource(resource.uri, resource.text, blob, resource.mime_type)
        where = f"prompt[{index}]"
        try:
            total += block_size(where, new)
            check_total(where, total)
        except (TypeError, ValueError) as exc:
            raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
        blocks.append(new)
    if not blocks:
        raise RpcError(INVALID_PARAMS, "invalid params: prompt has no text")
    if plain:
        return "\n".join([b.text for b in blocks if isinstance(b, Text)])
    return blocks


def session_roots(header: SessionHeader) -> Roots | None:
    """The directories a session's links may be inlined from (None without a cwd)."""
    return None if header.cwd is None else Roots(header.cwd, header.additional_directories)


def _link(block: ResourceLinkBlock) -> str:
    return f"[{block.name}]({block.uri})"


def _bytes(index: int, what: str, data: str) -> bytes:
    """Base64 `data` decoded; one whose decoded size is over `MAX_IMAGE_BYTES` is refused
    before it is decoded."""
    size = len(data) // 4 * 3 - data[-2:].count("=")
    if size > MAX_IMAGE_BYTES:
        raise RpcError(
            INVALID_PARAMS,
            f"invalid params: prompt[{index}]: the {what} is {size:,} bytes, over the limit"
            f" of {MAX_IMAGE_BYTES:,} bytes",
        )
    try:
        return b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        why = f"invalid params: prompt[{index}]: the {what} is not base64"
        raise RpcError(INVALID_PARAMS, why) from None


def _inlined(block: ResourceLinkBlock, header: SessionHeader) -> Resource | None:
    """The linked file's text as an embedded resource, if it may be inlined (see above)."""
    url = urllib.parse.urlsplit(block.uri)
    roots = session_roots(header)
    if roots is None or url.scheme != "file" or url.netloc not in ("", "localhost"):
        return None
    path = urllib.parse.unquote(url.path)
    if not os.path.isabs(path) or "\x00" in path:
        return None
    try:
        fd, info, _ = open_regular(roots, path)
    except (PathRefused, OSError):
        return None
    try:
        if info.st_size > LINK_BYTES:
            return None
        data = os.read(fd, LINK_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > LINK_BYTES:
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    return Resource(block.uri, text=text) if text.strip() else None
