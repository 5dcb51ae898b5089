"""The checks of a request's params, pure: each returns what the bridge acts on or raises an
`RpcError` naming what was wrong (the field, and the value, cut short).

Nothing here holds state or touches a session; `check_cwd` reads the file
system only to ask whether a directory exists.

The checks: `decode` (a params Struct), `check_cwd`, `prompt_text`, `servers_from_acp`
(``mcpServers`` entries as specs, -32602 naming the entry), `prompt_result` (an `Answer`
as ACP's answer).
"""

from __future__ import annotations

import os
from typing import Any, Final, TypeVar

import msgspec

from greenroom.actors.prompt import Answer
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    PARSE_ERROR,
    AcpContentBlock,
    AcpStopReason,
    HttpServerEntry,
    PromptResult,
    PromptUsage,
    ResourceBlock,
    ResourceContents,
    ResourceLinkBlock,
    StdioServerEntry,
    TextBlock,
)
from greenroom.protocol.mcp import McpHttpServer, McpServer, McpStdioServer, check_servers
from greenroom.protocol.model import Usage

P = TypeVar("P", bound=msgspec.Struct)

_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}

#: ACP's stop reason for each way a prompt ends but ``error`` (answered -32603).
STOP_REASONS: Final[dict[str, AcpStopReason]] = {
    "completed": "end_turn",
    "max-tokens": "max_tokens",
    "refusal": "refusal",
    "aborted": "cancelled",
    "disposed": "cancelled",
    "withdrawn": "cancelled",
    "guarded": "refusal",
    "requires-action": "cancelled",  # a turn parked as its client left: no one reads it
}


class RpcError(Exception):
    """Answer the request with this JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def decode(kind: type[P], raw: msgspec.Raw) -> P:
    """`raw` as `kind`; -32602 naming the field of the wrong shape, -32700 for bytes that are
    not JSON inside (invalid UTF-8 in a string)."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(raw)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RpcError(PARSE_ERROR, f"not JSON: {exc}") from None
    except RecursionError:
        raise RpcError(INVALID_PARAMS, "invalid params: nested too deep to decode") from None


#: How much of a long path's start and end an error shows (its end names what is missing).
PATH_HEAD: Final = 60
PATH_TAIL: Final = 100


def shown_path(path: str) -> str:
    """`path` as an error names it: its repr, or for a long one the first `PATH_HEAD` and
    the last `PATH_TAIL` characters of that, joined by ``...``."""
    shown = repr(path)
    if len(shown) <= PATH_HEAD + PATH_TAIL + 3:
        return shown
    return f"{shown[:PATH_HEAD]}...{shown[-PATH_TAIL:]}"


def check_cwd(cwd: str, *, must_exist: bool, field: str = "cwd") -> None:
    """A directory param: absolute, no NUL, and (for a new session) an existing directory."""
    if "\x00" in cwd:
        raise RpcError(
            INVALID_PARAMS, f"invalid params: {field} holds a NUL byte: {shown_path(cwd)}"
        )
    if not os.path.isabs(cwd):
        raise RpcError(
            INVALID_PARAMS,
            f"invalid params: {field} must be an absolute path, got {shown_path(cwd)}",
        )
    if must_exist and not os.path.isdir(cwd):
        raise RpcError(
            INVALID_PARAMS,
            f"invalid params: {field} {shown_path(cwd)} is not an existing directory",
        )


def check_roots(directories: list[str]) -> None:
    """``additionalDirectories``: each absolute, without NUL, an existing directory."""
    for directory in directories:
        check_cwd(directory, must_exist=True, field="additionalDirectories")


def offset(cursor: str | None) -> int:
    """A ``session/list`` cursor (ours are offsets) as an offset."""
    if cursor is None:
        return 0
    # ASCII digits, few enough for an offset: str.isdigit takes '²', which int() refuses.
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 18):
        raise RpcError(INVALID_PARAMS, f"invalid params: cursor {cursor!r:.40} is not ours")
    return int(cursor)


def prompt_text(prompt: list[AcpContentBlock]) -> str:
    """A steering prompt's blocks as one text (a resource link as a Markdown link, an
    embedded text resource as a text naming its uri); blank is refused, and so is an image
    or a blob (-32602 naming the block: it can go as a prompt of its own)."""
    parts: list[str] = []
    for index, block in enumerate(prompt):
        match block:
            case TextBlock(text=text):
                parts.append(text)
            case ResourceLinkBlock(name=name, uri=uri):
                parts.append(f"[{name}]({uri})")
            case ResourceBlock(resource=ResourceContents(uri=uri, text=str() as text)):
                parts.append(f'<resource uri="{uri}">\n{text}\n</resource>')
            case _:
                raise RpcError(
                    INVALID_PARAMS,
                    f"invalid params: prompt[{index}]: steering takes text; send an image or"
                    " a blob as a prompt",
                )
    text = "\n".join(part for part in parts if part)
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "invalid params: prompt has no text")
    return text


def prompt_result(answer: Answer[Any], cancelled: bool) -> PromptResult:
    """The ``session/prompt`` answer of `answer`: its stop reason and its turn's tokens. A
    prompt whose session was cancelled while it was unsettled is ``cancelled`` however its
    turn ended (the spec's rule); a failed turn raises -32603 with its message."""
    if cancelled:
        return PromptResult("cancelled", _usage(answer.usage))
    if answer.stop_reason == "error":
        raise RpcError(INTERNAL_ERROR, f"the turn failed: {answer.reason}")
    if answer.stop_reason == "limit":  # its reason leads with the limit's name
        tokens = (answer.reason or "").split(" ", 1)[0].endswith("tokens")
        return PromptResult("max_tokens" if tokens else "max_turn_requests", _usage(answer.usage))
    return PromptResult(STOP_REASONS[answer.stop_reason], _usage(answer.usage))


def _usage(usage: Usage | None) -> PromptUsage | None:
    if usage is None:
        return None
    return PromptUsage(
        usage.input_tokens + usage.output_tokens,
        usage.input_tokens,
        usage.output_tokens,
        usage.reasoning_tokens or None,
        usage.cache_read_tokens or None,
        usage.cache_write_tokens or None,
    )


def servers_from_acp(entries: list[dict[str, Any]]) -> list[McpServer]:
    """``mcpServers`` as server specs; a bad entry is -32602 naming it and its field."""
    servers: list[McpServer] = []
    for index, entry in enumerate(entries):
        where = f"mcpServers[{index}]"
        kind = entry.get("type", "stdio")
        try:
            if kind == "stdio":
                stdio = msgspec.convert(entry, StdioServerEntry)
                servers.append(
                    McpStdioServer(
                        name=stdio.name,
                        command=stdio.command,
                        args=stdio.args,
                        env={v.name: v.value for v in stdio.env},
                    )
                )
            elif kind == "http":
                http = msgspec.convert(entry, HttpServerEntry)
                headers = {h.name: h.value for h in http.headers}
                servers.append(McpHttpServer(name=http.name, url=http.url, headers=headers))
            else:
                raise RpcError(
                    INVALID_PARAMS,
                    f"invalid params: {where}.type: {kind!r} is not supported"
                    " (greenroom connects stdio and http servers)",
                )
        except msgspec.ValidationError as exc:
            message = str(exc).replace("`$", f"`{where}")
            raise RpcError(INVALID_PARAMS, f"invalid params: {where}: {message}") from None
    try:
        check_servers(servers)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
    return servers
