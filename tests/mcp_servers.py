"""MCP servers for the tests, run as real processes: ``python tests/mcp_servers.py MODE ...``.

* ``stdio``: the SDK's `MCPServer` on stdio with the tools below;
* ``http PORT``: the same tools over streamable HTTP on 127.0.0.1:PORT;
* ``fail-once MARKER [MODE ...]``: exits 1 at its first start (it creates
  MARKER), then serves like ``MODE ...`` (default ``stdio``);
* ``ignore-eof``: a bare JSON-RPC server that answers the handshake and
  ``tools/list`` and then ignores the end of its stdin and SIGTERM (only
  SIGKILL ends it);
* ``silent``: reads its stdin and never answers anything (not even ``initialize``);
* ``stops-reading [stubborn]``: a bare JSON-RPC server that answers the
  handshake and ``tools/list`` (one read-only tool, ``take {text}``), then
  never reads its stdin again; ``stubborn``, it ignores SIGTERM too (only
  SIGKILL ends it);
* ``slow-start SECONDS``: sleeps SECONDS, then serves like ``stdio``;
* ``hostile``: a bare JSON-RPC server (`Hostile`) that misbehaves on demand:
  garbage lines on its stdout, odd tool names, endless pages, floods of
  ``tools/list_changed``, giant results, exiting in the middle of a call,
  invalid UTF-8, children left behind;
* ``prompts``: the SDK's `MCPServer` on stdio with two prompts, ``review(path,
  focus="")`` and ``stall`` (never answered), and one tool, ``add_prompt(name)``,
  that adds a prompt and sends ``prompts/list_changed``;
* ``daemonize NAME``: before serving like ``stdio``, double-forks a detached
  ``sleep`` (a session of its own, its parent gone) whose argv[0] is NAME,
  and appends ``daemon <pid>`` to ``$MCP_RECORD``.

Every mode appends ``pid <pid>`` to the file named by ``$MCP_RECORD`` (if
set) at start; the ``block`` tool appends ``started <tag>`` and, when the
client cancels it, ``cancelled <tag>``.
"""

import json
import os
import signal
import subprocess
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts import Prompt
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


def prompts_server() -> MCPServer:
    server = MCPServer("greenroom-prompts")

    @server.prompt()
    def review(path: str, focus: str = "") -> str:
        """Review a file."""
        return f"Please review {path}" + (f", looking at {focus}." if focus else ".")

    @server.prompt()
    async def stall() -> str:
        """Never answer."""
        await anyio.sleep_forever()
        return ""

    @server.tool()
    async def add_prompt(name: str, ctx: Context) -> str:
        """Offer one more prompt, `name`, and say the list changed."""

        def added() -> str:
            return f"the {name} prompt"

        server.add_prompt(Prompt.from_function(added, name=name, description=f"Say {name}"))
        await ctx.session.send_prompt_list_changed()
        return f"added {name}"

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


def stops_reading(flags: list[str]) -> None:
    """Answer initialize and tools/list; then read nothing more (``stubborn``: nor exit on
    SIGTERM)."""
    if "stubborn" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        if message["method"] == "initialize":
            result: object = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "deaf", "version": "1"},
            }
        else:
            result = {"tools": [_tool("take")]}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
        sys.stdout.write("\n")
        sys.stdout.flush()
        if message["method"] == "tools/list":
            break
    while True:
        time.sleep(60)


def silent() -> None:
    """Read every line and never answer, until stdin ends."""
    for _line in sys.stdin:
        pass


