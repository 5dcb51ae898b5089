"""MCP: the servers a session owns, as supervised children of its life, and their tools.

`McpHub` is the runtime's `ServerHub`; the server specs and statuses are in
`greenroom.protocol.mcp`. The SDK (`mcp`) is imported only once a session
has a server to start.
"""

from greenroom.protocol.mcp import (
    McpHttpServer,
    McpServer,
    McpServerError,
    McpStatus,
    McpStdioServer,
)
from greenroom.tools.mcp.servers import (
    MCP_PROMPTS,
    MCP_STATUS,
    McpHub,
    McpPrompt,
    McpPrompts,
    SessionMcp,
    tool_name,
)

__all__ = [
    "MCP_PROMPTS",
    "MCP_STATUS",
    "McpHttpServer",
    "McpHub",
    "McpPrompt",
    "McpPrompts",
    "McpServer",
    "McpServerError",
    "McpStatus",
    "McpStdioServer",
    "SessionMcp",
    "tool_name",
]
