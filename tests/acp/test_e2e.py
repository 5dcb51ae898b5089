"""End to end: ``greenroom acp`` as a real subprocess, driven by the official ACP Python SDK.

The SDK is asyncio-only, so these tests are plain (non-Trio) tests that run
an asyncio loop of their own; every wait is bounded with ``asyncio.wait_for``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
import trio
import trio.testing
from acp import schema

from greenroom.acp.frames import MAX_FRAME
from tests.acp_process import acp_process

LIMIT = 30.0  # seconds, per scenario


class Recorder:
    """The client side: records every session/update the agent sends, in order."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.first_update = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        if isinstance(update, schema.AgentMessageChunk):  # not the commands sent at session/new
            self.first_update.set()

    async def request_permission(self, **kwargs: Any) -> Any:
        raise AssertionError("greenroom asks for no permission")

    def on_connect(self, conn: Any) -> None:
        pass

    def text(self, session_id: str) -> str:
        return "".join(
            u.content.text
            for s, u in self.updates
            if s == session_id and isinstance(u, schema.AgentMessageChunk)
        )


def _agent(home: Path, delay: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "greenroom", "acp", "--model", f"scripted:{delay}")


def text(words: str) -> list[schema.TextContentBlock]:
    return [acp.text_block(words)]


async def _first_process(home: Path, work: Path) -> str:
    recorder = Recorder()
    command, *args = _agent(home, "0.02")
    async with acp.spawn_agent_process(
        recorder, command, *args, env={"GREENROOM_HOME": str(home)}, cwd=work
    ) as (conn, process):
        init = await conn.initialize(protocol_version=1)
        assert init.protocol_version == 1
        assert init.agent_capabilities is not None
        assert init.agent_capabilities.load_session is True

        session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        answer = await conn.prompt(session_id=session, prompt=text("hello brave new world"))
        assert answer.stop_reason == "end_turn"
        assert recorder.text(session) == "hello brave new world"

        # Cancel mid-stream: answered cancelled, never an error.
        recorder.first_update.clear()
        long = asyncio.create_task(
            conn.prompt(session_id=session, prompt=text(" ".join(["word"] * 200)))
        )
        await recorder.first_update.wait()
        await conn.cancel(session_id=session)
        assert (await long).stop_reason == "cancelled"

        # A second prompt sent while the first runs is queued and answered in turn.
        first = asyncio.create_task(conn.prompt(session_id=session, prompt=text("one two three")))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(conn.prompt(session_id=session, prompt=text("four five")))
        done = await asyncio.gather(first, second)
        assert [d.stop_reason for d in done] == ["end_turn", "end_turn"]
        assert recorder.text(session).endswith("four five")

    # Leaving the context closed the agent's stdin: it exits by itself, with 0.
    assert await asyncio.wait_for(process.wait(), 5) == 0
    return session


async def _second_process(home: Path, work: Path, session: str) -> None:
    recorder = Recorder()
    command, *args = _agent(home, "0")
    async with acp.spawn_agent_process(
        recorder, command, *args, env={"GREENROOM_HOME": str(home)}, cwd=work
    ) as (conn, _):
        await conn.initialize(protocol_version=1)
        listed = await conn.list_sessions(cwd=str(work))
        assert [s.session_id for s in listed.sessions] == [session]
        await conn.load_session(session_id=session, cwd=str(work), mcp_servers=[])
        # The whole conversation was replayed before the load answered.
        users = [
            u.content.text for _, u in recorder.updates if isinstance(u, schema.UserMessageChunk)
        ]
        assert users[0] == "hello brave new world"
        assert users[-1] == "four five"
        assert recorder.text(session).startswith("hello brave new world")
        answer = await conn.prompt(session_id=session, prompt=text("after the load"))
        assert answer.stop_reason == "end_turn"
        assert recorder.text(session).endswith("after the load")


