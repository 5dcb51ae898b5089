"""Who may reach ``greenroom serve`` and which sessions each sees: tokens, owners, loopback."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trustme
from trio_websocket import ConnectionRejected

from greenroom.acp.access import AccessTokens, Principal, TokensError, local_request
from greenroom.models.scripted import ScriptedModel
from greenroom.protocol.events import DecisionMade
from greenroom.runtime import open_runtime
from greenroom.session.persistence import JsonlPersistence, Persistence, SqlitePersistence
from greenroom.session.persistence.postgres import PostgresPersistence
from tests import ROOT
from tests.serve_clients import INITIALIZE, HttpClient, WsClient, served, ws_client

pytestmark = pytest.mark.real_clock

ALICE, BOB, ROOT_TOKEN = "alice-token-0123456789", "bob-token-0123456789", "admin-token-0123456789"


def tokens_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "tokens"
    path.write_text(
        f"# who may connect\nalice {ALICE}\nbob {BOB}\n\nroot {ROOT_TOKEN} admin  # all\n"
    )
    path.chmod(mode)
    return path


def test_a_tokens_file_names_each_principal_by_its_token(tmp_path: Path) -> None:
    tokens = AccessTokens.read(tokens_file(tmp_path))
    assert tokens.principal(f"Bearer {ALICE}") == Principal("alice")
    assert tokens.principal(f"bearer {ROOT_TOKEN}") == Principal("root", admin=True)
    assert tokens.principal(f"Bearer {ALICE}x") is None
    assert tokens.principal(ALICE) is None  # no scheme
    assert tokens.principal("") is None


@pytest.mark.parametrize(
    ("text", "mode", "why"),
    [
        (f"alice {ALICE}\n", 0o644, "chmod 600"),
        (f"alice {ALICE}\n", 0o640, "mode 0640"),
        (f"alice {ALICE} root\n", 0o600, "line 1: expected"),
        ("alice short\n", 0o600, "at least 16 characters"),
        (f"alice {ALICE}\nalice {BOB}\n", 0o600, "line 2: principal 'alice' is named twice"),
        (f"alice {ALICE}\nbob {ALICE}\n", 0o600, "line 2: this token is given twice"),
        ("# nobody\n", 0o600, "names no principal"),
    ],
)
def test_a_tokens_file_that_cannot_be_used_is_refused_naming_why(
    tmp_path: Path, text: str, mode: int, why: str
) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(TokensError, match=why):
        AccessTokens.read(path)


def test_without_tokens_only_loopback_hosts_and_origins_are_served() -> None:
    assert local_request("127.0.0.1:8000", "") is None
    assert local_request("localhost:8000", "http://localhost:3000") is None
    assert local_request("[::1]:8000", "https://127.0.0.5") is None
    assert "Host" in (local_request("evil.example:8000", "") or "")
    assert "Origin" in (local_request("127.0.0.1:8000", "https://evil.example") or "")
    assert "Origin" in (local_request("127.0.0.1:8000", "null") or "")
    assert "Host" in (local_request("", "") or "")


async def test_a_request_without_a_valid_token_is_401_with_nothing_said(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, tokens=AccessTokens.read(tokens_file(tmp_path))) as server,
            httpx2.AsyncClient(timeout=20) as http,
        ):
            body = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'
            for headers in ({}, {"authorization": "Bearer wrong-token-0123456789"}):
                for response in (
                    await http.post(
                        server.url,
                        content=body,
                        headers={**headers, "content-type": "application/json"},
                    ),
                    await http.get(server.url, headers=headers),
                    await http.delete(server.url, headers=headers),
                ):
                    assert response.status_code == 401
                    assert response.content == b""
                    assert response.headers["www-authenticate"] == "Bearer"
                token = "wrong-token-0123456789" if headers else None
                with pytest.raises(ConnectionRejected) as rejected:
                    async with ws_client(server.ws_url, token=token):
                        pass
                assert rejected.value.status_code == 401


async def _call_error(client: WsClient, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await client.call(method, params)
    assert "error" in answer, answer
    return dict(answer["error"])


async def test_a_decision_names_the_principal_beside_what_its_client_calls_itself(
    tmp_path: Path,
) -> None:
    """A client may call itself anything ("policy"); the log names its token's principal."""
    with trio.fail_after(30):
        async with (
            served(
                tmp_path,
                ScriptedModel(delay=0),
                tokens=AccessTokens.read(tokens_file(tmp_path)),
                tools=True,
            ) as server,
            ws_client(server.ws_url, token=ALICE) as alice,
        ):
            named = {"clientInfo": {"name": "policy", "version": "1"}}
            await alice.call("initialize", INITIALIZE | named)
            new = await alice.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session = new["result"]["sessionId"]
            prompt = [{"type": "text", "text": "bash: echo hi"}]
            await alice.send(
                {
                    "jsonrpc": "2.0",
                    "id": "run",
                    "method": "session/prompt",
                    "params": {"sessionId": session, "prompt": prompt},
                }
            )
            (asked,) = await alice.asked("session/request_permission")
            await alice.send(
                {
                    "jsonrpc": "2.0",
                    "id": asked["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}},
                }
            )
            assert (await alice.answer("run"))["result"] == {"stopReason": "end_turn"}
            agent = server.runtime.agents.get(session)
            assert agent is not None
            (made,) = [e for e in agent.session.events if isinstance(e, DecisionMade)]
            assert made.by == "policy (alice)"


async def test_each_principal_sees_only_its_own_sessions_and_an_admin_sees_all(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with (
            served(tmp_path, tokens=AccessTokens.read(tokens_file(tmp_path))) as server,
            ws_client(server.ws_url, token=ALICE) as alice,
            ws_client(server.ws_url, token=BOB) as bob,
            ws_client(server.ws_url, token=ROOT_TOKEN) as admin,
        ):
            for client in (alice, bob, admin):
                await client.call("initialize", INITIALIZE)
            new = await alice.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            mine = new["result"]["sessionId"]
            await alice.call(
                "session/prompt", {"sessionId": mine, "prompt": [{"type": "text", "text": "hi"}]}
            )
            await alice.call("session/close", {"sessionId": mine})
            # A session made without a principal (an embedder's): only an admin sees it.
            handle = await server.runtime.agents.create(
                agent_id="unowned", session_id="unowned", cwd=str(tmp_path)
            )
            await handle.dispose()
            load = {"cwd": str(tmp_path), "mcpServers": []}
            absent = await _call_error(bob, "session/load", {"sessionId": "no-such", **load})
            assert absent["code"] == -32002
            for session in (mine, "unowned"):
                for method in ("session/load", "session/resume", "session/fork"):
                    refused = await _call_error(bob, method, {"sessionId": session, **load})
                    assert refused == {
                        **absent,
                        "message": absent["message"].replace("no-such", session),
                    }
                assert (await bob.call("session/delete", {"sessionId": session}))["result"] == {}
                prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "x"}]}
                assert (await _call_error(bob, "session/prompt", prompt))["code"] == -32002
            listed = await bob.call("session/list", {})
            assert listed["result"]["sessions"] == []
            refused = await _call_error(alice, "session/load", {"sessionId": "unowned", **load})
            assert refused["code"] == -32002
            # Bob's delete touched nothing: alice loads hers, the admin sees both.
            assert "result" in await alice.call("session/load", {"sessionId": mine, **load})
            seen = {
                s["sessionId"] for s in (await admin.call("session/list", {}))["result"]["sessions"]
            }
            assert seen == {mine, "unowned"}
            assert "result" in await admin.call("session/load", {"sessionId": "unowned", **load})
            # What alice makes from hers (a fork) is hers too.
            fork = await alice.call("session/fork", {"sessionId": mine, **load})
            forked = fork["result"]["sessionId"]
            header, _ = await server.runtime.persistence.load(forked)  # type: ignore[union-attr]
            assert header.principal == "alice"


