"""MCP servers for the tests, run as real processes: ``python tests/mcp_servers.py MODE ...``.

* ``stdio``: the SDK's `MCPServer` on stdio with the tools below;
* ``http PORT``: the same tools over streamable HTTP on 127.0.0.1:PORT;
* ``fail-once MARKER``: exits 1 at its first start (it creates MARKER), then
  serves like ``stdio``;
* ``ignore-eof``: a bare JSON-RPC server that answers the handshake and
  ``tools/list`` and then ignores the end of its stdin and SIGTERM (only
  SIGKILL ends it).

Every mode appends ``pid <pid>`` to the file named by ``$MCP_RECORD`` (if
set) at start; the ``block`` tool appends ``started <tag>`` and, when the
client cancels it, ``cancelled <tag>``.
"""

import json
import os
import signal
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations


def record(line: str) -> None:
    path = os.environ.get("MCP_RECORD")
    if path:
        with open(path, "a") as file:
            file.write(line + "\n")


def tools_server() -> MCPServer:
    server = MCPServer("greenroom-test")
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=read_only)
    def echo(text: str) -> str:
        """Say `text` back."""
        return f"echo: {text}"

    @server.tool(annotations=read_only)
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool(annotations=read_only)
    async def block(tag: str) -> str:
        """Block until cancelled."""
        record(f"started {tag}")
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            record(f"cancelled {tag}")
            raise
        return "unreachable"

    @server.tool(annotations=read_only)
    async def slow(seconds: float) -> str:
        """Answer after `seconds`."""
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def write_note(text: str) -> str:
        """A tool without annotations: it may change anything."""
        return f"noted: {text}"

    @server.tool(annotations=read_only)
    def fail(message: str) -> str:
        """Raise, so the result is an error."""
        raise ToolError(message)

    @server.tool(annotations=read_only)
    async def grow(ctx: Context) -> str:
        """Add the tool `extra` and tell the client its tool list changed."""

        def extra() -> str:
            """A tool that came later."""
            return "extra!"

        server.add_tool(extra, annotations=read_only)
        await ctx.request_context.session.send_tool_list_changed()
        return "grown"

    return server


def ignore_eof() -> None:
    """Answer initialize and tools/list; then never exit on EOF, nor on SIGTERM."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        if message["method"] == "initialize":
            result: object = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "stubborn", "version": "1"},
            }
        elif message["method"] == "tools/list":
            result = {"tools": []}
        else:
            result = {}
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    while True:
        time.sleep(60)


def main() -> None:
    mode = sys.argv[1]
    record(f"pid {os.getpid()}")
    if mode == "stdio":
        tools_server().run("stdio")
    elif mode == "http":
        tools_server().run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif mode == "fail-once":
        marker = sys.argv[2]
        if not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(1)
        tools_server().run("stdio")
    elif mode == "ignore-eof":
        ignore_eof()
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
