"""Several clients on one session of ``greenroom serve``: attach, updates to all, the first
answer wins, the session lives while any client is attached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from greenroom.models.scripted import Say, ScriptedModel
from greenroom.protocol.events import DecisionMade
from tests.serve_clients import INITIALIZE, HttpClient, WsClient, said, served, ws_client

pytestmark = pytest.mark.real_clock


def text(words: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": words}]


async def _two_on_one(a: WsClient, b: WsClient, cwd: Path, *, files: bool = False) -> str:
    """a makes a session and prompts it; b (``client b``) loads it. `files`: both offer
    their files (``fs``)."""
    fs = {"fs": {"readTextFile": True, "writeTextFile": True}} if files else {}
    for name, client in (("client a", a), ("client b", b)):
        await client.call(
            "initialize",
            INITIALIZE | {"clientCapabilities": fs, "clientInfo": {"name": name, "version": "1"}},
        )
    session: str = (await a.call("session/new", {"cwd": str(cwd), "mcpServers": []}))["result"][
        "sessionId"
    ]
    await a.call("session/prompt", {"sessionId": session, "prompt": text("before b")})
    loaded = await b.call("session/load", {"sessionId": session, "cwd": str(cwd), "mcpServers": []})
    assert "result" in loaded, loaded
    assert "before b" in said(b.updates(session))  # the load replayed the log to b
    return session


async def test_a_load_of_a_live_session_attaches_and_every_client_sees_every_turn(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path) as server,
            ws_client(server.ws_url) as a,
            ws_client(server.ws_url) as b,
        ):
            session = await _two_on_one(a, b, tmp_path)
            seen_by_a = len(a.updates(session))
            answer = await b.call(
                "session/prompt", {"sessionId": session, "prompt": text("from b")}
            )
            assert answer["result"] == {"stopReason": "end_turn"}
            while "from b" not in said(a.updates(session)[seen_by_a:]):
                await trio.sleep(0.01)
            # b's answer went to b alone.
            assert not [f for f in a.frames if f.get("id") == answer["id"] and "result" in f]
            assert server.runtime.agents.get(session) is not None


async def test_any_attached_client_cancels_the_turn(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, ScriptedModel(delay=0.5)) as server,
            ws_client(server.ws_url) as a,
            ws_client(server.ws_url) as b,
        ):
            session = await _two_on_one(a, b, tmp_path)
            await a.send(
                {
                    "jsonrpc": "2.0",
                    "id": "long",
                    "method": "session/prompt",
                    "params": {"sessionId": session, "prompt": text("a b c d e f g h i j")},
                }
            )
            while len(said(b.updates(session))) <= len("before b"):
                await trio.sleep(0.01)
            await b.send(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}
            )
            assert (await a.answer("long"))["result"] == {"stopReason": "cancelled"}


async def test_a_permission_goes_to_every_client_and_the_first_answer_wins(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path, ScriptedModel(delay=0), tools=True) as server,
            ws_client(server.ws_url) as a,
            ws_client(server.ws_url) as b,
        ):
            session = await _two_on_one(a, b, tmp_path)
            await a.send(
                {
                    "jsonrpc": "2.0",
                    "id": "run",
                    "method": "session/prompt",
                    "params": {"sessionId": session, "prompt": text("bash: echo from a turn")},
                }
            )
            (to_a,) = await a.asked("session/request_permission")
            (to_b,) = await b.asked("session/request_permission")
            assert to_a["params"]["toolCall"] == to_b["params"]["toolCall"]
            await b.send(
                {
                    "jsonrpc": "2.0",
                    "id": to_b["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}},
                }
            )
            (withdrawn,) = await a.asked("$/cancel_request")
            assert withdrawn["params"] == {"requestId": to_a["id"]}
            assert (await a.answer("run"))["result"] == {"stopReason": "end_turn"}
            assert "from a turn\n[exit code: 0]" in said(a.updates(session))
            assert not await b.asked("$/cancel_request", 0)
            agent = server.runtime.agents.get(session)
            assert agent is not None
            (made,) = [e for e in agent.session.events if isinstance(e, DecisionMade)]
            assert (made.answer, made.by) == ("allow_once", "client b")  # who answered


async def test_file_requests_go_to_the_client_whose_prompt_the_turn_runs(
    tmp_path: Path,
) -> None:
    """a, attached first, has a prompt queued while b's turn writes: b is asked, not a."""
    write = json.dumps({"path": "out.txt", "content": "from b"})
    with trio.fail_after(30):
        async with (
            served(tmp_path, ScriptedModel(delay=0), tools=True) as server,
            ws_client(server.ws_url) as a,
            ws_client(server.ws_url) as b,
        ):
            session = await _two_on_one(a, b, tmp_path, files=True)
            await b.send(
                {
                    "jsonrpc": "2.0",
                    "id": "write",
                    "method": "session/prompt",
                    "params": {"sessionId": session, "prompt": text(f"tool: write_file {write}")},
                }
            )
            (to_b,) = await b.asked("session/request_permission")
            await a.send(
                {
                    "jsonrpc": "2.0",
                    "id": "queued",
                    "method": "session/prompt",
                    "params": {"sessionId": session, "prompt": text("after b")},
                }
            )
            # Answered in order after the prompt: a's prompt is in flight, queued.
            await a.call("session/set_mode", {"sessionId": session, "modeId": "default"})
            await b.send(
                {
                    "jsonrpc": "2.0",
                    "id": to_b["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}},
                }
            )
            (read,) = await b.asked("fs/read_text_file")  # the old text, to show a diff
            await b.send({"jsonrpc": "2.0", "id": read["id"], "result": {"content": ""}})
            (written,) = await b.asked("fs/write_text_file")
            assert written["params"]["content"] == "from b"
            await b.send({"jsonrpc": "2.0", "id": written["id"], "result": {}})
            assert (await b.answer("write"))["result"] == {"stopReason": "end_turn"}
            assert (await a.answer("queued"))["result"] == {"stopReason": "end_turn"}
            assert not [f for f in a.frames if str(f.get("method")).startswith("fs/")]
            assert not (tmp_path / "out.txt").exists()  # written by b's editor, not the disk


async def test_the_session_lives_while_any_client_is_attached(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path) as server, ws_client(server.ws_url) as a:
            async with ws_client(server.ws_url) as b:
                session = await _two_on_one(a, b, tmp_path)
            # b is gone: a goes on with the same live session.
            answer = await a.call("session/prompt", {"sessionId": session, "prompt": text("on")})
            assert answer["result"] == {"stopReason": "end_turn"}
            agent = server.runtime.agents.get(session)
            assert agent is not None
            await a.call("session/close", {"sessionId": session})
            while server.runtime.agents.get(session) is not None:  # the last let go
                await trio.sleep(0.01)
            assert agent.status == "disposed"


async def test_a_websocket_client_and_an_http_client_share_a_session(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with (
            served(tmp_path) as server,
            ws_client(server.ws_url) as a,
            httpx2.AsyncClient(timeout=20) as http,
            trio.open_nursery() as nursery,
        ):
            await a.call("initialize", INITIALIZE)
            new = await a.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session = new["result"]["sessionId"]
            b = HttpClient(http, server.url)
            await b.call("initialize", INITIALIZE)
            await nursery.start(b.listen)
            load = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
            assert "result" in await b.call("session/resume", load)
            await a.call("session/prompt", {"sessionId": session, "prompt": text("to both")})
            while "to both" not in said(b.updates(session)):
                await b.wait_for(len(b.events) + 1)
            nursery.cancel_scope.cancel()


async def test_a_client_that_leaves_does_not_kill_the_background_tasks_of_a_shared_session(
    tmp_path: Path,
) -> None:
    from greenroom.tools.bash.tools import owned_tasks

    start = 'tool: bash {"command": "sleep 30", "description": "wait", "run_in_background": true}'
    with trio.fail_after(30):
        async with served(tmp_path, ScriptedModel(delay=0), tools=True) as server:
            bash = server.runtime.bash
            async with ws_client(server.ws_url) as a:
                async with ws_client(server.ws_url) as b:
                    session = await _two_on_one(a, b, tmp_path)
                    await b.send(
                        {
                            "jsonrpc": "2.0",
                            "id": "bg",
                            "method": "session/prompt",
                            "params": {"sessionId": session, "prompt": text(start)},
                        }
                    )
                    with trio.move_on_after(1):  # asked unless the mode allows it
                        (asked,) = await b.asked("session/request_permission")
                        allow = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
                        await b.send({"jsonrpc": "2.0", "id": asked["id"], "result": allow})
                    answered = await b.answer("bg")
                    assert "started background task" in said(b.updates(session)), answered
                    (task,) = owned_tasks(bash, session)
                    assert task.status == "running"
                # b left: a still holds the session, and its task runs on.
                await trio.sleep(0.2)
                assert [t.status for t in owned_tasks(bash, session)] == ["running"]
            # The last client left: killed with the session.
            while any(t.status == "running" for t in owned_tasks(bash, session)):
                await trio.sleep(0.02)


async def test_the_title_the_model_writes_goes_to_every_attached_client(tmp_path: Path) -> None:
    model = ScriptedModel([[Say("fine")], [Say("Shared Title")]], delay=0)
    with trio.fail_after(30):
        async with (
            served(tmp_path, model, titles="model") as server,
            ws_client(server.ws_url) as a,
            ws_client(server.ws_url) as b,
        ):
            for client in (a, b):
                await client.call("initialize", INITIALIZE)
            new = await a.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session = new["result"]["sessionId"]
            where = {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
            assert "result" in await b.call("session/load", where)  # attached, before a turn
            await a.call("session/prompt", {"sessionId": session, "prompt": text("hi there")})
            for client in (a, b):
                while "Shared Title" not in [u.get("title") for u in client.updates(session)]:
                    await trio.sleep(0.01)
            assert len(model.requests) == 2  # one title, written once for both


async def test_file_requests_go_to_the_first_attached_once_the_prompts_client_is_gone(
    tmp_path: Path,
) -> None:
    """b's turn writes, b goes before it does: the turn goes on, its file requests to a,
    attached first (not c, attached last)."""
    write = json.dumps({"path": "out.txt", "content": "from b"})
    where = {"cwd": str(tmp_path), "mcpServers": []}
    with trio.fail_after(30):
        async with (
            served(tmp_path, ScriptedModel(delay=0), tools=True) as server,
            ws_client(server.ws_url) as a,
            ws_client(server.ws_url) as c,
        ):
            async with ws_client(server.ws_url) as b:
                session = await _two_on_one(a, b, tmp_path, files=True)
                fs = {"fs": {"readTextFile": True, "writeTextFile": True}}
                await c.call("initialize", INITIALIZE | {"clientCapabilities": fs})
                assert "result" in await c.call("session/load", {"sessionId": session, **where})
                prompt = {"sessionId": session, "prompt": text(f"tool: write_file {write}")}
                await b.send(
                    {"jsonrpc": "2.0", "id": "write", "method": "session/prompt", "params": prompt}
                )
                await b.asked("session/request_permission")
            (to_a,) = await a.asked("session/request_permission")
            await a.send(
                {
                    "jsonrpc": "2.0",
                    "id": to_a["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}},
                }
            )
            (read,) = await a.asked("fs/read_text_file")
            await a.send({"jsonrpc": "2.0", "id": read["id"], "result": {"content": ""}})
            (written,) = await a.asked("fs/write_text_file")
            assert written["params"]["content"] == "from b"
            await a.send({"jsonrpc": "2.0", "id": written["id"], "result": {}})
            agent = server.runtime.agents.get(session)
            assert agent is not None
            await agent.when_idle()
            made = [e for e in agent.session.events if isinstance(e, DecisionMade)]
            assert [(m.answer, m.by) for m in made] == [("allow_once", "client a")]
            assert not [f for f in c.frames if str(f.get("method")).startswith("fs/")]
            assert not (tmp_path / "out.txt").exists()  # written by a's editor, not the disk
