"""The MCP servers a session owns: how to reach each one, and what became of it.

A session is given its servers when it is created or resumed (ACP's
``mcpServers``); they are not stored in its log, because the editor passes
them again on every load. `check_servers` refuses, before anything starts, a
list a server could not be started from, naming the entry and the field.

The specs are `McpStdioServer` and `McpHttpServer` (`McpServer`); `McpStatus` is a
server's state as the session tells it (starting, ready, failed, gave-up), and
`McpServerError` a server's failure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal, TypeAlias

import msgspec

#: How long a server may take to start and list its tools before it counts as failed.
DEFAULT_START_TIMEOUT = 30.0


class McpStdioServer(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="stdio"):
    """A server run as a child process, speaking MCP on its stdin and stdout.

    ``env`` is added to a small safe set of the runtime's variables (``PATH``,
    ``HOME``, ...); ``cwd`` defaults to the session's. ``timeout`` bounds each
    tool call in seconds (None: a call may take as long as it takes; a cancel
    still stops it at once). ``sandbox``: what it may change, one of
    ``read-only``, ``workspace-write``, ``full-access`` (`greenroom.sandbox`);
    None: the sandbox of its session's mode when it starts (an editor's servers
    are always so: ACP has no such field).
    """

    name: str
    command: str
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    timeout: float | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT
    sandbox: Literal["read-only", "workspace-write", "full-access"] | None = None


class McpHttpServer(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="http"):
    """A server reached over MCP's streamable HTTP transport at ``url``."""

    name: str
    url: str
    headers: dict[str, str] = {}
    timeout: float | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT


McpServer: TypeAlias = McpStdioServer | McpHttpServer

#: ``starting``: its first connection is under way; ``ready``: its tools are offered;
#: ``failed``: it did not start, or it died (its supervisor restarts it, with backoff);
#: ``gave-up``: it failed more often than its restart intensity allows; it stays down.
McpState: TypeAlias = Literal["starting", "ready", "failed", "gave-up"]


class McpStatus(msgspec.Struct, frozen=True, gc=False):
    """What became of one of a session's servers: its state, why, how many tools it offers,
    and the state it left (``previous``), so a reader can tell a change from a repeat."""

    server: str
    state: McpState
    message: str = ""
    tools: int = 0
    previous: McpState = "starting"

    def describe(self) -> str:
        """One line for a person: what happened to the server, and what it means for the session."""
        name = self.server
        if self.state == "starting":
            if self.message:  # a session went live without it
                return f"MCP server {name!r} is {self.message}; its tools join once it is ready"
            return f"MCP server {name!r} is starting"
        if self.state == "ready":
            back = f" ({self.message})" if self.message else ""
            return f"MCP server {name!r} is ready with {self.tools} tools{back}"
        if self.state == "failed":
            return (
                f"MCP server {name!r} failed: {self.message}; its tools are unavailable"
                " until it is restarted (with backoff)"
            )
        return (
            f"MCP server {name!r} was given up after repeated failures ({self.message});"
            " the session goes on without its tools"
        )


class McpServerError(Exception):
    """A server of a session failed: it did not start, its connection ended, or it gave up."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server


def safe_name(part: str) -> str:
    """A part of a tool's name as model APIs accept it: other characters than
    ``[A-Za-z0-9_-]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", part)


#: The most servers one session may have: each may be a process, and a client's list
#: of thousands would be a fork bomb (and each name is checked against the others).
MAX_SERVERS = 64


def check_servers(servers: Sequence[McpServer]) -> None:
    """Raise `ValueError` naming the first entry (``mcpServers[i].field``) that cannot start,
    or the count when there are more than `MAX_SERVERS`.

    Besides a bad field, that is a name whose tools could be named like another
    server's: ``mcp__<safe name>__<tool>`` must tell whose a tool is, so no
    safe name followed by ``__`` may begin another's (``my server`` and
    ``my_server``; ``a`` and ``a__b``, whose tools ``b__c`` and ``c`` meet).
    """
    if len(servers) > MAX_SERVERS:
        raise ValueError(
            f"mcpServers: {len(servers)} servers given; a session may have at most {MAX_SERVERS}"
        )
    seen: dict[str, int] = {}  # each safe name followed by "__", and whose it is
    for index, server in enumerate(servers):
        where = f"mcpServers[{index}]"
        if not isinstance(server, McpStdioServer | McpHttpServer):
            raise TypeError(f"{where}: expected McpStdioServer or McpHttpServer, got {server!r}")
        if not server.name.strip():
            raise ValueError(f"{where}.name: must not be empty")
        prefix = safe_name(server.name) + "__"
        for other, other_index in seen.items():
            if other.startswith(prefix) or prefix.startswith(other):
                other_name = servers[other_index].name
                if other_name == server.name:
                    raise ValueError(f"{where}.name: {server.name!r} is given twice")
                raise ValueError(
                    f"{where}.name: {server.name!r} would name its tools like"
                    f" mcpServers[{other_index}] ({other_name!r}) does"
                )
        seen[prefix] = index
        strings: list[tuple[str, str]] = [("name", server.name)]
        if isinstance(server, McpStdioServer):
            if not server.command:
                raise ValueError(f"{where}.command: must not be empty")
            strings += [("command", server.command), *(("args", a) for a in server.args)]
            strings += [("env", f"{k}={v}") for k, v in server.env.items()]
            if server.cwd is not None:
                strings.append(("cwd", server.cwd))
            for key in server.env:
                if not key or "=" in key:
                    raise ValueError(f"{where}.env: {key!r} is not a variable name")
            if server.sandbox not in (None, "read-only", "workspace-write", "full-access"):
                raise ValueError(f"{where}.sandbox: {server.sandbox!r} is not a sandbox")
        else:
            if not server.url.startswith(("http://", "https://")):
                raise ValueError(f"{where}.url: {server.url!r} is not an http(s) URL")
            strings += [
                ("url", server.url),
                *(("headers", f"{k}: {v}") for k, v in server.headers.items()),
            ]
        for field, value in strings:
            if "\x00" in value:
                raise ValueError(f"{where}.{field}: must not contain NUL")
        for field, seconds in (("timeout", server.timeout), ("startTimeout", server.start_timeout)):
            if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{where}.{field}: must be seconds > 0, got {seconds!r}")