def _tool(name: str, description: str = "") -> dict[str, object]:
    return {
        "name": name,
        "description": description or name,
        "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    }


class Hostile:
    """A bare JSON-RPC server over stdio whose misbehaviour its tools trigger.

    Its tools: ``echo {text}``; ``die`` exits (status 7) without answering;
    ``giant {mb}`` answers ``mb`` MB of text on one line; ``flood {n}`` sends
    ``n`` ``notifications/tools/list_changed`` before it answers; ``shrink``
    stops offering ``gone`` and tells the client; ``garble`` writes lines that
    are not JSON-RPC, then invalid UTF-8, then answers; ``asks`` sends requests
    of its own (sampling, roots, elicitation, an unknown method, ping) and a
    thousand bad notifications before it answers; ``malformed`` answers a
    result of the wrong shape; ``spawn`` starts a
    child in its process group that ignores the end of its stdin and SIGTERM
    (its pid is recorded as ``child <pid>``; the server itself exits as soon as
    its stdin ends, leaving the child behind).

    ``flags`` change the handshake: ``garbage`` writes junk lines before every
    answer; ``names`` offers tools whose names need normalising (two of them
    to the same name); ``endless`` answers every ``tools/list`` after the first
    with one more page, forever; ``relist-hangs`` never answers a ``tools/list``
    after the first.
    """

    def __init__(self, flags: list[str]) -> None:
        self.flags = set(flags)
        self.lists = 0
        self.tools = [
            _tool(name)
            for name in (
                "echo",
                "die",
                "giant",
                "flood",
                "shrink",
                "garble",
                "spawn",
                "asks",
                "malformed",
                "gone",
            )
        ]
        if "names" in self.flags:
            self.tools += [_tool(n, repr(n)) for n in ("a.b", "a b", "ünï", "x" * 100)]

    def write(self, message: dict[str, object]) -> None:
        if "garbage" in self.flags:
            sys.stdout.write('not json\n{"jsonrpc": "2.0"}\n[1, 2]\n\n')
            sys.stdout.write('{"jsonrpc": "2.0", "id": 99999, "result": {}}\n')
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def notify(self, method: str) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")

    def serve(self) -> None:
        for line in sys.stdin:
            message = json.loads(line)
            if "id" not in message or "method" not in message:
                continue
            result = self.answer(message["method"], message.get("params") or {})
            if result is not None:
                self.write({"jsonrpc": "2.0", "id": message["id"], "result": result})

    def answer(self, method: str, params: dict[str, object]) -> dict[str, object] | None:
        if method == "initialize":
            return {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        if method == "tools/list":
            self.lists += 1
            record(f"listed {self.lists}")
            if self.lists > 1 and "relist-hangs" in self.flags:
                return None
            if self.lists > 1 and "endless" in self.flags:
                page = self.lists
                return {"tools": [_tool(f"t{page}", "x" * 1000)], "nextCursor": str(page)}
            return {"tools": self.tools}
        if method == "tools/call":
            return self.call(str(params["name"]), params.get("arguments") or {})
        return {}

    def call(self, name: str, arguments: object) -> dict[str, object] | None:
        assert isinstance(arguments, dict)
        text = "done"
        if name == "echo":
            text = f"echo: {arguments.get('text')}"
        elif name == "die":
            sys.stdout.flush()
            os._exit(7)
        elif name == "giant":
            text = "g" * int(float(arguments["mb"]) * 1_000_000)
        elif name == "flood":
            for _ in range(int(arguments["n"])):
                self.notify("notifications/tools/list_changed")
        elif name == "shrink":
            self.tools = [tool for tool in self.tools if tool["name"] != "gone"]
            self.notify("notifications/tools/list_changed")
        elif name == "garble":
            sys.stdout.write("garbage\n")
            sys.stdout.flush()
            sys.stdout.buffer.write(b"\xff\xfe not utf-8\n")
            sys.stdout.buffer.flush()
        elif name == "asks":
            # Requests and notifications a client never asked for, before the answer.
            for index, method in enumerate(
                ["sampling/createMessage", "roots/list", "elicitation/create", "no/such", "ping"]
            ):
                request = {"jsonrpc": "2.0", "id": f"q{index}", "method": method, "params": {}}
                sys.stdout.write(json.dumps(request) + "\n")
            for _ in range(1000):
                self.notify("notifications/message")
            progress = {"progressToken": "nobody", "progress": 1}
            note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": progress}
            sys.stdout.write(json.dumps(note) + "\n")
        elif name == "malformed":
            return {"content": "not a list", "isError": "maybe"}
        elif name == "spawn":
            child = subprocess.Popen(
                [sys.executable, "-c", _STUBBORN_CHILD], stdin=subprocess.DEVNULL
            )
            record(f"child {child.pid}")
            text = str(child.pid)
        return {"content": [{"type": "text", "text": text}], "isError": False}


_STUBBORN_CHILD = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(60)
"""


def daemonize(name: str) -> None:
    """A ``sleep`` named `name`, detached by a double fork: init's child, not ours."""
    reader, writer = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # as a daemon does: it holds none of its starter's pipes
                os.dup2(null, fd)
            os.execvp("sleep", [name, "1000"])
        os.write(writer, f"{daemon}".encode())
        os._exit(0)
    os.close(writer)
    daemon_pid = int(os.read(reader, 64))
    os.close(reader)
    os.waitpid(middle, 0)
    record(f"daemon {daemon_pid}")


def main() -> None:
    record(f"pid {os.getpid()}")
    serve(sys.argv[1:])


def serve(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "stdio":
        tools_server().run("stdio")
    elif mode == "http":
        tools_server().run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    elif mode == "fail-once":
        marker = argv[1]
        if not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(1)
        serve(argv[2:] or ["stdio"])
    elif mode == "slow-start":
        time.sleep(float(argv[1]))
        tools_server().run("stdio")
    elif mode == "prompts":
        prompts_server().run("stdio")
    elif mode == "ignore-eof":
        ignore_eof()
    elif mode == "silent":
        silent()
    elif mode == "stops-reading":
        stops_reading(argv[1:])
    elif mode == "hostile":
        Hostile(argv[1:]).serve()
    elif mode == "daemonize":
        daemonize(argv[1])
        tools_server().run("stdio")
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
