"""What the runtime tells, routed to the connections of ``greenroom serve`` that hold each
session (`greenroom.acp.routes`): only those, a sub-agent's session while it is followed,
and a listener that raises never keeps the others from being told."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from greenroom.acp.routes import SessionRoutes
from greenroom.models.scripted import Say
from greenroom.tools.subagents import task_plugin
from tests.actors.test_subagents import Routed, task
from tests.serve_clients import INITIALIZE, served, ws_client


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
