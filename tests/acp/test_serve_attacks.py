"""``greenroom serve`` under a hostile client, over real loopback sockets: each attack is
refused with a clear error, touches no one else's session, and leaves the server answering
the next client."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path

import httpx2
import hypothesis
import hypothesis.strategies as st
import pytest
import trio

from greenroom.acp.access import AccessTokens, Principal, TokensError, local_request
from greenroom.acp.network import ServeLimits
from greenroom.acp.serve import check_listen
from greenroom.models.scripted import ScriptedModel
from tests.serve_clients import INITIALIZE, HttpClient, Served, served, ws_client

pytestmark = pytest.mark.real_clock

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"


def tokens(tmp_path: Path) -> AccessTokens:
    path = tmp_path / "tokens"
    path.write_text(f"alice {ALICE}\nbob {BOB}\n")
    path.chmod(0o600)
    return AccessTokens.read(path)


def port(server: Served) -> int:
    return int(server.url.removeprefix("http://").removesuffix("/acp").rsplit(":", 1)[1])


async def raw(server: Served, head: bytes, body: bytes = b"") -> tuple[int, bytes, bytes]:
    """Send `head` (request line and headers, no blank line) and `body` on a fresh socket;
    the answer's status, head and body, read until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port(server))
    async with stream:
        await stream.send_all(head + b"\r\nConnection: close\r\n\r\n" + body)
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
    answer_head, _, answer_body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in answer_head.lower():
        answer_body = dechunk(answer_body)
    return int(answer_head.split(b" ", 2)[1]), answer_head, answer_body


def dechunk(data: bytes) -> bytes:
    body = b""
    while True:
        size, _, data = data.partition(b"\r\n")
        if not int(size, 16):
            return body
        body, data = body + data[: int(size, 16)], data[int(size, 16) + 2 :]


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


async def test_no_route_reaches_a_live_session_of_another_principal(tmp_path: Path) -> None:
    """Bob names alice's live session, mid-turn, in every request that takes a session id:
    each is refused, and alice's turn, mode and log are untouched."""
    with trio.fail_after(20):
        async with (
            served(tmp_path, ScriptedModel(delay=0.02), tokens=tokens(tmp_path)) as server,
            ws_client(server.ws_url, token=ALICE) as alice,
            ws_client(server.ws_url, token=BOB) as bob,
        ):
            for client in (alice, bob):
                await client.call("initialize", INITIALIZE)
            where = {"cwd": str(tmp_path), "mcpServers": []}
            session = (await alice.call("session/new", where))["result"]["sessionId"]
            words = " ".join(["word"] * 100)  # a turn of about 2 s
            turn = {"sessionId": session, "prompt": [{"type": "text", "text": words}]}
            await alice.send(
                {"jsonrpc": "2.0", "id": "turn", "method": "session/prompt", "params": turn}
            )
            await alice.asked("session/update")  # the turn runs
            named = {"sessionId": session}
            await bob.send({"jsonrpc": "2.0", "method": "session/cancel", "params": named})
            for method, params in [
                ("session/load", {**named, **where}),
                ("session/resume", {**named, **where}),
                ("session/fork", {**named, **where}),
                ("session/prompt", turn),
                ("session/set_mode", {**named, "modeId": "read-only"}),
                ("session/set_config_option", {**named, "configId": "mode", "value": "plan"}),
                ("session/close", named),
            ]:
                answer = await bob.call(method, params)
                assert answer["error"]["code"] == -32002, (method, answer)
                assert answer["error"]["message"] == f"unknown session {session!r}"
            assert (await bob.call("session/delete", named))["result"] == {}
            assert (await bob.call("session/list", {}))["result"]["sessions"] == []
            assert bob.updates(session) == []
            done = await alice.answer("turn")
            assert done["result"]["stopReason"] == "end_turn"
            changed = {u["sessionUpdate"] for u in alice.updates(session)}
            assert not changed & {"current_mode_update", "config_option_update"}
            header, _ = await server.runtime.persistence.load(session)  # type: ignore[union-attr]
            assert header.principal == "alice"
            await still_serves(server, BOB)