def test_the_sdk_client_drives_greenroom_across_two_processes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()

    async def scenario() -> None:
        session = await asyncio.wait_for(_first_process(home, work), LIMIT)
        await asyncio.wait_for(_second_process(home, work, session), LIMIT)

    asyncio.run(scenario())


def test_sigterm_tears_down_and_exits_zero(tmp_path: Path) -> None:
    import signal

    async def scenario() -> None:
        recorder = Recorder()
        command, *args = _agent(tmp_path, "0.05")
        async with acp.spawn_agent_process(
            recorder, command, *args, env={"GREENROOM_HOME": str(tmp_path)}, cwd=tmp_path
        ) as (conn, process):
            await conn.initialize(protocol_version=1)
            session = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            pending = asyncio.create_task(
                conn.prompt(session_id=session, prompt=text(" ".join(["w"] * 100)))
            )
            await recorder.first_update.wait()
            process.send_signal(signal.SIGTERM)
            assert (await pending).stop_reason == "cancelled"
            assert await asyncio.wait_for(process.wait(), 5) == 0
        stored = (tmp_path / "sessions").glob("*.jsonl")
        (log,) = list(stored)
        assert b'"kind":"disposed"' in log.read_bytes().splitlines()[-1]

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))


@pytest.mark.real_clock
async def test_greenroom_acp_answers_a_thousand_deep_frame_and_serves_the_next_prompt(
    tmp_path: Path,
) -> None:
    deep = "[" * 1000 + "]" * 1000
    params = f'{{"cwd":"/tmp","mcpServers":{deep}}}'
    frame = f'{{"jsonrpc":"2.0","id":"deep","method":"session/new","params":{params}}}'
    with trio.fail_after(30):
        async with acp_process(tmp_path, "--model", "scripted:0") as agent:
            await agent.send_raw(frame.encode() + b"\n")
            answer = await agent.response("deep")
            assert answer["error"]["code"] == -32602
            session = await agent.new_session(str(tmp_path))
            assert (await agent.prompt(session, "still alive"))["result"] == {
                "stopReason": "end_turn"
            }
            assert await agent.close() == 0


@pytest.mark.real_clock
async def test_greenroom_acp_fails_a_permission_whose_reply_cannot_be_read_and_goes_on(
    tmp_path: Path,
) -> None:
    """A reply to session/request_permission nested 5,000 deep, then one over the 8 MiB
    limit whose id lies at its end: each fails the call it asked for (it used to wait for
    ever), and the turn goes on."""
    deep = b'{"outcome":' + b"[" * 5000 + b"]" * 5000 + b"}"
    huge = b'{"outcome":"' + b"x" * MAX_FRAME + b'"}'
    with trio.fail_after(60):
        async with acp_process(tmp_path, "--model", "scripted:0") as agent:
            session = await agent.new_session(str(tmp_path))
            for result, why in [
                (deep, "nested too deep to decode"),
                (huge, f"a frame longer than {MAX_FRAME:,} bytes"),
            ]:
                prompt = [{"type": "text", "text": "bash: touch ran"}]
                asked = await agent.request(
                    "session/prompt", {"sessionId": session, "prompt": prompt}
                )
                request = await agent.until(
                    lambda f: f.get("method") == "session/request_permission" and "id" in f
                )
                request_id = json.dumps(request["id"]).encode()
                await agent.send_raw(
                    b'{"jsonrpc":"2.0","result":%s,"id":%s}\n' % (result, request_id)
                )
                assert (await agent.response(asked))["result"] == {"stopReason": "end_turn"}
                (failed,) = [
                    f["params"]["update"]
                    for f in agent.frames
                    if f.get("method") == "session/update"
                    and f["params"]["update"].get("status") == "failed"
                    and why in json.dumps(f["params"]["update"])
                ]
                assert "session/request_permission" in json.dumps(failed)
                agent.frames.clear()
            assert not (tmp_path / "ran").exists()
            assert await agent.close() == 0
