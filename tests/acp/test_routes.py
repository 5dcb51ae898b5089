"""What the runtime tells, routed to the connections of ``greenroom serve`` that hold each
session (`greenroom.acp.routes`): only those, a sub-agent's session while it is followed,
and a listener that raises never keeps the others from being told."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from greenroom.acp.connection import AcpConnection
from greenroom.acp.routes import SessionRoutes
from greenroom.models.scripted import Say
from greenroom.protocol.model import ModelRequest, StreamChunk, UserTurn
from greenroom.tools.subagents import task_plugin
from tests.actors.test_subagents import Routed, task
from tests.serve_clients import INITIALIZE, Served, served, ws_client


class _Told:
    """A listener that keeps the session ids of the events it is told (or raises)."""

    def __init__(self, raises: bool = False) -> None:
        self.sessions: list[str] = []
        self.raises = raises

    def on_event(self, session: Any, event: Any) -> None:
        self.sessions.append(session.id)
        if self.raises:
            raise RuntimeError("a listener that fails")

    def on_server(self, agent: Any, status: Any) -> None: ...

    def on_subagent(self, parent: Any, call_id: str, child: Any) -> None: ...

    def on_status(self, agent: Any, status: Any) -> None: ...

    def on_progress(self, agent: Any, progress: Any) -> None: ...

    def on_prompts(self, agent: Any, prompts: Any) -> None: ...


class _Session:
    def __init__(self, session_id: str) -> None:
        self.id = session_id


def test_an_event_is_told_only_to_the_listeners_holding_its_session_once_per_hold() -> None:
    routes = SessionRoutes()
    a, b = _Told(), _Told()
    watch_a, watch_b = routes.watch(a), routes.watch(b)  # type: ignore[arg-type]
    event = object()
    watch_a.hold("s1")
    watch_a.hold("s1")  # a record and a followed child of the same id: two holds
    watch_b.hold("s2")
    routes.on_event(_Session("s1"), event)  # type: ignore[arg-type]
    routes.on_event(_Session("s2"), event)  # type: ignore[arg-type]
    routes.on_event(_Session("s3"), event)  # type: ignore[arg-type]
    assert (a.sessions, b.sessions) == (["s1"], ["s2"])
    watch_a.let_go("s1")
    routes.on_event(_Session("s1"), event)  # type: ignore[arg-type]
    assert a.sessions == ["s1", "s1"]  # one hold left
    watch_a.let_go("s1")
    watch_a.let_go("s1")  # more than it held: nothing
    watch_b.let_go("s1")  # never held: nothing
    routes.on_event(_Session("s1"), event)  # type: ignore[arg-type]
    assert a.sessions == ["s1", "s1"]


def test_a_listener_that_raises_is_logged_and_the_others_are_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes = SessionRoutes()
    failing, other = _Told(raises=True), _Told()
    routes.watch(failing).hold("s")  # type: ignore[arg-type]
    routes.watch(other).hold("s")  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="greenroom.acp"):
        routes.on_event(_Session("s"), object())  # type: ignore[arg-type]
    assert other.sessions == ["s"]
    assert "a listener that fails" in caplog.text


@pytest.mark.real_clock
async def test_a_sub_agents_progress_reaches_the_client_of_its_parents_session(
    tmp_path: Path,
) -> None:
    """The child's session is routed to the connection that follows it, and to no other."""
    model = Routed(
        {
            "parent": [[task("child: look around")], [Say("thanks")]],
            "child: look": [[Say("found two files")]],
        }
    )
    with trio.fail_after(30):
        async with (
            served(tmp_path, model) as server,  # type: ignore[arg-type]
            ws_client(server.ws_url) as a,
            ws_client(server.ws_url) as b,
        ):
            await server.runtime.plug("tool-task", task_plugin)
            for client in (a, b):
                await client.call("initialize", INITIALIZE)
            new = {"cwd": str(tmp_path), "mcpServers": []}
            session = (await a.call("session/new", new))["result"]["sessionId"]
            other = (await b.call("session/new", new))["result"]["sessionId"]
            prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "parent"}]}
            assert (await a.call("session/prompt", prompt))["result"]["stopReason"] == "end_turn"
            progress = [
                u["content"][0]["content"]["text"]
                for u in a.updates(session)
                if u["sessionUpdate"] == "tool_call_update" and u.get("status") == "in_progress"
                if "content" in u
            ]
            assert progress == ["found two files"]
            seen_by_b = {f["params"]["sessionId"] for f in b.frames if "params" in f}
            assert seen_by_b <= {other}