UPGRADE = (
    b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
)


async def handshake(server: Served, headers: bytes) -> tuple[int, bytes]:
    """A WebSocket handshake with `headers`: the answer's status and what came with it."""
    async with await trio.open_tcp_stream("127.0.0.1", port(server)) as stream:
        await stream.send_all(b"GET /acp HTTP/1.1\r\n" + headers + b"\r\n" + UPGRADE + b"\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data and (chunk := await stream.receive_some()):
            data += chunk
        with trio.move_on_after(0.2):  # a refusal's body
            while chunk := await stream.receive_some():
                data += chunk
    return int(data.split(b" ", 2)[1]), data


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        (b"Host: evil.example", b"Host 'evil.example'"),
        (b"Host: localhost.evil.example", b"Host 'localhost.evil.example'"),
        (b"Host: 127.0.0.1.nip.io", b"Host '127.0.0.1.nip.io'"),
        (b"Host: 2130706433", b"Host '2130706433'"),
        (b"Host: 127.0.0.1\r\nOrigin: http://evil.example", b"Origin 'http://evil.example'"),
        (b"Host: 127.0.0.1\r\nOrigin: null", b"Origin 'null'"),
        (b"Host: [::1]\r\nOrigin: http://localhost.evil.example", b"Origin 'http://localh"),
        (b"Host: 127.0.0.1\r\nOrigin: http://[::ffff:7f00:1]", b"Origin 'http://[::ffff"),
        (b"Host: [", b"Host '['"),
        (b"Host: [::1\r\nOrigin: http://[::1]", b"Host '[::1'"),
        (b"Host: 127.0.0.1\r\nOrigin: http://[::1", b"Origin 'http://[::1'"),
        (b"Host: 127.0.0.1\r\nOrigin: http://[evil.example]", b"Origin 'http://[evil"),
        (b"Host: [::1]", None),
        (b"Host: LOCALHOST:1\r\nOrigin: http://127.3.2.1:8080", None),
    ],
)
async def test_without_tokens_only_a_loopback_host_and_origin_reach_either_transport(
    tmp_path: Path, headers: bytes, refused: bytes | None
) -> None:
    with trio.fail_after(10):
        async with served(tmp_path) as server:
            body = json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}
            ).encode()
            length = b"\r\nContent-Type: application/json\r\nContent-Length: %d" % len(body)
            status, _, answer = await raw(
                server, b"POST /acp HTTP/1.1\r\n" + headers + length, body
            )
            upgraded, said = await handshake(server, headers)
            if refused is None:
                assert (status, upgraded) == (200, 101)
            else:
                assert (status, upgraded) == (403, 403)
                assert refused in answer
                assert refused in said
            await still_serves(server)


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("evil@127.0.0.1", ""),
        ("127.0.0.1@evil.example", ""),
        ("127.0.0.1/path", ""),
        ("127.0.0.1:port", ""),
        ("127.0.0.1", "http://evil@127.0.0.1"),
        ("127.0.0.1", "http://127.0.0.1/path"),
        ("127.0.0.1", "http://127.0.0.1:99999"),
    ],
)
def test_a_host_or_origin_that_is_more_than_its_header_holds_is_refused(
    host: str, origin: str
) -> None:
    """A user part, a path, a bad port: refused, never read past to a loopback name."""
    why = local_request(host, origin)
    assert why is not None
    assert why.startswith("Origin" if origin else "Host")
    assert local_request("127.0.0.1:8080", "http://localhost:8080") is None


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(host=st.text(max_size=40), origin=st.text(max_size=40))
def test_any_host_and_origin_is_served_or_refused_never_raises(host: str, origin: str) -> None:
    """Whatever the headers hold (an unclosed bracket, a bracketed name, any character),
    the answer is served or refused naming which header, never an exception (a 500)."""
    why = local_request(host, origin)
    assert why is None or why.startswith(("Host ", "Origin "))


