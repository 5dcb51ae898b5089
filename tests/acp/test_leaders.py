"""What the leading ACP agents show an editor, greenroom shows too (issue 42, part 2): notices
for what is not the model's words, tool calls with their name and raw output.

The peer is the in-process client of tests/acp_peer.py; every update it gets is read by the
official ACP SDK's schema types, and the unstable ``notice`` (not in the SDK yet) against the
spec's own schema for it.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import acp
import jsonschema
import msgspec
from acp import schema
from hypothesis import given, settings
from hypothesis import strategies as st

from greenroom import AgentOptions, Limits, open_runtime, tool
from greenroom.acp.params import RpcError
from greenroom.acp.presenter import Presenter
from greenroom.acp.starts import turn_of
from greenroom.models import CallTool, Hang, Say, ScriptedModel, Tokens
from greenroom.protocol.acp import NoticeUpdate
from greenroom.protocol.events import (
    COMPLETED,
    USER,
    Compacted,
    MessageTrigger,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import Finish, ModelRequest, Retry, StreamChunk, TextDelta
from tests.acp_editor import NOTICE_SCHEMA, Editor, checked_updates
from tests.acp_peer import bridge

LIMIT = 30.0  # seconds, for the tests of a real process

PROMPT = [{"type": "text", "text": "hello"}]
NOTICES = {"_meta": {"notice": True}}


class RetriesOnce:
    """A model whose first attempt fails (told as a `Retry`), then answers."""

    context_window = 10_000

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        yield Retry(1, 0.5, "https://api.example/v1 answered HTTP 529: Overloaded", "http-529")
        yield TextDelta("answered")
        yield Finish("stop")


async def test_a_retry_is_a_live_notice_for_a_client_that_declares_it(tmp_path: Path) -> None:
    async with bridge(tmp_path, RetriesOnce(), capabilities=NOTICES) as b:  # type: ignore[arg-type]
        session = await b.peer.new_session(str(tmp_path))
        answer = await b.peer.call("session/prompt", {"sessionId": session, "prompt": PROMPT})
        assert answer["result"]["stopReason"] == "end_turn"
        updates = checked_updates(b.peer.frames)
        [notice] = [u for u in updates if u["sessionUpdate"] == "notice"]
        assert notice["severity"] == "warning"
        assert notice["title"] == "Retrying the model in 0.5 s"
        assert "HTTP 529" in notice["description"]
        said = [
            u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk"
        ]
        assert said == ["answered"]  # the retry is no part of the reply
        # A notice is no part of the history: a load does not replay it.
        await b.peer.call("session/close", {"sessionId": session})
        before = len(b.peer.frames)
        loaded = await b.peer.call(
            "session/load", {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
        )
        assert "result" in loaded
        replayed = checked_updates(b.peer.frames[before:])
        assert not [u for u in replayed if u["sessionUpdate"] == "notice"]
        assert "Retrying" not in str(replayed)


async def test_a_retry_is_text_for_a_client_that_does_not(tmp_path: Path) -> None:
    async with bridge(tmp_path, RetriesOnce()) as b:  # type: ignore[arg-type]
        session = await b.peer.new_session(str(tmp_path))
        await b.peer.call("session/prompt", {"sessionId": session, "prompt": PROMPT})
        updates = checked_updates(b.peer.frames)
        assert not [u for u in updates if u["sessionUpdate"] == "notice"]
        said = [
            u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk"
        ]
        assert said[0].startswith("Retrying the model in 0.5 s: https://api.example/v1")
        assert said[-1] == "answered"


async def test_a_server_that_fails_to_start_is_an_error_notice(tmp_path: Path) -> None:
    missing = {"name": "missing", "command": str(tmp_path / "no-such-server"), "args": []}
    async with bridge(tmp_path, ScriptedModel(), capabilities=NOTICES) as b:
        answer = await b.peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": [missing]})
        session = answer["result"]["sessionId"]
        notice = await b.peer.wait_for(
            lambda f: (
                f.get("method") == "session/update"
                and f["params"]["update"]["sessionUpdate"] == "notice"
            )
        )
        assert b.peer.index_of(notice) > b.peer.index_of(answer)  # after the session's answer
        update = notice["params"]["update"]
        assert update["severity"] == "error"
        assert update["title"].startswith("MCP server 'missing' failed")
        assert notice["params"]["sessionId"] == session
        checked_updates(b.peer.frames)


@tool
async def note(text: str) -> str:
    """Note `text`."""
    return f"noted {text}"


async def test_a_limit_reached_and_a_compaction_fallback_are_live_notices() -> None:
    model = ScriptedModel([[CallTool("note", {"text": "a"})], [Say("never")]])
    async with open_runtime(model=model, tools=[note]) as rt:
        options = AgentOptions(limits=Limits(requests=1))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        answer = await handle.agent.run("go")
        session = handle.agent.session
        end = session.events[-1]
        assert answer.stop_reason == "limit"
        assert isinstance(end, TurnEnd)
        presenter = Presenter(["default"], {"default": 10_000})
        assert list(presenter.present(session, end, replay=False)) == []  # today: nothing
        presenter.notices = True
        [notice] = presenter.present(session, end, replay=False)
        assert list(presenter.present(session, end, replay=True)) == []
        # A compaction that fell back to no summary: told as such, live only.
        fallback = Compacted(
            **dict(turn=1, step=1, summary="", first_seq=0, kept_seq=0, first_turn=1),
            **dict(last_turn=1, model="default", tokens_before=900, tokens_after=100),
            degraded="the summary call failed: HTTP 500",
        )
        live = list(presenter.present(session, fallback, replay=False))
        replayed = list(presenter.present(session, fallback, replay=True))
        presenter.notices = False
        plain = list(presenter.present(session, fallback, replay=False))
        await handle.dispose()
    [told_notice] = [u for u in live if type(u) is NoticeUpdate]
    assert [u for u in live if u is not told_notice] == plain  # and today's text too
    assert replayed == plain
    told = {"sessionUpdate": "notice", **_plain(told_notice)}
    jsonschema.validate(told, NOTICE_SCHEMA)
    assert told["title"] == "Compacted without a summary"
    assert told["description"] == "the summary call failed: HTTP 500"
    shown = {"sessionUpdate": "notice", **_plain(notice)}
    jsonschema.validate(shown, NOTICE_SCHEMA)
    assert shown["title"] == "The turn stopped at its requests limit"
    assert shown["description"] == "allowed 1, reached 1"


def _plain(update: Any) -> dict[str, Any]:
    plain: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(update))
    return plain


async def test_a_tool_call_carries_its_name_and_its_raw_output(tmp_path: Path) -> None:
    call = CallTool("bash", {"command": "echo out", "description": "echo"}, call_id="c1")
    script = [[call], [Say("done")]]
    async with bridge(tmp_path, ScriptedModel(script), bash=True) as b:
        session = await b.peer.new_session(str(tmp_path))
        await b.peer.call("session/prompt", {"sessionId": session, "prompt": PROMPT})
        updates = checked_updates(b.peer.frames)
        [start] = [u for u in updates if u["sessionUpdate"] == "tool_call"]
        assert start["name"] == "bash"
        assert start["kind"] == "execute"
        [end] = [
            u
            for u in updates
            if u["sessionUpdate"] == "tool_call_update" and u["status"] == "completed"
        ]
        assert end["rawOutput"] == end["content"][0]["content"]["text"]
        assert "out" in end["rawOutput"]
        parsed = schema.ToolCallProgress.model_validate(end)
        assert parsed.raw_output == end["rawOutput"]


# -- plans, for a client that declares them -------------------------------------------------

PLAN = [
    {"content": "read the code", "priority": "high", "status": "completed"},
    {"content": "ship it", "priority": "low", "status": "pending"},
]


async def _planned(work: Path, declared: schema.ClientCapabilities) -> Editor:
    editor = Editor()
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    env = {"GREENROOM_HOME": str(work / "home")}
    async with acp.spawn_agent_process(editor, *command, env=env, cwd=work) as (conn, _):
        await conn.initialize(protocol_version=1, client_capabilities=declared)
        session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        prompt = [acp.text_block(f"todo: {json.dumps(PLAN)}")]
        answer = await conn.prompt(session_id=session, prompt=prompt)
        assert answer.stop_reason == "end_turn"
    return editor


def test_the_plan_is_a_plan_update_for_a_client_that_declares_plans(tmp_path: Path) -> None:
    declared = schema.ClientCapabilities(plan=schema.PlanCapabilities())
    editor = asyncio.run(asyncio.wait_for(_planned(tmp_path, declared), LIMIT))
    [update] = [u for u in editor.updates if isinstance(u, schema.AgentPlanContentUpdate)]
    assert not editor.plans()  # no `plan` besides
    plan = update.plan
    assert isinstance(plan, schema.PlanUpdateItems)
    assert plan.plan_id == "todo"
    assert [(e.content, e.priority, e.status) for e in plan.entries] == [
        (p["content"], p["priority"], p["status"]) for p in PLAN
    ]
    editor = asyncio.run(asyncio.wait_for(_planned(tmp_path, schema.ClientCapabilities()), LIMIT))
    assert not [u for u in editor.updates if isinstance(u, schema.AgentPlanContentUpdate)]
    assert editor.plans() == [[(p["content"], p["priority"], p["status"]) for p in PLAN]]


# -- a cancelled turn's usage ------------------------------------------------------------------


async def test_a_cancelled_turn_is_answered_with_the_usage_of_its_steps(tmp_path: Path) -> None:
    call = CallTool("bash", {"command": "echo out", "description": "echo"}, call_id="c1")
    script = [[Say("a"), Tokens(100, 10, cache_read=40), call], [Say("b"), Hang()]]
    async with bridge(tmp_path, ScriptedModel(script), bash=True) as b:
        session = await b.peer.new_session(str(tmp_path))
        asked = await b.peer.request("session/prompt", {"sessionId": session, "prompt": PROMPT})
        await b.peer.wait_for(
            lambda f: (
                f.get("method") == "session/update"
                and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                and f["params"]["update"]["content"]["text"] == "b"
            )
        )
        await b.peer.notify("session/cancel", {"sessionId": session})
        answer = schema.PromptResponse.model_validate((await b.peer.response(asked))["result"])
        checked_updates(b.peer.frames)
    assert answer.stop_reason == "cancelled"
    assert answer.usage is not None
    # The step that ended reported its tokens; the one the cancel cut reported none.
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (100, 10)
    assert (answer.usage.total_tokens, answer.usage.cached_read_tokens) == (110, 40)


# -- session/fork at a message -----------------------------------------------------------------


def _said(frames: list[dict[str, Any]], session: str) -> list[str]:
    return [
        f["params"]["update"]["content"]["text"]
        for f in frames
        if f.get("method") == "session/update"
        and f["params"]["sessionId"] == session
        and f["params"]["update"]["sessionUpdate"] in ("user_message_chunk", "agent_message_chunk")
    ]


async def test_a_fork_at_a_message_ends_with_its_turn(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        peer = b.peer
        session = await peer.new_session(str(tmp_path))
        for word in ("one", "two", "three"):
            prompt = [{"type": "text", "text": word}]
            await peer.call("session/prompt", {"sessionId": session, "prompt": prompt})
        where = {"cwd": str(tmp_path), "mcpServers": []}
        # The original's messages as a load shows them, with their ids.
        await peer.call("session/close", {"sessionId": session})
        before = len(peer.frames)
        await peer.call("session/load", {"sessionId": session, **where})
        chunks = [
            f["params"]["update"]
            for f in peer.frames[before:]
            if f.get("method") == "session/update"
            and f["params"]["update"]["sessionUpdate"] == "user_message_chunk"
        ]
        second = chunks[1]["messageId"]
        forks = []
        for message_id in (f"{session}/1/1", second):
            params = {"sessionId": session, "messageId": message_id, **where}
            answer = await peer.call("session/fork", params)
            fork = schema.ForkSessionResponse.model_validate(answer["result"]).session_id
            await peer.call("session/close", {"sessionId": fork})
            mark = len(peer.frames)
            await peer.call("session/load", {"sessionId": fork, **where})
            forks.append(_said(peer.frames[mark:], fork))
        assert forks[0] == ["one", "one"]  # the prompt, and the echo
        assert forks[1] == ["one", "one", "two", "two"]
        listed = (await peer.call("session/list", {}))["result"]["sessions"]
        # Bad input: a message the log does not have, an id of another session, a turn
        # past the log: each -32602 naming the id, and nothing stored.
        for message_id in ("no-such", "other/1/1", f"{session}/9/1"):
            params = {"sessionId": session, "messageId": message_id, **where}
            refused = (await peer.call("session/fork", params))["error"]
            assert refused["code"] == -32602
            assert f"messageId {message_id!r} is not a message" in refused["message"]
        assert (await peer.call("session/list", {}))["result"]["sessions"] == listed
        checked_updates(peer.frames)


# -- each state update only when it changed ----------------------------------------------------


async def test_a_setting_is_told_only_when_the_client_does_not_have_it(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        peer = b.peer
        session = await peer.new_session(str(tmp_path))

        async def told(method: str, params: dict[str, Any]) -> list[str]:
            mark = len(peer.frames)
            answer = await peer.call(method, {"sessionId": session, **params})
            assert "result" in answer, answer
            await peer.call("session/list", {})  # a round trip: what the change sent is in
            return [u["sessionUpdate"] for u in checked_updates(peer.frames[mark:])]

        # The mode the answer to session/new said: nothing to tell.
        assert await told("session/set_mode", {"modeId": "default"}) == []
        # A new mode: told once, as a mode and as the options.
        changed = await told("session/set_mode", {"modeId": "read-only"})
        assert changed == ["current_mode_update", "config_option_update"]
        assert await told("session/set_mode", {"modeId": "read-only"}) == []
        # An option set: told once (the update goes before the answer, which holds every
        # option too); set again to the same, not told.
        thinking = {"configId": "thought_level", "value": "high"}
        assert await told("session/set_config_option", thinking) == ["config_option_update"]
        assert await told("session/set_config_option", thinking) == []
        back = {"configId": "mode", "value": "default"}
        assert await told("session/set_config_option", back) == [
            "current_mode_update",
            "config_option_update",
        ]
        assert await told("session/set_config_option", back) == []


@settings(max_examples=150, deadline=None)
@given(message_id=st.text(max_size=80) | st.from_regex(r"s1/[0-9]{1,3}/[0-9]{1,2}", fullmatch=True))
def test_any_message_id_is_a_turn_or_a_clear_refusal(message_id: str) -> None:
    events: list[Any] = [
        TurnStart(turn=1, trigger=MessageTrigger(USER)),
        UserMessage(content="one", source=USER, message_id="m1"),
        TurnEnd(turn=1, reason=COMPLETED),
        TurnStart(turn=2, trigger=MessageTrigger(USER)),
        UserMessage(content="two", source=USER, message_id="m2"),
    ]
    found: int | RpcError
    try:
        found = turn_of(events, "s1", message_id)
    except RpcError as exc:
        found = exc
    if isinstance(found, RpcError):
        assert found.code == -32602
        assert "messageId" in found.message
    else:  # the one ended turn, by its prompt's id or a reply's as greenroom writes them
        assert found == 1
        assert message_id == "m1" or re.fullmatch(r"s1/1/[1-9][0-9]*", message_id)
