"""Reconnect without loss: every update tells its place in the log (``_meta.greenroom.seq``),
and a load with ``_meta.greenroom.after`` replays only what came after it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from greenroom.models.scripted import ScriptedModel
from greenroom.protocol.events import AssistantChunk, TurnEnd
from greenroom.protocol.model import TextDelta
from tests.serve_clients import INITIALIZE, WsClient, served, ws_client

pytestmark = pytest.mark.real_clock

WORDS = "one two three four five six seven eight"


def chunks(client: WsClient, session: str) -> list[tuple[int, str]]:
    """The agent's text chunks the client got, each with its seq."""
    return [
        (f["params"]["_meta"]["greenroom"]["seq"], f["params"]["update"]["content"]["text"])
        for f in client.frames
        if f.get("method") == "session/update"
        and f["params"]["sessionId"] == session
        and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]


async def test_every_update_over_serve_tells_its_seq_in_the_log(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, ws_client(server.ws_url) as client:
            await client.call("initialize", INITIALIZE)
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session = new["result"]["sessionId"]
            prompt = [{"type": "text", "text": WORDS}]
            await client.call("session/prompt", {"sessionId": session, "prompt": prompt})
            live = chunks(client, session)
            events = server.runtime.agents.get(session).session.events  # type: ignore[union-attr]
            for seq, text in live:
                event = events[seq]
                assert isinstance(event, AssistantChunk)
                assert isinstance(event.chunk, TextDelta)
                assert event.chunk.text == text
            # A load replays with the same seqs.
            async with ws_client(server.ws_url) as other:
                await other.call("initialize", INITIALIZE)
                load = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
                await other.call("session/load", load)
                assert chunks(other, session) == live


async def test_a_client_killed_mid_turn_reconnects_and_gets_every_update_exactly_once(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with served(tmp_path, ScriptedModel(delay=0.1)) as server:
            async with ws_client(server.ws_url) as first:
                await first.call("initialize", INITIALIZE)
                new = await first.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
                session = new["result"]["sessionId"]
                prompt = {"sessionId": session, "prompt": [{"type": "text", "text": WORDS}]}
                await first.send(
                    {"jsonrpc": "2.0", "id": "p", "method": "session/prompt", "params": prompt}
                )
                while len(chunks(first, session)) < 2:
                    await trio.sleep(0.01)
            # The socket is gone mid-turn (nothing said): the turn runs on.
            got = chunks(first, session)
            last = max(seq for seq, _ in got)
            async with ws_client(server.ws_url) as again:
                await again.call("initialize", INITIALIZE)
                load: dict[str, Any] = {
                    "sessionId": session,
                    "cwd": str(tmp_path),
                    "mcpServers": [],
                    "_meta": {"greenroom": {"after": last}},
                }
                assert "result" in await again.call("session/load", load)
                agent = server.runtime.agents.get(session)
                assert agent is not None
                await agent.when_idle()
                with trio.move_on_after(10):  # the turn's last updates reach the client
                    while len("".join(t for _, t in got + chunks(again, session)).split()) < len(
                        WORDS.split()
                    ):
                        await trio.sleep(0.01)
                rest = chunks(again, session)
            seqs = [seq for seq, _ in got + rest]
            assert len(seqs) == len(set(seqs))  # none twice
            assert all(seq > last for seq, _ in rest)
            text = "".join(t for _, t in sorted(got + rest))
            assert text.split() == WORDS.split()  # none lost
            # The user's message came before `after`: not replayed to the returning client.
            assert not [
                f
                for f in again.frames
                if f.get("method") == "session/update"
                and f["params"]["update"]["sessionUpdate"] == "user_message_chunk"
            ]
            _, events = await server.runtime.persistence.load(session)  # type: ignore[union-attr]
            assert isinstance(events[-1], TurnEnd)


async def test_a_load_after_a_seq_sends_the_sessions_state_again(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server:
            async with ws_client(server.ws_url) as client:
                await client.call("initialize", INITIALIZE)
                new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
                session = new["result"]["sessionId"]
                prompt = [{"type": "text", "text": "the title"}]
                await client.call("session/prompt", {"sessionId": session, "prompt": prompt})
                await client.call("session/set_mode", {"sessionId": session, "modeId": "read-only"})
                last = max(
                    f["params"]["_meta"]["greenroom"]["seq"]
                    for f in client.frames
                    if f.get("method") == "session/update"
                )
            async with ws_client(server.ws_url) as again:
                await again.call("initialize", INITIALIZE)
                base = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
                bad = await again.call(
                    "session/load", {**base, "_meta": {"greenroom": {"after": "x"}}}
                )
                assert bad["error"]["code"] == -32602, bad
                assert "_meta.greenroom.after" in bad["error"]["message"]
                loaded = await again.call(
                    "session/load", {**base, "_meta": {"greenroom": {"after": last}}}
                )
                assert "result" in loaded
                kinds = [
                    f["params"]["update"]["sessionUpdate"]
                    for f in again.frames
                    if f.get("method") == "session/update"
                ]
                assert "session_info_update" in kinds
                assert "current_mode_update" in kinds
                assert "agent_message_chunk" not in kinds


async def test_a_question_left_by_a_client_that_went_is_asked_of_the_one_that_comes_back(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with served(tmp_path, ScriptedModel(delay=0), tools=True) as server:
            async with ws_client(server.ws_url) as first:
                await first.call("initialize", INITIALIZE)
                new = await first.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
                session = new["result"]["sessionId"]
                prompt = [{"type": "text", "text": "bash: echo answered later"}]
                await first.send(
                    {
                        "jsonrpc": "2.0",
                        "id": "p",
                        "method": "session/prompt",
                        "params": {"sessionId": session, "prompt": prompt},
                    }
                )
                await first.asked("session/request_permission")
            # Gone without answering: the turn waits for someone who can.
            agent = server.runtime.agents.get(session)
            assert agent is not None
            await trio.sleep(0.2)
            assert agent.status == "waiting"
            async with ws_client(server.ws_url) as again:
                await again.call("initialize", INITIALIZE)
                load = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
                assert "result" in await again.call("session/load", load)
                (asked,) = await again.asked("session/request_permission")
                allow = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
                await again.send({"jsonrpc": "2.0", "id": asked["id"], "result": allow})
                await agent.when_idle()
                await trio.sleep(0.1)
                text = "".join(
                    u["content"]["text"]
                    for u in (
                        f["params"]["update"]
                        for f in again.frames
                        if f.get("method") == "session/update"
                    )
                    if u["sessionUpdate"] == "agent_message_chunk"
                )
                assert "answered later\n[exit code: 0]" in text