@pytest.mark.parametrize(
    "authorization",
    [
        b"Bearer " + ALICE[:-1].encode(),
        b"Bearer " + ALICE.encode() + b"x",
        b"Bearer " + ALICE.upper().encode(),
        b"Bearer\t" + ALICE.encode(),
        b"Basic " + ALICE.encode(),
        b"Bearer alice",
        b"Bearer ",
        b"Bearer " + ALICE.encode() + b"\xa0",
        b"Bearer wrong-token-0123456789\r\nAuthorization: Bearer " + ALICE.encode(),
    ],
)
async def test_a_token_that_is_not_exactly_a_principals_is_401_with_nothing_said(
    tmp_path: Path, authorization: bytes
) -> None:
    with trio.fail_after(10):
        async with served(tmp_path, tokens=tokens(tmp_path)) as server:
            headers = b"Host: 127.0.0.1\r\nAuthorization: " + authorization
            status, head, body = await raw(server, b"GET /acp HTTP/1.1\r\n" + headers)
            assert (status, body) == (401, b"")
            assert b"\r\nwww-authenticate: Bearer\r\n" in head
            upgraded, said = await handshake(server, headers)
            assert upgraded == 401
            assert said.endswith(b"\r\n\r\n")  # nothing after the head
            await still_serves(server, ALICE)


def test_a_token_no_client_could_present_is_refused_at_start(tmp_path: Path) -> None:
    """A header is read as Latin-1 and the file as UTF-8: a non-ASCII token would be taken
    and never match, a principal nobody can be."""
    path = tmp_path / "tokens"
    path.write_text(f"alice {ALICE}\ncarol tökén-0123456789abcdef\n", encoding="utf-8")
    path.chmod(0o600)
    with pytest.raises(TokensError, match="line 2: a token is printable ASCII"):
        AccessTokens.read(path)


