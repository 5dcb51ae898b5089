"""``greenroom serve``: ACP over WebSocket and HTTP at /acp, real clients over loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import trio

from greenroom.acp.frames import MAX_FRAME
from greenroom.acp.network import CONNECTION_HEADER, EVENTS_HEADER
from greenroom.models.scripted import ScriptedModel
from greenroom.protocol.events import Completed, TurnEnd
from greenroom.session.persistence import JsonlPersistence
from tests import ROOT
from tests.serve_clients import INITIALIZE, HttpClient, said, served, ws_client

pytestmark = pytest.mark.real_clock


async def test_a_prompt_over_websocket_streams_its_updates_then_its_answer(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, ws_client(server.ws_url) as client:
            assert "result" in await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            answer = await client.call(
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": "hello there"}]},
            )
            assert answer["result"] == {"stopReason": "end_turn"}
            # Every update of the turn came before its answer, on the same socket.
            position = client.frames.index(answer)
            before = [f for f in client.frames[:position] if f.get("method") == "session/update"]
            assert "hello there" in said([f["params"]["update"] for f in before])


async def test_websocket_messages_that_are_no_frame_are_answered_and_the_socket_stays(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, ws_client(server.ws_url) as client:
            await client.call("initialize", INITIALIZE)
            # Over the frame limit: scanned, never decoded, answered with its id.
            big = '{"jsonrpc":"2.0","id":"big","method":"session/list","params":{"x":"%s"}}'
            await client.send(big % ("x" * MAX_FRAME))
            assert (await client.answer("big"))["error"]["code"] == -32600
            await client.socket.send_message(b"\x00binary")
            await client.send('{"jsonrpc":"2.0","id":"pretty",\n "method":"session/list"}')
            assert "sessions" in (await client.answer("pretty"))["result"]
            binary = [f for f in client.frames if f.get("id") is None]
            assert "text message" in binary[0]["error"]["message"]


async def test_closing_the_websocket_mid_turn_lets_the_turn_end_then_the_session(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(delay=0.2)  # the echo outlasts the socket
    with trio.fail_after(30):
        async with served(tmp_path, model) as server:
            async with ws_client(server.ws_url) as client:
                await client.call("initialize", INITIALIZE)
                new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
                session_id = new["result"]["sessionId"]
                await client.send(
                    {
                        "jsonrpc": "2.0",
                        "id": "p",
                        "method": "session/prompt",
                        "params": {
                            "sessionId": session_id,
                            "prompt": [{"type": "text", "text": "a b c d e"}],
                        },
                    }
                )
                while not client.updates(session_id):
                    await trio.sleep(0.01)
            # No client: the turn runs on to its end, then the session goes.
            agent = server.runtime.agents.get(session_id)
            assert agent is not None
            assert agent.status == "running"
            while server.runtime.agents.get(session_id) is not None:
                await trio.sleep(0.01)
    _, events = await JsonlPersistence(tmp_path).load(session_id)
    (end,) = [e for e in events if isinstance(e, TurnEnd)]
    assert end.reason == Completed()


async def test_a_prompt_over_http_answers_on_its_post_and_streams_updates_as_events(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path) as server,
            httpx2.AsyncClient(timeout=20) as http,
            trio.open_nursery() as nursery,
        ):
            client = HttpClient(http, server.url)
            init = await client.call("initialize", INITIALIZE)
            assert init["result"]["protocolVersion"] == 1
            assert client.connection
            await nursery.start(client.listen)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            answer = await client.call(
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": "over http"}]},
            )
            assert answer["result"] == {"stopReason": "end_turn"}
            # The answer names the last event sent before it: the whole turn is up to there.
            assert client.last_response is not None
            last = int(client.last_response.headers[EVENTS_HEADER])
            await client.wait_for(last)
            turn = [e["params"]["update"] for n, e in client.events if n <= last]
            assert "over http" in said(turn)
            numbers = [number for number, _ in client.events]
            assert numbers == list(range(1, len(numbers) + 1))
            # A notification answers 202 with nothing.
            cancel = await client.post(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
            )
            assert (cancel.status_code, cancel.content) == (202, b"")
            nursery.cancel_scope.cancel()


async def test_a_stream_reopened_with_last_event_id_gets_exactly_what_came_after(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, httpx2.AsyncClient(timeout=20) as http:
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            # No stream open: the turn's events are kept for the stream to come.
            await client.call(
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": "one two three"}]},
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(client.listen)
                await client.wait_for(3)
                nursery.cancel_scope.cancel()
            first = client.events[:2]
            client.events.clear()
            async with trio.open_nursery() as nursery:
                await nursery.start(client.listen, first[-1][0])
                await client.wait_for(1)
                await trio.sleep(0.2)  # nothing more comes than what was kept
                nursery.cancel_scope.cancel()
            assert client.events[0][0] == first[-1][0] + 1
            assert "one two three" in said(
                [e["params"]["update"] for _, e in first + client.events]
            )
            # Events up to the acknowledged one were let go: asking for them is refused.
            gone = await http.get(
                server.url, headers={CONNECTION_HEADER: client.connection, "last-event-id": "0"}
            )
            assert gone.status_code == 409
            assert "Last-Event-ID 0" in gone.text


async def test_http_requests_that_are_not_acp_are_refused_with_a_status_that_names_why(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, httpx2.AsyncClient(timeout=20) as http:
            json_type = {"content-type": "application/json"}
            prompt = json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}}
            ).encode()
            missing = await http.post(server.url, content=prompt, headers=json_type)
            assert missing.status_code == 400
            assert CONNECTION_HEADER in missing.text
            unknown = await http.post(
                server.url, content=prompt, headers={**json_type, CONNECTION_HEADER: "nope"}
            )
            assert unknown.status_code == 404
            wrong_type = await http.post(server.url, content=prompt)
            assert wrong_type.status_code == 415
            too_large = await http.post(
                server.url, content=b" " * (MAX_FRAME + 1), headers=json_type
            )
            assert too_large.status_code == 413
            assert (await http.put(server.url)).status_code == 405
            assert (await http.get(server.url.removesuffix("/acp") + "/other")).status_code == 404
            assert (await http.get(server.url)).status_code == 404  # no connection named
            # A body that is no frame is answered as over stdio: a JSON-RPC error.
            garbage = await http.post(server.url, content=b"{not json", headers=json_type)
            assert garbage.status_code == 200
            assert garbage.json()["error"]["code"] == -32700
            # The server is still up.
            client = HttpClient(http, server.url)
            assert "result" in await client.call("initialize", INITIALIZE)


async def test_delete_ends_an_http_connection_and_its_sessions(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, httpx2.AsyncClient(timeout=20) as http:
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            assert server.runtime.agents.get(session_id) is not None
            deleted = await http.delete(server.url, headers={CONNECTION_HEADER: client.connection})
            assert deleted.status_code == 204
            while server.runtime.agents.get(session_id) is not None:
                await trio.sleep(0.01)
            after = await client.post({"jsonrpc": "2.0", "id": 9, "method": "session/list"})
            assert after.status_code == 404


async def test_an_idle_http_connection_is_ended(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path, idle=0.3) as server, httpx2.AsyncClient(timeout=20) as http:
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            while server.runtime.agents.get(session_id) is not None:
                await trio.sleep(0.05)
            after = await client.post({"jsonrpc": "2.0", "id": 9, "method": "session/list"})
            assert after.status_code == 404


async def test_greenroom_serve_listens_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "greenroom",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        f"jsonl:{tmp_path}",
        "--titles",
        "model",
    ]
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            command, stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ}
        )
        assert process.stderr is not None
        said_so = b""
        while b"/acp\n" not in said_so:
            chunk = await process.stderr.receive_some()
            assert chunk, said_so.decode()
            said_so += chunk
        url = said_so.decode().split("listening on ")[1].split()[0]
        async with ws_client("ws" + url.removeprefix("http")) as client:
            booleans = {"session": {"configOptions": {"boolean": {}}}}
            await client.call("initialize", {**INITIALIZE, "clientCapabilities": booleans})
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            assert "sessionId" in new["result"]
            # --titles model is the default of the sessions it serves.
            [titles] = [o for o in new["result"]["configOptions"] if o["id"] == "titles"]
            assert titles["currentValue"] is True
        process.send_signal(signal.SIGTERM)
        assert await process.wait() == 0
