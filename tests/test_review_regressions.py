"""Regressions found in review: each test pins a failure mode that once existed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.models import Hang, Say, ScriptedModel
from greenroom.protocol.events import COMPLETED, SessionEvent, SessionHeader, TurnEnd
from greenroom.session import SESSION_EVENT, Session
from greenroom.session.persistence import JsonlPersistence, PersistenceError, SessionLog
from greenroom.supervisor import ChildSpec, Supervisor
from tests.acp_peer import bridge
from tests.agents_helpers import assert_enclosed, new_agent, turn_ends
from tests.persistence_helpers import Delegating, DelegatingLog


async def test_a_create_whose_caller_is_cancelled_leaves_nothing_and_no_lock() -> None:
    async with open_runtime() as rt:
        with trio.fail_after(5):
            with trio.CancelScope() as scope:
                scope.cancel()
                await rt.agents.create(agent_id="a", session_id="s")
            assert scope.cancelled_caught
            assert rt.agents.list() == []
            assert rt.sessions.list() == []
            assert rt.supervisor.tree().children == []
            handle = await rt.agents.create(agent_id="a", session_id="s")  # the lock is free
            assert rt.agents.get("a") is handle.agent


async def test_a_cancel_between_two_turns_leaves_the_agent_idle() -> None:
    for checkpoints in range(4):
        async with open_runtime(model=ScriptedModel(delay=0.02)) as rt:
            agent = await new_agent(rt)
            ended = trio.Event()

            def on_event(session: Session, event: SessionEvent, ended: trio.Event = ended) -> None:
                if isinstance(event, TurnEnd) and event.turn == 1:
                    ended.set()

            rt.hooks.on(SESSION_EVENT, on_event)
            agent.send("one two")
            await trio.sleep(0.01)
            agent.send("queued behind turn one")
            await ended.wait()
            for _ in range(checkpoints):
                await trio.lowlevel.checkpoint()
            agent.cancel("stop")
            with trio.fail_after(5):
                await agent.when_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "idle"
            assert_enclosed(agent.session.events)


async def test_events_of_a_session_whose_drains_all_failed_never_corrupt_a_new_life(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = JsonlPersistence(tmp_path)
    broken = [True]

    class FullDisk(DelegatingLog):
        """While the disk is full, nothing it is given reaches the file, to the end."""

        def append(self, event: SessionEvent) -> None:
            if not broken[0]:
                self.inner.append(event)

        async def write_ahead(self) -> None:
            if broken[0]:
                raise PersistenceError("[Errno 28] No space left on device")
            await self.inner.write_ahead()

        async def flush(self) -> None:
            if broken[0]:
                raise PersistenceError("[Errno 28] No space left on device")
            await self.inner.flush()

    failing = Delegating(store)
    failing.log_type = FullDisk

    with caplog.at_level(logging.ERROR, logger="greenroom.agent"):
        async with open_runtime(model=ScriptedModel(delay=0), persistence=failing) as rt:
            first = await rt.agents.create(agent_id="a", session_id="s")
            first.agent.send("lost to a full disk")
            await first.agent.when_idle()
            await first.dispose()
            # Its last flush failed too: reported, and its events died with that life.
            assert "flush of session 's' failed" in caplog.text
            broken[0] = False
            second = await rt.agents.resume(agent_id="b", session_id="s")
            second.agent.send("written")
            await second.agent.when_idle()
            await second.dispose()
    _, stored = await store.load("s")
    assert_enclosed(stored)
    assert turn_ends(stored) == [(1, COMPLETED)]


async def test_a_failed_drain_is_retried_when_the_agent_is_disposed(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    failures = [OSError(5, "I/O error")]

    class FailsOnce(DelegatingLog):
        async def flush(self) -> None:
            if failures:
                raise failures.pop()
            await self.inner.flush()

    once = Delegating(store)
    once.log_type = FailsOnce

    async with open_runtime(model=ScriptedModel(delay=0), persistence=once) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("hello")
        await handle.agent.when_idle()
        await handle.dispose()  # no turn runs after the failure: the dispose drains
    _, stored = await store.load("s")
    assert turn_ends(stored) == [(1, COMPLETED)]


async def test_a_child_whose_cleanup_raises_in_a_group_is_an_error_not_a_crash() -> None:
    async def child(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        async with trio.open_nursery() as nursery:
            try:
                nursery.start_soon(trio.sleep_forever)
                await trio.sleep_forever()
            finally:
                raise OSError("could not remove the temp dir")

    started = trio.current_time()
    async with Supervisor([ChildSpec("messy", child, shutdown=10)]) as sup:
        pass
    assert trio.current_time() - started < 1  # no grace waited out
    assert sup.exits[-1].outcome == "error"
    assert "could not remove the temp dir" in (sup.exits[-1].exception or "")


async def test_an_os_error_in_a_request_is_an_answer_and_the_connection_lives(
    tmp_path: Path,
) -> None:
    class Unreadable(Delegating):
        async def open(
            self, session_id: str
        ) -> tuple[SessionHeader, list[SessionEvent], SessionLog]:
            raise PermissionError(13, "Permission denied")

    async with bridge(tmp_path, ScriptedModel(), Unreadable(JsonlPersistence(tmp_path))) as b:
        answer = await b.peer.call(
            "session/load", {"sessionId": "x", "cwd": "/work", "mcpServers": []}
        )
        assert answer["error"]["code"] == -32603
        assert "Permission denied" in answer["error"]["message"]
        assert "result" in await b.peer.call("session/list", {})


async def test_a_slow_teardown_still_answers_every_prompt(tmp_path: Path) -> None:
    class SlowFlush(DelegatingLog):
        async def flush(self) -> None:
            with trio.CancelScope(shield=True):  # a sink shields its waits
                await trio.sleep(60)
            await self.inner.flush()

    slow = Delegating(JsonlPersistence(tmp_path))
    slow.log_type = SlowFlush
    async with bridge(tmp_path, ScriptedModel([[Say("x"), Hang()]] * 2), slow) as b:
        requests = []
        for _ in range(2):
            session = await b.peer.new_session()
            requests.append(
                await b.peer.request(
                    "session/prompt",
                    {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]},
                )
            )
        await trio.testing.wait_all_tasks_blocked()
        await b.peer.close()
        await b.served.wait()
        for request in requests:
            assert (await b.peer.response(request))["result"] == {"stopReason": "cancelled"}


def test_a_base_url_with_credentials_is_refused() -> None:
    from greenroom.models.openai import OpenAIChatModel

    with pytest.raises(ValueError, match="must not carry credentials"):
        OpenAIChatModel("http://user:s3cret@proxy.example/v1", "sk", "m")


async def test_context_injected_while_a_tool_runs_lands_after_its_result() -> None:
    import msgspec

    from greenroom.actors.types import ToolInvocation
    from greenroom.models import CallTool
    from greenroom.protocol.events import ContextMessage, ToolCall, ToolResult
    from greenroom.protocol.model import AssistantTurn, ToolTurn, UserTurn
    from greenroom.tools import Tool

    class Args(msgspec.Struct):
        pass

    async def slow(args: Args, call: ToolInvocation) -> str:
        assert call.agent is not None
        call.agent.inject("a background task finished")
        await trio.sleep(1)
        return "done"

    model = ScriptedModel([[CallTool("slow", {})], [Say("ok")]])
    async with open_runtime(model=model, tools=[Tool("slow", "waits", Args, slow)]) as rt:
        agent = await new_agent(rt)
        agent.send("go")
        await agent.when_idle()
        kinds = [type(e) for e in agent.session.events]
        assert kinds.index(ToolCall) < kinds.index(ToolResult) < kinds.index(ContextMessage)
        history = model.requests[1].messages
        assert [type(m) for m in history] == [UserTurn, AssistantTurn, ToolTurn, UserTurn]
