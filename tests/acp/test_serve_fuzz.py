"""The ACP reader's fuzz over the network: no frame, sent over WebSocket or posted over HTTP,
ends the connection, and every frame with a usable id is answered exactly once.

The hostile frames are `tests.acp.test_fuzz`'s (arbitrary bytes and JSON, nesting to
100,000 levels, frames over the size limit, real frames mutated). Each example runs a
server of its own on loopback, so the counts stay modest.
"""

from __future__ import annotations

import json

import httpx2
import hypothesis
import hypothesis.strategies as st
import pytest
import trio

from greenroom.acp.frames import MAX_FRAME
from greenroom.models.scripted import ScriptedModel
from tests.acp.test_fuzz import hostile
from tests.serve_clients import INITIALIZE, HttpClient, served, ws_client

pytestmark = pytest.mark.real_clock

EXAMPLES = 20
STILL_HERE = [{"type": "text", "text": "still here"}]
Frames = list[tuple[bytes, str | int | None]]


@hypothesis.settings(max_examples=EXAMPLES, deadline=None)
@hypothesis.given(frames=st.lists(hostile, min_size=1, max_size=4))
async def test_no_frame_ends_a_websocket_connection(
    tmp_path_factory: pytest.TempPathFactory, frames: Frames
) -> None:
    tmp_path = tmp_path_factory.mktemp("fuzz")  # a store of its own per example
    with trio.fail_after(60):
        async with (
            served(tmp_path, ScriptedModel(delay=0)) as server,
            ws_client(server.ws_url) as client,
        ):
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session = new["result"]["sessionId"]
            ids: list[str | int] = []
            for raw, usable_id in frames:
                text = raw.replace(b"SESSION", session.encode()).decode("utf-8", "replace")
                await client.send(text)
                if usable_id is not None:
                    ids.append(usable_id)
            prompt = await client.call(
                "session/prompt", {"sessionId": session, "prompt": STILL_HERE}
            )
            assert prompt["result"] == {"stopReason": "end_turn"}, prompt
            for usable_id in ids:
                await client.answer(usable_id)
            await trio.sleep(0.05)  # an answer twice would be here by now
            for usable_id in set(ids):
                answers = [
                    f for f in client.frames if f.get("id") == usable_id and "method" not in f
                ]
                assert len(answers) == ids.count(usable_id), (usable_id, answers)
            for frame in client.frames:
                assert frame["jsonrpc"] == "2.0"
                assert "method" in frame or (("result" in frame) != ("error" in frame))


@hypothesis.settings(max_examples=EXAMPLES, deadline=None)
@hypothesis.given(frames=st.lists(hostile, min_size=1, max_size=4))
async def test_no_body_ends_an_http_connection(
    tmp_path_factory: pytest.TempPathFactory, frames: Frames
) -> None:
    tmp_path = tmp_path_factory.mktemp("fuzz")  # a store of its own per example
    with trio.fail_after(60):
        async with (
            served(tmp_path, ScriptedModel(delay=0)) as server,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            client = HttpClient(http, server.url)
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session = new["result"]["sessionId"]
            for raw, usable_id in frames:
                response = await client.post(raw.replace(b"SESSION", session.encode()))
                if len(raw) > MAX_FRAME:
                    assert response.status_code == 413
                    continue
                assert response.status_code in (200, 202), response.text
                if response.status_code == 202:
                    assert usable_id is None
                    continue
                answer = json.loads(response.content)
                assert answer["jsonrpc"] == "2.0"
                assert ("result" in answer) != ("error" in answer)
                if usable_id is not None:
                    assert answer["id"] == usable_id
            prompt = await client.call(
                "session/prompt", {"sessionId": session, "prompt": STILL_HERE}
            )
            assert prompt["result"] == {"stopReason": "end_turn"}, prompt