def test_a_tokens_file_through_a_symlink_is_held_to_its_targets_mode(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.write_text(f"alice {ALICE}\n")
    link = tmp_path / "tokens"
    link.symlink_to(target)
    target.chmod(0o644)
    with pytest.raises(TokensError, match="chmod 600"):
        AccessTokens.read(link)
    target.chmod(0o600)
    assert AccessTokens.read(link).principal(f"Bearer {ALICE}") == Principal("alice")


async def test_a_chunked_body_past_the_limit_is_413_and_not_read_on(tmp_path: Path) -> None:
    with trio.fail_after(15):
        async with served(tmp_path) as server:
            async with await trio.open_tcp_stream("127.0.0.1", port(server)) as stream:
                await stream.send_all(
                    b"POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                    b"\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
                answer = b""

                async def flood() -> None:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        for _ in range(64):  # 64 MiB, far past the 8 MiB read
                            await stream.send_all(chunk)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(flood)
                    while b"\r\n\r\n" not in answer:
                        answer += await stream.receive_some()
                    nursery.cancel_scope.cancel()
            assert answer.startswith(b"HTTP/1.1 413 ")
            await still_serves(server)


async def test_streams_that_pile_up_on_one_connection_end_and_let_it_idle_out(
    tmp_path: Path,
) -> None:
    """Twenty streams opened at once on one connection: each new one ends the one before,
    none is left holding the connection, which then ends when idle as any does."""
    with trio.fail_after(15):
        async with served(tmp_path, idle=0.5) as server, httpx2.AsyncClient(timeout=5) as http:
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            ended = 0

            async def stream(task_status: trio.TaskStatus[None]) -> None:
                nonlocal ended
                await client.listen(task_status=task_status)
                ended += 1

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    await nursery.start(stream)
                while ended < 19:  # each ended by the next; the last one open
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()  # the client drops the last one
            # Nothing holds the connection: it idles out.
            while server.runtime.agents.get(session_id) is not None:
                await trio.sleep(0.05)
            assert (
                await client.post({"jsonrpc": "2.0", "id": 9, "method": "x"})
            ).status_code == 404
            await still_serves(server)


async def test_a_request_id_reused_while_it_waits_is_409_and_the_first_is_answered(
    tmp_path: Path,
) -> None:
    with trio.fail_after(15):
        model = ScriptedModel(delay=0.01)
        async with served(tmp_path, model) as server, httpx2.AsyncClient(timeout=5) as http:
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            words = " ".join(["word"] * 100)
            prompt = {
                "jsonrpc": "2.0",
                "id": "same",
                "method": "session/prompt",
                "params": {
                    "sessionId": new["result"]["sessionId"],
                    "prompt": [{"type": "text", "text": words}],
                },
            }
            answers: list[httpx2.Response] = []

            async def first() -> None:
                answers.append(await client.post(prompt))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await trio.sleep(0.3)
                again = await client.post(prompt)
                assert again.status_code == 409
                assert "'same' is already waiting" in again.text
            assert answers[0].json()["result"]["stopReason"] == "end_turn"


def frame(opcode: int, payload: bytes, *, fin: bool = True, length: int | None = None) -> bytes:
    """A client's WebSocket frame (masked with a zero key, so the payload reads as is)."""
    size = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | opcode])
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(
            frame(1, b'{"jsonrpc":"2.0","id":1,"\xff"}'), id="invalid UTF-8 in a text message"
        ),
        pytest.param(frame(2, b"", length=(1 << 63) - 1), id="a length past any message"),
        pytest.param(frame(3, b"x"), id="an unknown opcode"),
        pytest.param(frame(0, b"x"), id="a continuation with no message"),
        pytest.param(frame(9, b"p" * 125) * 20_000, id="a ping flood, no pong read"),
        pytest.param(frame(2, b"\0" * 1000) * 2_000, id="a binary flood"),
        pytest.param(frame(9, b"p" * 200), id="a control frame past 125 bytes"),
        pytest.param(
            frame(1, b" ", fin=False) * 10_000 + frame(0, b"{"), id="a message in 10,000 fragments"
        ),
    ],
)
async def test_a_websocket_that_breaks_the_protocol_ends_itself_only(
    tmp_path: Path, frames: bytes
) -> None:
    with trio.fail_after(15):
        async with served(tmp_path) as server:
            async with await trio.open_tcp_stream("127.0.0.1", port(server)) as stream:
                await stream.send_all(
                    b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + UPGRADE + b"\r\n\r\n"
                )
                head = b""
                while b"\r\n\r\n" not in head:
                    head += await stream.receive_some()
                assert head.startswith(b"HTTP/1.1 101 ")
                # A client that reads nothing back is held up by TCP once the server's
                # answers (pongs, errors) fill the socket: the others are served meanwhile.
                with (
                    trio.move_on_after(2),
                    contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                ):
                    await stream.send_all(frames)
                await still_serves(server)
            await still_serves(server)


@pytest.mark.parametrize("cursor", ["\u00b2", "\u0669", "9" * 5000, "-1", "1.0"])
async def test_a_list_cursor_that_is_not_ours_is_refused_and_the_connection_stays(
    tmp_path: Path, cursor: str
) -> None:
    with trio.fail_after(10):
        async with served(tmp_path) as server, ws_client(server.ws_url) as client:
            await client.call("initialize", INITIALIZE)
            answer = await client.call("session/list", {"cursor": cursor})
            assert answer["error"]["code"] == -32602, answer
            assert "is not ours" in answer["error"]["message"]
            assert "result" in await client.call("session/list", {})


@pytest.mark.parametrize("number", ["\u00b2", "9" * 5000, "-1", "65536"])
def test_a_listen_port_that_is_no_port_is_refused_naming_the_form(number: str) -> None:
    with pytest.raises(ValueError, match="--listen takes HOST:PORT"):
        check_listen(f"127.0.0.1:{number}", None)


