"""ServeLimits of ``greenroom serve``: connections per principal, messages per second, a client
that does not read, connections opened and dropped by the hundred."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
import trio
from trio_websocket import ConnectionRejected, wrap_client_stream

from greenroom.acp.network import ServeLimits
from greenroom.models.scripted import ScriptedModel
from tests.serve_clients import INITIALIZE, HttpClient, said, served, ws_client

pytestmark = pytest.mark.real_clock


async def test_connections_past_the_limit_are_refused_429_naming_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, limits=ServeLimits(connections=2)) as server,
            httpx2.AsyncClient(timeout=20) as http,
        ):
            async with ws_client(server.ws_url) as first:
                await first.call("initialize", INITIALIZE)
                over_http = HttpClient(http, server.url)
                await over_http.call("initialize", INITIALIZE)  # the second connection
                with pytest.raises(ConnectionRejected) as rejected:
                    async with ws_client(server.ws_url):
                        pass
                assert rejected.value.status_code == 429
                third = await HttpClient(http, server.url).post(
                    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}
                )
                assert third.status_code == 429
                assert "2 connections open" in third.text
                await http.delete(server.url, headers=over_http.headers())
            # Both gone: room again.
            async with ws_client(server.ws_url) as again:
                assert "result" in await again.call("initialize", INITIALIZE)


async def test_posts_over_the_rate_are_refused_429_with_retry_after(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, limits=ServeLimits(rate=5)) as server,
            httpx2.AsyncClient(timeout=20) as http,
        ):
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            statuses = []
            for n in range(10):
                response = await client.post(
                    {"jsonrpc": "2.0", "id": n, "method": "session/list", "params": {}}
                )
                statuses.append(response.status_code)
                if response.status_code == 429:
                    assert int(response.headers["retry-after"]) >= 1
                    assert "5 messages a second" in response.text
            assert 200 in statuses
            assert 429 in statuses


async def test_websocket_messages_over_the_rate_are_slowed_never_lost(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, limits=ServeLimits(rate=20)) as server,
            ws_client(server.ws_url) as client,
        ):
            await client.call("initialize", INITIALIZE)
            started = trio.current_time()
            for n in range(40):
                await client.send({"jsonrpc": "2.0", "id": n, "method": "session/list"})
            for n in range(40):
                assert "result" in await client.answer(n)
            assert trio.current_time() - started >= 0.9  # 20 a second past the first 20


def established(port: int) -> int:
    """The TCP connections of this machine whose local port is `port` (the server's side)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            count += state == "01" and int(local.rsplit(":", 1)[1], 16) == port
    return count


async def test_a_websocket_client_that_does_not_read_is_disconnected(tmp_path: Path) -> None:
    """Its sessions are let go past the backlog; its socket, held by the frame Hypercorn was
    sending it when the kernel's buffers filled, is reset once it took nothing for the idle
    time (TCP_USER_TIMEOUT)."""
    words = " ".join(["w"] * 40_000)  # 40,000 echoed chunks: megabytes of updates
    with trio.fail_after(60):
        async with (
            served(
                tmp_path, ScriptedModel(delay=0), idle=2, limits=ServeLimits(backlog=256 * 1024)
            ) as server,
            trio.open_nursery() as nursery,
        ):
            port = int(server.url.removesuffix("/acp").rsplit(":", 1)[1])
            raw = trio.socket.socket()
            # A window of a few KB: the server's sends block once its own buffer is full.
            raw.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
            await raw.connect(("127.0.0.1", port))
            socket = await wrap_client_stream(nursery, trio.SocketStream(raw), "127.0.0.1", "/acp")

            async def call(request_id: str, method: str, params: object) -> None:
                frame = {"jsonrpc": "2.0", "id": request_id, "method": method}
                await socket.send_message(json.dumps({**frame, "params": params}))

            await call("i", "initialize", INITIALIZE)
            await call("n", "session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session = None
            while session is None:
                frame = json.loads(await socket.get_message())
                if frame.get("id") == "n":
                    session = frame["result"]["sessionId"]
            prompt = [{"type": "text", "text": words}]
            await call("p", "session/prompt", {"sessionId": session, "prompt": prompt})
            # Never read again: the server lets go of the client's session,
            while server.runtime.agents.get(session) is not None:
                await trio.sleep(0.05)
            while established(port):  # and, the idle time after, of its socket
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
            # The server is still up for everyone else.
            async with ws_client(server.ws_url) as other:
                assert "result" in await other.call("initialize", INITIALIZE)
                load = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
                await other.call("session/resume", load)
                await other.call(
                    "session/prompt",
                    {"sessionId": session, "prompt": [{"type": "text", "text": "still"}]},
                )
                assert "still" in said(other.updates(session))


async def test_hundreds_of_connections_opened_and_dropped_leave_the_server_up(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with served(tmp_path) as server:
            host, port = server.url.removeprefix("http://").removesuffix("/acp").split(":")
            for _ in range(300):
                stream = await trio.open_tcp_stream(host, int(port))
                await stream.send_all(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websock")
                await stream.aclose()  # half a request, then gone
            async with ws_client(server.ws_url) as client:
                assert "result" in await client.call("initialize", INITIALIZE)


async def test_sessions_past_a_principals_limit_are_refused_naming_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, limits=ServeLimits(sessions=2)) as server,
            ws_client(server.ws_url) as first,
            ws_client(server.ws_url) as second,
        ):
            for client in (first, second):
                await client.call("initialize", INITIALIZE)
            new = {"cwd": str(tmp_path), "mcpServers": []}
            one = (await first.call("session/new", new))["result"]["sessionId"]
            await second.call("session/new", new)
            refused = await first.call("session/new", new)
            assert refused["error"]["code"] == -32603
            assert "has 2 sessions open, the most it may" in refused["error"]["message"]
            # One it holds already is no new one: the other client may attach to it.
            load = {"sessionId": one, "cwd": str(tmp_path), "mcpServers": []}
            assert "result" in await second.call("session/load", load)
            await first.call("session/close", {"sessionId": one})
            await second.call("session/close", {"sessionId": one})
            assert "result" in await first.call("session/new", new)


async def test_a_session_left_waiting_by_its_client_still_counts_against_the_limit(
    tmp_path: Path,
) -> None:
    """A client that leaves its session's turn waiting on a permission (so the session
    outlives it) cannot start another past the limit: one by one, it would park any number
    of live agents. Loading the one it left is allowed, and once it ends a new one is."""
    write = json.dumps({"path": "out.txt", "content": "x"})
    new = {"cwd": str(tmp_path), "mcpServers": []}
    with trio.fail_after(30):
        async with served(
            tmp_path, ScriptedModel(delay=0), tools=True, limits=ServeLimits(sessions=1)
        ) as server:
            async with ws_client(server.ws_url) as gone:
                await gone.call("initialize", INITIALIZE)
                left = (await gone.call("session/new", new))["result"]["sessionId"]
                prompt = {
                    "sessionId": left,
                    "prompt": [{"type": "text", "text": f"tool: write_file {write}"}],
                }
                await gone.send(
                    {"jsonrpc": "2.0", "id": "p", "method": "session/prompt", "params": prompt}
                )
                await gone.asked("session/request_permission")
            async with ws_client(server.ws_url) as client:
                await client.call("initialize", INITIALIZE)
                refused = await client.call("session/new", new)
                assert "has 1 sessions open, the most it may" in refused["error"]["message"]
                assert len(server.runtime.agents.list()) == 1
                assert "result" in await client.call("session/load", {"sessionId": left, **new})
                await client.call("session/close", {"sessionId": left})
                assert "result" in await client.call("session/new", new)


async def test_a_frame_past_the_configured_size_is_refused_naming_it(tmp_path: Path) -> None:
    """Over WebSocket answered an error naming the limit (the socket stays), past twice it
    the socket is closed 1009; over HTTP 413 naming it; a frame within it is served."""
    limits = ServeLimits(frame=8192)
    big = '{"jsonrpc":"2.0","id":"big","method":"session/list","params":{"x":"%s"}}'
    with trio.fail_after(30):
        async with served(tmp_path, limits=limits) as server:
            async with ws_client(server.ws_url) as client:
                await client.call("initialize", INITIALIZE)
                await client.send(big % ("x" * 8192))
                refused = (await client.answer("big"))["error"]
                assert refused["code"] == -32600
                assert "longer than 8,192 bytes" in refused["message"]
                await client.send(big.replace('"big"', '"fits"') % ("x" * 8000))
                assert "sessions" in (await client.answer("fits"))["result"]
                # The limit itself is within it; twice it is answered, the socket kept.
                at = big.replace('"big"', '"at"')
                await client.send(at % ("x" * (8192 - len(at % ""))))
                assert "sessions" in (await client.answer("at"))["result"]
                twice = big.replace('"big"', '"twice"')
                await client.send(twice % ("x" * (2 * 8192 - len(twice % ""))))
                assert "longer than 8,192" in (await client.answer("twice"))["error"]["message"]
                await client.send(big % ("x" * 2 * 8192))
                while not client.closed:
                    await trio.sleep(0.01)
                assert client.socket.closed is not None
                assert client.socket.closed.code == 1009
            async with httpx2.AsyncClient(timeout=10) as http:
                posted = await http.post(
                    server.url,
                    content=(big % ("x" * 8192)).encode(),
                    headers={"content-type": "application/json"},
                )
                assert posted.status_code == 413
                assert "over 8,192 bytes" in posted.text
                at = (big % ("x" * (8192 - len(big % "")))).encode()
                posted = await http.post(
                    server.url, content=at, headers={"content-type": "application/json"}
                )
                assert posted.status_code == 400  # read and decoded: no connection named
