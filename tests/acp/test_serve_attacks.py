"""``greenroom serve`` under a hostile client, over real loopback sockets: each attack is
refused with a clear error, touches no one else's session, and leaves the server answering
the next client."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
import trio

from greenroom.acp.access import AccessTokens
from tests.serve_clients import INITIALIZE, HttpClient, Served, served, ws_client

pytestmark = pytest.mark.real_clock

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"


def tokens(tmp_path: Path) -> AccessTokens:
    path = tmp_path / "tokens"
    path.write_text(f"alice {ALICE}\nbob {BOB}\n")
    path.chmod(0o600)
    return AccessTokens.read(path)


async def raw(server: Served, head: bytes, body: bytes = b"") -> tuple[int, bytes, bytes]:
    """Send `head` (request line and headers, no blank line) and `body` on a fresh socket;
    the answer's status, head and body, read until the server closes."""
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head + b"\r\nConnection: close\r\n\r\n" + body)
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
    answer_head, _, answer_body = data.partition(b"\r\n\r\n")
    return int(answer_head.split(b" ", 2)[1]), answer_head, answer_body


async def still_serves(server: Served, token: str | None = None) -> None:
    """A normal client is served: it initializes over HTTP and over a WebSocket."""
    async with httpx2.AsyncClient(timeout=5) as http:
        assert "result" in await HttpClient(http, server.url, token).call("initialize", INITIALIZE)
    async with ws_client(server.ws_url, token=token) as client:
        assert "result" in await client.call("initialize", INITIALIZE)


@pytest.mark.parametrize("last", [b"\xb2", b"\xb9", b"-1", b"1e3", b"9" * 19, b"x" * 4000])
async def test_a_last_event_id_that_is_no_number_is_400(tmp_path: Path, last: bytes) -> None:
    with trio.fail_after(10):
        async with served(tmp_path) as server, httpx2.AsyncClient(timeout=5) as http:
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            assert client.connection is not None
            status, _, body = await raw(
                server,
                b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAcp-Connection-Id: "
                + client.connection.encode()
                + b"\r\nLast-Event-ID: "
                + last,
            )
            assert status == 400
            assert b"Last-Event-ID must be an event's number" in body
            await still_serves(server)