@pytest.mark.parametrize("host", ["unix:/tmp/greenroom.sock", "fd://3", "::1", "[::1"])
def test_a_listen_host_that_is_no_name_nor_address_is_refused(host: str) -> None:
    """Hypercorn's other binds (a Unix socket, a file descriptor) and an unbracketed IPv6."""
    tokens = AccessTokens({b"digest": Principal("alice")})
    with pytest.raises(ValueError, match="--listen takes HOST:PORT"):
        check_listen(f"{host}:8080", tokens)
    check_listen("[::1]:8080", tokens)


async def test_connections_opened_and_walked_away_from_are_given_back(tmp_path: Path) -> None:
    """A client that initializes over HTTP and goes holds a connection until it idles out,
    then the slot is free again; one that drops a WebSocket mid-initialize frees it at
    once."""
    limits = ServeLimits(connections=3)
    with trio.fail_after(15):
        async with served(tmp_path, idle=2, limits=limits) as server:
            body = json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}
            ).encode()
            for _ in range(3):
                async with await trio.open_tcp_stream("127.0.0.1", port(server)) as stream:
                    await stream.send_all(
                        b"POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                        b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    # The answer's head (the connection is open), then gone.
                    head = b""
                    while b"acp-connection-id" not in head.lower():
                        head += (chunk := await stream.receive_some())
                        assert chunk, "closed before the answer"
            async with httpx2.AsyncClient(timeout=5) as http:
                refused = await HttpClient(http, server.url).post(body)
                assert refused.status_code == 429
                assert "has 3 connections open, the most it may" in refused.text
                while (await HttpClient(http, server.url).post(body)).status_code == 429:
                    await trio.sleep(0.1)  # each walked-away connection idles out
            for _ in range(50):
                async with ws_client(server.ws_url) as client:
                    await client.send({"jsonrpc": "2.0", "id": 1, "method": "initialize"})
            await still_serves(server)


async def test_an_event_stream_nobody_reads_holds_no_turn(tmp_path: Path) -> None:
    """A stream opened and never read while a long turn streams thousands of updates: the
    turn ends on time and its answer comes; the server serves others meanwhile."""
    with trio.fail_after(20):
        async with (
            served(tmp_path, ScriptedModel(delay=0)) as server,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            assert client.connection is not None
            async with await trio.open_tcp_stream("127.0.0.1", port(server)) as stalled:
                stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await stalled.send_all(
                    b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAcp-Connection-Id: "
                    + client.connection.encode()
                    + b"\r\n\r\n"
                )  # and never read
                words = " ".join(["word" * 250] * 8000)  # about 8 MB of updates
                prompt = {
                    "sessionId": new["result"]["sessionId"],
                    "prompt": [{"type": "text", "text": words}],
                }
                answer = await client.call("session/prompt", prompt)
                assert answer["result"]["stopReason"] == "end_turn"
                assert int(client.last_response.headers["acp-last-event-id"]) > 8000  # type: ignore[union-attr]
                await still_serves(server)


async def test_a_websocket_that_never_initializes_is_ended_when_idle(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with served(tmp_path, idle=0.5) as server, ws_client(server.ws_url) as client:
            with trio.move_on_after(3):
                while not client.closed:
                    await trio.sleep(0.05)
            assert client.closed


async def test_a_post_whose_body_never_comes_is_ended(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with served(tmp_path, idle=0.5) as server:
            async with await trio.open_tcp_stream("127.0.0.1", port(server)) as stream:
                await stream.send_all(
                    b"POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                    b"\r\nContent-Length: 1000\r\n\r\n{"
                )
                with trio.move_on_after(3):
                    while await stream.receive_some():
                        pass
                    return  # the server ended it
            raise AssertionError("the server still waits for the body")