class _ChildWaits:
    """`Routed`, but the child's model waits for `go` before it answers (`asked` is set
    when it is asked)."""

    def __init__(self, routed: Routed) -> None:
        self.routed = routed
        self.asked = trio.Event()
        self.go = trio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        first = next(m.content for m in request.messages if isinstance(m, UserTurn))
        if first.startswith("child"):
            self.asked.set()
            await self.go.wait()
        async for chunk in self.routed.stream(request):
            yield chunk


async def _connections_of(server: Served, most: int) -> int:
    """How many connections of `server` are still in memory, once at most `most` are
    (waiting up to 5 s for the teardowns of those gone)."""
    with trio.move_on_after(5):
        while True:
            gc.collect()
            live = sum(
                type(o) is AcpConnection and o.runtime is server.runtime for o in gc.get_objects()
            )
            if live <= most:
                return live
            await trio.sleep(0.05)
    return live


@pytest.mark.real_clock
async def test_a_connection_gone_while_it_follows_a_sub_agent_is_routed_nothing_more(
    tmp_path: Path,
) -> None:
    """The connection's end lets go of the children it follows, as of its sessions: a child
    that runs on without it keeps it (its frames, its tables) told of nothing."""
    model = _ChildWaits(
        Routed(
            {
                "parent": [[task("child: wait")], [Say("thanks")]],
                "child: wait": [[Say("done waiting")]],
            }
        )
    )
    with trio.fail_after(30):
        async with (
            served(tmp_path, model) as server,  # type: ignore[arg-type]
            ws_client(server.ws_url) as b,
        ):
            await server.runtime.plug("tool-task", task_plugin)
            await b.call("initialize", INITIALIZE)
            new = {"cwd": str(tmp_path), "mcpServers": []}
            session = (await b.call("session/new", new))["result"]["sessionId"]
            async with ws_client(server.ws_url) as a:
                await a.call("initialize", INITIALIZE)
                load = {"sessionId": session, **new}
                assert "result" in await a.call("session/load", load)
                prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "parent"}]}
                await b.send(
                    {"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": prompt}
                )
                await model.asked.wait()  # the child runs, followed by both connections
            assert await _connections_of(server, 1) == 1  # b's alone
            model.go.set()
            assert (await b.answer(9))["result"] == {"stopReason": "end_turn"}


@pytest.mark.real_clock
async def test_the_connection_that_started_a_shared_session_is_let_go_when_it_goes(
    tmp_path: Path,
) -> None:
    """The session outlives the connection that made it while another holds it; nothing of
    the session keeps that connection (its frames, its tables) in memory."""
    with trio.fail_after(30):
        async with served(tmp_path) as server, ws_client(server.ws_url) as b:
            await b.call("initialize", INITIALIZE)
            new = {"cwd": str(tmp_path), "mcpServers": []}
            async with ws_client(server.ws_url) as a:
                await a.call("initialize", INITIALIZE)
                session = (await a.call("session/new", new))["result"]["sessionId"]
                assert "result" in await b.call("session/load", {"sessionId": session, **new})
            assert await _connections_of(server, 1) == 1  # b's alone
            prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "still here"}]}
            assert (await b.call("session/prompt", prompt))["result"] == {"stopReason": "end_turn"}