async def test_an_http_connection_is_its_principals_alone(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, tokens=AccessTokens.read(tokens_file(tmp_path))) as server,
            httpx2.AsyncClient(timeout=20) as http,
        ):
            alice = HttpClient(http, server.url, ALICE)
            await alice.call("initialize", INITIALIZE)
            bob = HttpClient(http, server.url, BOB)
            bob.connection = alice.connection  # bob names alice's connection
            listed = await bob.post({"jsonrpc": "2.0", "id": 1, "method": "session/list"})
            assert listed.status_code == 404
            assert (await http.get(server.url, headers=bob.headers())).status_code == 404
            assert (await http.delete(server.url, headers=bob.headers())).status_code == 404
            assert "result" in await alice.call("session/list", {})


async def test_without_tokens_a_browser_page_from_elsewhere_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, httpx2.AsyncClient(timeout=20) as http:
            body = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'
            json_type = {"content-type": "application/json"}
            evil = await http.post(
                server.url, content=body, headers={**json_type, "origin": "https://evil.example"}
            )
            assert evil.status_code == 403
            assert "Origin" in evil.text
            rebound = await http.post(
                server.url, content=body, headers={**json_type, "host": "evil.example"}
            )
            assert rebound.status_code == 403
            local = await http.post(
                server.url, content=body, headers={**json_type, "origin": "http://localhost:3000"}
            )
            assert local.status_code == 200


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
async def test_every_store_keeps_a_sessions_principal_in_its_header(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    def store() -> Persistence:
        if backend == "jsonl":
            return JsonlPersistence(tmp_path)
        if backend == "sqlite":
            return SqlitePersistence(tmp_path / "db.sqlite")
        return PostgresPersistence(request.getfixturevalue("postgres_dsn"))

    with trio.fail_after(60):
        persistence = store()
        try:
            async with open_runtime(model=ScriptedModel(), persistence=persistence) as runtime:
                for session_id, principal in (("owned", "alice"), ("unowned", None)):
                    handle = await runtime.agents.create(
                        agent_id=session_id,
                        session_id=session_id,
                        cwd=str(tmp_path),
                        principal=principal,
                    )
                    await handle.dispose()
        finally:
            close = getattr(persistence, "close", None)
            if close is not None:
                close()
        reader = store()
        try:
            assert (await reader.load("owned"))[0].principal == "alice"
            assert (await reader.load("unowned"))[0].principal is None
            listed = {s.header.id: s.header.principal for s in await reader.list()}
            assert listed == {"owned": "alice", "unowned": None}
        finally:
            close = getattr(reader, "close", None)
            if close is not None:
                close()


def test_a_header_written_before_principals_reads_as_unowned(tmp_path: Path) -> None:
    import msgspec

    from greenroom.protocol.events import SessionHeader

    old = b'{"type":"session","version":0,"id":"old","created_at":1,"cwd":"/"}'
    assert msgspec.json.decode(old, type=SessionHeader).principal is None


async def test_serve_over_tls_with_cert_and_key(tmp_path: Path) -> None:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with trio.fail_after(30):
        async with served(tmp_path, cert=cert, key=key) as server:
            assert server.url.startswith("https://")
            async with ws_client(server.ws_url, ssl_context=context) as client:
                assert "result" in await client.call("initialize", INITIALIZE)
            async with httpx2.AsyncClient(timeout=20, verify=context) as http:
                assert "result" in await HttpClient(http, server.url).call("initialize", INITIALIZE)


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        (["--listen", "0.0.0.0:0"], "without --tokens greenroom serve listens on loopback only"),
        (["--listen", "127.0.0.1"], "--listen takes HOST:PORT"),
        (["--listen", "127.0.0.1:0", "--tokens", "TOKENS"], "chmod 600"),
        (["--listen", "127.0.0.1:0", "--cert", "x.pem"], "--cert and --key go together"),
        (["--listen", "127.0.0.1:0", "--max-frame", "100"], "--max-frame must be at least 4,096"),
    ],
)
def test_greenroom_serve_refuses_at_start_what_it_cannot_serve_safely(
    tmp_path: Path, arguments: list[str], why: str
) -> None:
    path = tokens_file(tmp_path, mode=0o644)
    command = [sys.executable, "-m", "greenroom", "serve", "--store", f"jsonl:{tmp_path}"]
    done = subprocess.run(
        [*command, *(str(path) if a == "TOKENS" else a for a in arguments)],
        cwd=ROOT,
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert why in done.stderr
