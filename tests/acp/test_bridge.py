"""The ACP bridge in-process: memory streams, virtual time, each invariant pinned.

Every frame the bridge writes is validated against the official SDK's schema
models (``acp.schema``), whatever test wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import acp.schema
import hypothesis
import hypothesis.strategies as st
import msgspec
import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.acp import connection
from greenroom.acp.params import RpcError, servers_from_acp
from greenroom.models import CallTool, End, Hang, Say, ScriptedModel, Think, Wait
from greenroom.protocol.events import (
    COMPLETED,
    DISPOSED,
    Aborted,
    SessionEvent,
    SessionHeader,
    ToolResult,
    UserMessage,
)
from greenroom.session.persistence import (
    JsonlPersistence,
    SessionLog,
)
from greenroom.tools.bash import BashTask
from tests.acp_peer import Peer, bridge
from tests.agents_helpers import kinds, turn_ends
from tests.persistence_helpers import Delegating, DelegatingLog, GatedOpen

RESULTS = {
    "initialize": acp.schema.InitializeResponse,
    "session/new": acp.schema.NewSessionResponse,
    "session/prompt": acp.schema.PromptResponse,
    "session/list": acp.schema.ListSessionsResponse,
}


def validate(peer: Peer, requests: dict[int, str] | None = None) -> None:
    """Every frame is JSON-RPC 2.0; every update and known result parses with the SDK's models."""
    for frame in peer.frames:
        assert frame["jsonrpc"] == "2.0"
        if frame.get("method") == "session/update":
            acp.schema.SessionNotification.model_validate(frame["params"])
        elif "error" in frame:
            assert isinstance(frame["error"]["code"], int)
            assert frame["error"]["message"]
        elif requests and frame.get("id") in requests and requests[frame["id"]] in RESULTS:
            RESULTS[requests[frame["id"]]].model_validate(frame["result"])


def texts(updates: Sequence[dict[str, Any]], kind: str = "agent_message_chunk") -> str:
    return "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == kind)


async def test_initialize_advertises_what_the_bridge_does(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        answer = b.peer.frames[0]["result"]
        acp.schema.InitializeResponse.model_validate(answer)
        assert answer["protocolVersion"] == 1
        caps = answer["agentCapabilities"]
        assert caps["loadSession"] is True
        assert caps["sessionCapabilities"] == {
            "list": {},
            "resume": {},
            "close": {},
            "delete": {},
            "fork": {},
            "additionalDirectories": {},
        }
        assert caps["_meta"] == {"claudeCode": {"promptQueueing": True}}
        assert answer["_meta"] == {"steering": {"supported": True}}
        refused = await b.peer.call("authenticate", {"methodId": "x"})
        assert refused["error"]["code"] == -32602
        assert "methodId 'x' is not an advertised auth method" in refused["error"]["message"]
        assert (await b.peer.call("authenticate", {}))["error"]["code"] == -32602


async def test_a_prompt_streams_its_updates_before_its_response(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel(delay=0.01)) as b:
        session = await b.peer.new_session()
        request = await b.peer.request(
            "session/prompt",
            {"sessionId": session, "prompt": [{"type": "text", "text": "hello brave world"}]},
        )
        answer = await b.peer.response(request)
        assert answer["result"] == {"stopReason": "end_turn"}
        updates = b.peer.updates(session)
        assert texts(updates) == "hello brave world"
        last_update = max(
            i for i, f in enumerate(b.peer.frames) if f.get("method") == "session/update"
        )
        assert last_update < b.peer.index_of(answer)
        chunks = [u for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
        assert len({u["messageId"] for u in chunks}) == 1
        assert [u["title"] for u in updates if u["sessionUpdate"] == "session_info_update"] == [
            "hello brave world"
        ]
        validate(b.peer, {request: "session/prompt"})


async def test_tool_calls_become_tool_call_updates(tmp_path: Path) -> None:
    model = ScriptedModel([[Say("Looking."), CallTool("missing_tool", {"x": 1})], [Say("Done.")]])
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session()
        answer = await b.peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        )
        assert answer["result"]["stopReason"] == "end_turn"
        tool_updates = [
            u for u in b.peer.updates(session) if u["sessionUpdate"].startswith("tool_call")
        ]
        assert [(u["sessionUpdate"], u["status"]) for u in tool_updates] == [
            ("tool_call", "pending"),  # an unknown tool never runs: no in_progress
            ("tool_call_update", "failed"),
        ]
        assert tool_updates[0]["rawInput"] == {"x": 1}
        assert tool_updates[0]["kind"] == "other"
        validate(b.peer)


async def test_a_queued_prompt_is_answered_by_its_own_turn(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel(delay=0.1)) as b:
        session = await b.peer.new_session()
        first = await b.peer.request(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "a b c"}]}
        )
        await trio.sleep(0.05)
        second = await b.peer.request(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "d e"}]}
        )
        one = await b.peer.response(first)
        two = await b.peer.response(second)
        assert one["result"] == two["result"] == {"stopReason": "end_turn"}
        assert b.peer.index_of(one) < b.peer.index_of(two)
        log = b.runtime.sessions.get(session).events  # type: ignore[union-attr]
        assert [t for t, _ in turn_ends(log)] == [1, 2]


async def test_a_prompts_answer_comes_before_the_next_turns_updates(tmp_path: Path) -> None:
    # Each prompt is queued while the one before runs, so the agent starts the
    # next turn the moment the last one settles: its updates still wait for that
    # answer (a client reads them as the answer's otherwise).
    rounds = 12
    model = ScriptedModel([[Say(f"turn-{i} "), Wait(1)] for i in range(rounds)], delay=0)
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session()
        requests = []
        for i in range(rounds):
            params = {"sessionId": session, "prompt": [{"type": "text", "text": f"p{i}"}]}
            requests.append(await b.peer.request("session/prompt", params))
            await b.peer.wait_for(lambda f, i=i: f"turn-{i} " in json.dumps(f))
        answers = [await b.peer.response(request) for request in requests]
        assert all(a["result"]["stopReason"] == "end_turn" for a in answers)
        for i in range(1, rounds):
            first_update = next(
                n for n, f in enumerate(b.peer.frames) if f"turn-{i} " in json.dumps(f)
            )
            assert b.peer.index_of(answers[i - 1]) < first_update
        validate(b.peer)


async def test_a_refusal_is_answered_refusal(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel([[Say("I can"), End("refusal")]])) as b:
        session = await b.peer.new_session()
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "bad"}]}
        assert (await b.peer.call("session/prompt", prompt))["result"] == {"stopReason": "refusal"}
        assert (await b.peer.call("session/prompt", prompt))["result"] == {"stopReason": "end_turn"}
        validate(b.peer)


async def test_cancel_right_after_prompt_leaves_at_most_one_turn(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel([[Say("x"), Hang()]])) as b:
        session = await b.peer.new_session()
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        request = await b.peer.request("session/prompt", prompt)
        await b.peer.notify("session/cancel", {"sessionId": session})
        answer = await b.peer.response(request)
        assert answer["result"] == {"stopReason": "cancelled"}
        agent = b.runtime.agents.get(session)
        assert agent is not None
        await agent.when_idle()
        assert kinds(agent.session.events).count("turn/start") <= 1
        after = [f for f in b.peer.frames[b.peer.index_of(answer) :] if "method" in f]
        assert after == []  # no update for that turn after its response
        assert agent.status == "idle"


async def test_mid_stream_cancel_then_an_immediate_prompt_runs_it(tmp_path: Path) -> None:
    model = ScriptedModel([[Say("partial "), Hang()]], delay=0.01)
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session()
        first = await b.peer.request(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "one"}]}
        )
        await b.peer.wait_for(lambda f: f.get("method") == "session/update")
        await b.peer.notify("session/cancel", {"sessionId": session})
        second = await b.peer.request(
            "session/prompt",
            {"sessionId": session, "prompt": [{"type": "text", "text": "second prompt"}]},
        )
        assert (await b.peer.response(first))["result"] == {"stopReason": "cancelled"}
        assert (await b.peer.response(second))["result"] == {"stopReason": "end_turn"}
        assert texts(b.peer.updates(session)) == "partial second prompt"


async def test_cancel_answers_every_queued_prompt_and_spares_the_other_session(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([[Say("x"), Hang()]], delay=0.01)
    async with bridge(tmp_path, model) as b:
        busy = await b.peer.new_session()
        other = await b.peer.new_session()
        running = await b.peer.request(
            "session/prompt", {"sessionId": busy, "prompt": [{"type": "text", "text": "run"}]}
        )
        await b.peer.wait_for(lambda f: f.get("method") == "session/update")
        queued = await b.peer.request(
            "session/prompt", {"sessionId": busy, "prompt": [{"type": "text", "text": "later"}]}
        )
        elsewhere = await b.peer.request(
            "session/prompt", {"sessionId": other, "prompt": [{"type": "text", "text": "a b"}]}
        )
        await b.peer.notify("session/cancel", {"sessionId": busy})
        assert (await b.peer.response(running))["result"] == {"stopReason": "cancelled"}
        assert (await b.peer.response(queued))["result"] == {"stopReason": "cancelled"}
        assert (await b.peer.response(elsewhere))["result"] == {"stopReason": "end_turn"}
        assert texts(b.peer.updates(other)) == "a b"
        busy_log = b.runtime.sessions.get(busy).events  # type: ignore[union-attr]
        assert "later" not in str(busy_log)


async def test_cancel_request_of_a_queued_prompt_withdraws_only_that_prompt(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([[Say("working"), Wait(1)]], delay=0.01)
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session()

        async def prompt(text: str) -> int:
            params = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
            return await b.peer.request("session/prompt", params)

        running = await prompt("run")
        await b.peer.wait_for(lambda f: f.get("method") == "session/update")
        withdrawn, kept = await prompt("withdrawn one"), await prompt("kept one")
        await b.peer.notify("$/cancel_request", {"requestId": withdrawn})
        assert (await b.peer.response(withdrawn))["result"] == {"stopReason": "cancelled"}
        assert (await b.peer.response(running))["result"] == {"stopReason": "end_turn"}
        assert (await b.peer.response(kept))["result"] == {"stopReason": "end_turn"}
        log = b.runtime.sessions.get(session).events  # type: ignore[union-attr]
        assert [e.content for e in log if isinstance(e, UserMessage)] == ["run", "kept one"]
        assert [reason for _, reason in turn_ends(log)] == [COMPLETED, COMPLETED]
        # The running prompt's own cancel request is the session's cancel.
        running = await prompt("one two three four five six")
        await trio.sleep(0.025)  # the echo says a word every 0.01 s: mid-stream
        await b.peer.notify("$/cancel_request", {"requestId": running})
        assert (await b.peer.response(running))["result"] == {"stopReason": "cancelled"}


async def test_steering_joins_the_running_turn(tmp_path: Path) -> None:
    model = ScriptedModel([[Say("working"), Wait(1)], [Say("steered")]])
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session()
        prompt = await b.peer.request(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        )
        await b.peer.wait_for(lambda f: f.get("method") == "session/update")
        steered = await b.peer.call(
            "_session/steering",
            {"sessionId": session, "prompt": [{"type": "text", "text": "left"}]},
        )
        assert steered["result"] == {"outcome": "injected"}
        assert (await b.peer.response(prompt))["result"] == {"stopReason": "end_turn"}
        assert texts(b.peer.updates(session)) == "workingsteered"


async def test_disconnect_mid_prompt_leaves_no_agent_and_no_session_entry(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel([[Say("x"), Hang()]])) as b:
        session = await b.peer.new_session()
        request = await b.peer.request(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        )
        await b.peer.wait_for(lambda f: f.get("method") == "session/update")
        await b.peer.close()
        await b.served.wait()
        assert (await b.peer.response(request))["result"] == {"stopReason": "cancelled"}
        assert b.runtime.agents.list() == []
        assert b.runtime.sessions.list() == []
        _, stored = await b.persistence.load(session)
        assert turn_ends(stored) == [(1, DISPOSED)]


@pytest.mark.real_clock
async def test_disconnect_kills_the_sessions_background_bash_tasks(tmp_path: Path) -> None:
    start = {"command": "sleep 60", "description": "wait", "run_in_background": True}
    model = ScriptedModel([[CallTool("bash", start)], [Say("started")]], delay=0)
    with trio.fail_after(20):
        async with bridge(tmp_path, model, bash=True) as b:
            session = await b.peer.new_session(str(tmp_path))
            answer = await b.peer.call(
                "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
            )
            assert answer["result"] == {"stopReason": "end_turn"}
            (task,) = b.runtime.bash.list()
            assert b.runtime.bash.owner_of(task.id) == session
            ended: list[BashTask] = []
            b.runtime.bash.on_task_done(ended.append)
            await b.peer.close()
            await b.served.wait()
            # Ended and reaped before the session's agent was gone, then forgotten.
            assert [(t.id, t.status) for t in ended] == [(task.id, "killed")]
            assert b.runtime.bash.get(task.id) is None


async def test_a_late_session_new_after_close_creates_no_agent(tmp_path: Path) -> None:
    gate = trio.Event()

    class GatedCreate(Delegating):
        """The create is held at the gate: it lands after the close."""

        async def create(self, header: SessionHeader) -> None:
            await gate.wait()
            await self.inner.create(header)

    async with bridge(tmp_path, ScriptedModel(), GatedCreate(JsonlPersistence(tmp_path))) as b:
        request = await b.peer.request("session/new", {"cwd": "/w", "mcpServers": []})
        await trio.testing.wait_all_tasks_blocked()
        await b.peer.close()  # teardown runs while the create is held
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await b.served.wait()
        answer = await b.peer.response(request)
        assert "error" in answer
        assert b.runtime.agents.list() == []
        assert b.runtime.sessions.list() == []


async def test_a_load_racing_teardown_leaks_nothing(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        session = await b.peer.new_session()
        await b.peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]}
        )
        await b.peer.call("session/close", {"sessionId": session})
    gated = GatedOpen(store)

    async with bridge(tmp_path, ScriptedModel(), persistence=gated) as b:
        load = await b.peer.request(
            "session/load", {"sessionId": session, "cwd": "/tmp", "mcpServers": []}
        )
        await trio.testing.wait_all_tasks_blocked()
        await b.peer.close()
        await trio.testing.wait_all_tasks_blocked()
        gated.gate.set()
        await b.served.wait()
        assert "error" in await b.peer.response(load)
        assert b.runtime.agents.list() == []
        assert b.runtime.sessions.list() == []


async def test_load_replays_the_whole_conversation_before_responding(tmp_path: Path) -> None:
    model = ScriptedModel([[Think("hmm"), Say("Checking."), CallTool("nope", {})], [Say("Ok.")]])
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session()
        await b.peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "q?"}]}
        )
        live = b.peer.updates(session)
    async with bridge(tmp_path, ScriptedModel()) as b:
        listed = await b.peer.call("session/list", {})
        (info,) = listed["result"]["sessions"]
        assert (info["sessionId"], info["cwd"], info["title"]) == (session, "/tmp", "q?")
        assert info["updatedAt"].endswith("Z")
        answer = await b.peer.call(
            "session/load", {"sessionId": session, "cwd": "/tmp", "mcpServers": []}
        )
        assert answer["result"]["modes"]["currentModeId"] == "default"
        replayed = b.peer.updates(session)
        assert replayed[0] == {
            "sessionUpdate": "user_message_chunk",
            "content": {"type": "text", "text": "q?"},
            "messageId": replayed[0]["messageId"],
        }
        assert replayed[1:] == live  # the same presenter: the same frames
        # Every replayed update before the answer; the slash commands come after it.
        last = max(
            i
            for i, f in enumerate(b.peer.frames)
            if f.get("method") == "session/update"
            and f["params"]["update"]["sessionUpdate"] != "available_commands_update"
        )
        assert last < b.peer.index_of(answer)
        again = await b.peer.call(
            "session/load", {"sessionId": session, "cwd": "/tmp", "mcpServers": []}
        )
        assert "already loaded" in again["error"]["message"]
        validate(b.peer)


async def test_resume_restores_without_replay_and_close_frees_the_session(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        session = await b.peer.new_session()
        await b.peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "one"}]}
        )
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        answer = await b.peer.call(
            "session/resume", {"sessionId": session, "cwd": "/tmp", "mcpServers": []}
        )
        assert answer["result"]["modes"]["currentModeId"] == "default"
        assert b.peer.updates(session) == []
        second = await b.peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "two"}]}
        )
        assert second["result"] == {"stopReason": "end_turn"}
        assert [t for t, _ in turn_ends(b.runtime.sessions.get(session).events)] == [1, 2]  # type: ignore[union-attr]
        assert (await b.peer.call("session/close", {"sessionId": session}))["result"] == {}
        assert b.runtime.agents.list() == []
        assert b.runtime.sessions.list() == []
        wrong = await b.peer.call(
            "session/load", {"sessionId": session, "cwd": "/elsewhere", "mcpServers": []}
        )
        assert "belongs to cwd '/tmp'" in wrong["error"]["message"]
        assert b.runtime.agents.list() == []


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        (b"{not json", -32700, "not JSON"),
        (b"[1, 2, 3]", -32600, "no batches"),
        (b'[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', -32600, "no batches"),
        (b"42", -32600, "one JSON-RPC object"),
        (b'{"jsonrpc":"2.0","id":3,"method":"\xff"}', -32700, "not JSON"),
        (b'{"jsonrpc":"2.0","id":7,"method":"nope/nothing"}', -32601, "method not found"),
        (b'{"id":8,"method":"session/list","params":{}}', -32600, 'jsonrpc must be "2.0"'),
        (b'{"jsonrpc":"1.0","id":8,"method":"session/list"}', -32600, 'jsonrpc must be "2.0"'),
        (b'{"jsonrpc":2.0,"method":"session/cancel"}', -32600, 'jsonrpc must be "2.0"'),
        (
            b'{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":5}}',
            -32602,
            "$.cwd",
        ),
        (
            b'{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"rel"}}',
            -32602,
            "cwd must be an absolute path",
        ),
        (
            b'{"jsonrpc":"2.0","id":7,"method":"session/prompt",'
            b'"params":{"sessionId":"ghost","prompt":[{"type":"text","text":"x"}]}}',
            -32002,
            "unknown session 'ghost'",
        ),
        (
            b'{"jsonrpc":"2.0","id":7,"method":"session/prompt",'
            b'"params":{"sessionId":"s","prompt":[{"type":"audio","data":""}]}}',
            -32602,
            "$.prompt[0].type",
        ),
    ],
)
async def test_bad_frames_get_errors_and_the_connection_lives_on(
    tmp_path: Path, raw: bytes, code: int, message: str
) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        await b.peer.send_raw(raw + b"\n")
        error = await b.peer.wait_for(lambda f: "error" in f)
        assert error["error"]["code"] == code
        assert message in error["error"]["message"]
        if b'"id":8' in raw:  # a usable id is answered, whatever else is wrong
            assert error["id"] == 8
        assert "result" in await b.peer.call("session/list", {})
        validate(b.peer)


async def test_notifications_are_never_answered(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        await b.peer.notify("_vendor/ping", {})
        await b.peer.notify("session/cancel", {"sessionId": "ghost"})
        await b.peer.notify("session/cancel", {"wrong": True})
        await b.peer.notify("who/knows", {})
        assert "result" in await b.peer.call("session/list", {})
        assert len(b.peer.frames) == 2  # initialize's answer and session/list's


async def test_a_ten_megabyte_line_is_refused_and_the_next_frame_served(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        huge = b'{"jsonrpc":"2.0","id":1,"method":"x","params":"' + b"a" * 10_000_000 + b'"}\n'
        await b.peer.send_raw(huge)
        error = await b.peer.wait_for(lambda f: "error" in f)
        assert "frame longer than" in error["error"]["message"]
        assert "result" in await b.peer.call("session/list", {})


@hypothesis.settings(
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture], max_examples=60
)
@hypothesis.given(
    lines=st.lists(
        st.one_of(
            st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                lambda inner: (
                    st.lists(inner, max_size=4)
                    | st.dictionaries(
                        st.sampled_from(
                            ["jsonrpc", "id", "method", "params", "sessionId", "prompt", "cwd"]
                        ),
                        inner,
                        max_size=5,
                    )
                ),
                max_leaves=12,
            ).map(lambda v: json.dumps(v).encode()),
        ),
        max_size=8,
    )
)
# A frame answered with an id the test's own requests also use (found in CI).
@hypothesis.example(lines=[b'{"jsonrpc": null, "id": 2}', b'{"jsonrpc":"2.0","id":1}'])
async def test_the_reader_survives_anything(
    lines: list[bytes], tmp_path_factory: pytest.TempPathFactory, autojump_clock: object
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    async with bridge(root, ScriptedModel(delay=0)) as b:
        for line in lines:
            await b.peer.send_raw(line + b"\n")
        assert "result" in await b.peer.call("session/list", {})
        for frame in b.peer.frames:
            assert frame["jsonrpc"] == "2.0"
            assert ("result" in frame) != ("error" in frame) or "method" in frame


async def test_list_filters_by_cwd_pages_with_a_cursor_and_delete_is_idempotent(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        sessions = [await b.peer.new_session() for _ in range(3)]
        elsewhere = await b.peer.new_session(str(other))
        for session in sessions:
            prompt = {"sessionId": session, "prompt": [{"type": "text", "text": f"I am {session}"}]}
            await b.peer.call("session/prompt", prompt)
        mine = await b.peer.call("session/list", {"cwd": "/tmp"})
        listed = [s["sessionId"] for s in mine["result"]["sessions"]]
        assert listed == sessions[::-1]  # the most recently changed first
        assert elsewhere not in listed
        assert all(s["title"] == f"I am {s['sessionId']}" for s in mine["result"]["sessions"])
        deleted = await b.peer.call("session/delete", {"sessionId": sessions[0]})
        assert deleted["result"] == {}
        assert b.runtime.agents.get(sessions[0]) is None  # the live one was closed first
        again = await b.peer.call("session/delete", {"sessionId": sessions[0]})
        assert again["result"] == {}
        left = await b.peer.call("session/list", {})
        assert sorted(s["sessionId"] for s in left["result"]["sessions"]) == sorted(
            [*sessions[1:], elsewhere]
        )
        load = {"sessionId": sessions[0], "cwd": "/tmp", "mcpServers": []}
        assert (await b.peer.call("session/load", load))["error"]["code"] == -32002
        validate(b.peer)


async def test_load_and_resume_take_the_additional_roots_sent_now(tmp_path: Path) -> None:
    from greenroom.tools.files import files_plugin

    work, shared, other = tmp_path / "work", tmp_path / "shared", tmp_path / "other"
    for directory in (work, shared, other):
        directory.mkdir()
    (shared / "a.txt").write_text("in shared")
    (other / "b.txt").write_text("in other")

    def read(path: Path) -> CallTool:
        return CallTool("read_file", {"path": str(path)})

    steps = [read(shared / "a.txt"), Say("1"), read(shared / "a.txt"), Say("2")]
    model = ScriptedModel([[step] for step in [*steps, read(other / "b.txt"), Say("3")]], delay=0)
    async with bridge(tmp_path / "store", model) as b:
        await b.runtime.plug("tool-files", files_plugin)
        new = {"cwd": str(work), "mcpServers": [], "additionalDirectories": [str(shared)]}
        session = (await b.peer.call("session/new", new))["result"]["sessionId"]
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        await b.peer.call("session/prompt", prompt)
        await b.peer.call("session/close", {"sessionId": session})
        # Loaded without the field: no additional roots, the stored one included.
        load = {"sessionId": session, "cwd": str(work), "mcpServers": []}
        assert "result" in await b.peer.call("session/load", load)
        await b.peer.call("session/prompt", prompt)
        await b.peer.call("session/close", {"sessionId": session})
        resume = {**load, "additionalDirectories": [str(other)]}
        assert "result" in await b.peer.call("session/resume", resume)
        await b.peer.call("session/prompt", prompt)
        agent = b.runtime.agents.by_session(session)
        assert agent is not None
        results = [e for e in agent.session.events if isinstance(e, ToolResult)]
        assert [(r.is_error, r.content.split(":")[0]) for r in results] == [
            (False, "in shared"),
            (True, "read_file"),  # refused: outside the session's directories
            (False, "in other"),
        ]
        assert "outside the session's directories" in results[1].content
        bad = {**load, "additionalDirectories": ["relative"]}
        answer = await b.peer.call("session/load", bad)
        assert answer["error"]["code"] == -32602
        assert "additionalDirectories must be an absolute path" in answer["error"]["message"]
    header, _ = await JsonlPersistence(tmp_path / "store").load(session)
    assert header.additional_directories == [str(shared)]  # the stored header is untouched


async def test_a_long_list_pages(tmp_path: Path) -> None:
    from greenroom.acp.starts import LIST_PAGE

    async with bridge(tmp_path, ScriptedModel()) as b:
        for _ in range(LIST_PAGE + 3):
            await b.peer.new_session()
        first = (await b.peer.call("session/list", {}))["result"]
        assert len(first["sessions"]) == LIST_PAGE
        rest = (await b.peer.call("session/list", {"cursor": first["nextCursor"]}))["result"]
        assert len(rest["sessions"]) == 3
        assert "nextCursor" not in rest
        assert not {s["sessionId"] for s in first["sessions"]} & {
            s["sessionId"] for s in rest["sessions"]
        }
        bad = await b.peer.call("session/list", {"cursor": "x"})
        assert bad["error"]["code"] == -32602


@pytest.mark.real_clock
async def test_the_echo_model_runs_a_bash_prompt_after_asking(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with bridge(tmp_path, ScriptedModel(delay=0), bash=True) as b:
            session = await b.peer.new_session(str(tmp_path))
            prompt = [{"type": "text", "text": "bash: echo hi there"}]
            answer = await b.peer.call("session/prompt", {"sessionId": session, "prompt": prompt})
            assert answer["result"] == {"stopReason": "end_turn"}
            (asked,) = [f for f in b.peer.frames if f.get("method") == "session/request_permission"]
            assert asked["params"]["toolCall"]["title"] == "echo hi there"
            assert asked["params"]["toolCall"]["kind"] == "execute"
            assert texts(b.peer.updates(session)) == "hi there\n[exit code: 0]"
            validate(b.peer)


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ([{"name": "a", "command": 7, "args": [], "env": []}], "mcpServers[0].command"),
        ([{"name": "a", "args": [], "env": []}], "mcpServers[0]"),
        (
            [{"type": "sse", "name": "a", "url": "http://x", "headers": []}],
            "'sse' is not supported",
        ),
        ([{"type": "http", "name": "a", "url": "file:///x", "headers": []}], "mcpServers[0].url"),
        (
            [
                {"name": "a", "command": "x", "args": [], "env": []},
                {"type": "http", "name": "a", "url": "http://x", "headers": []},
            ],
            "mcpServers[1].name: 'a' is given twice",
        ),
        ([{"name": "a", "command": "x", "args": ["\u0000"], "env": []}], "must not contain NUL"),
        (
            [{"name": "a", "command": "x", "args": [], "env": [{"name": "A=B", "value": ""}]}],
            "mcpServers[0].env",
        ),
        (
            [{"name": f"s{i}", "command": "x", "args": [], "env": []} for i in range(65)],
            "mcpServers: 65 servers given; a session may have at most 64",
        ),
    ],
)
async def test_bad_mcp_servers_are_invalid_params_naming_the_entry(
    tmp_path: Path, servers: list[dict[str, Any]], message: str
) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        caps = b.peer.frames[0]["result"]["agentCapabilities"]
        assert caps["mcpCapabilities"] == {"http": True, "sse": False}
        answer = await b.peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": servers})
        assert answer["error"]["code"] == -32602
        assert message in answer["error"]["message"]
        assert b.runtime.agents.list() == []
        load = await b.peer.call(
            "session/load", {"sessionId": "x", "cwd": str(tmp_path), "mcpServers": servers}
        )
        assert load["error"]["code"] == -32602


async def test_a_server_that_cannot_start_is_told_after_the_sessions_answer(
    tmp_path: Path,
) -> None:
    missing = {"name": "gone", "command": str(tmp_path / "nothing"), "args": [], "env": []}
    async with bridge(tmp_path, ScriptedModel()) as b:
        request = await b.peer.request(
            "session/new", {"cwd": str(tmp_path), "mcpServers": [missing]}
        )
        answer = await b.peer.response(request)
        session = answer["result"]["sessionId"]
        told = await b.peer.wait_for(
            lambda f: (
                f.get("method") == "session/update"
                and "given up" in f["params"]["update"].get("content", {}).get("text", "")
            )
        )
        texts = [u["content"]["text"] for u in b.peer.updates(session)]
        # Told once when it failed, once when it was given up; never before the answer.
        assert len(texts) == 2
        assert texts[0].startswith("MCP server 'gone' failed: FileNotFoundError")
        assert b.peer.index_of(answer) < b.peer.index_of(told)
        first = next(f for f in b.peer.frames if f.get("method") == "session/update")
        assert b.peer.index_of(answer) < b.peer.index_of(first)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_entry = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["stdio", "http", "sse", "acp", 3]) | _json,
        "name": st.text(max_size=6) | _json,
        "command": st.text(max_size=6) | _json,
        "args": st.lists(st.text(max_size=4)) | _json,
        "env": st.lists(st.fixed_dictionaries({"name": st.text(max_size=4), "value": _json}))
        | _json,
        "url": st.sampled_from(["http://x/mcp", "https://y", "ftp://z", ""]) | _json,
        "headers": st.lists(st.fixed_dictionaries({"name": _json, "value": st.text()})) | _json,
    },
)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(_entry, max_size=4))
def test_any_mcp_servers_entry_is_a_spec_or_invalid_params(entries: list[dict[str, Any]]) -> None:
    """What an editor sends as ``mcpServers`` becomes specs or -32602, never anything else."""
    refused: RpcError | None = None
    try:
        servers = servers_from_acp(entries)
    except RpcError as exc:
        refused = exc
    if refused is None:
        assert len(servers) == len(entries)
    else:
        assert refused.code == -32602
        assert refused.message.startswith("invalid params: mcpServers")


async def test_a_task_calls_child_streams_into_the_call_and_a_cancel_stops_it(
    tmp_path: Path,
) -> None:
    from greenroom.tools.subagents import task_plugin
    from tests.actors.test_subagents import Routed, task

    model = Routed(
        {
            "parent": [
                [task("child: look around", description="looking")],
                [Say("thanks")],
                [task("child: hang")],
            ],
            "child: look": [[Say("found two files"), CallTool("nothing")], [Say("the answer")]],
            "child: hang": [[Hang()]],
        }
    )
    async with bridge(tmp_path, model) as b:  # type: ignore[arg-type]
        await b.runtime.plug("tool-task", task_plugin)
        session = await b.peer.new_session(str(tmp_path))
        answer = await b.peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "parent"}]}
        )
        assert answer["result"]["stopReason"] == "end_turn"
        updates = b.peer.updates(session)
        (start,) = [u for u in updates if u["sessionUpdate"] == "tool_call"]
        assert (start["title"], start["kind"]) == ("looking", "think")
        calls = [u for u in updates if u["sessionUpdate"] == "tool_call_update"]
        progress = [
            c["content"][0]["content"]["text"]
            for c in calls
            if c["status"] == "in_progress" and "content" in c
        ]
        assert progress[0] == "found two files"
        assert progress[-1] == "found two files\n\n- nothing\n\nthe answer"
        assert calls[-1]["status"] == "completed"
        assert calls[-1]["content"][0]["content"]["text"] == "the answer"
        # Cancelling the parent's prompt stops the child it started.
        request = await b.peer.request(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "again"}]}
        )
        while not any(
            a.session.header.parent_session == session and a.status == "running"
            for a in b.runtime.agents.list()
        ):
            await trio.sleep(0.01)
        (child,) = [a for a in b.runtime.agents.list() if a.session.header.parent_session]
        await b.peer.notify("session/cancel", {"sessionId": session})
        assert (await b.peer.response(request))["result"]["stopReason"] == "cancelled"
        assert turn_ends(child.session.events)[-1][1] == Aborted("session/cancel")


@pytest.mark.real_clock
async def test_a_childs_permission_is_asked_on_the_clients_session(tmp_path: Path) -> None:
    from greenroom.tools.subagents import task_plugin
    from tests.actors.test_subagents import Routed, task

    model = Routed(
        {
            "parent": [[task("child: run it")], [Say("done")]],
            # The child's call id is its parent's too ("call-1"): the ask must tell them apart.
            "child: run": [
                [CallTool("bash", {"command": "echo from-child", "description": "echo"})],
                [Say("ran it")],
            ],
        }
    )
    with trio.fail_after(20):
        async with bridge(tmp_path, model, bash=True) as b:  # type: ignore[arg-type]
            await b.runtime.plug("tool-task", task_plugin)
            session = await b.peer.new_session(str(tmp_path))
            prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "parent"}]}
            assert (await b.peer.call("session/prompt", prompt))["result"]["stopReason"] == (
                "end_turn"
            )
            assert b.persistence is not None
            (asked,) = [f for f in b.peer.frames if f.get("method") == "session/request_permission"]
            (child,) = [s for s in await b.persistence.list() if s.header.parent_session]
            assert asked["params"]["sessionId"] == session
            call = asked["params"]["toolCall"]
            assert call["toolCallId"].startswith(f"{child.header.id}/")
            assert call["title"] == "echo from-child"
            # Once options only: an "always" would be kept by the child's session alone.
            offered = [o["optionId"] for o in asked["params"]["options"]]
            assert offered == ["allow_once", "reject_once"]
            # The question, a tool call of the client's session now, is closed there.
            closed = [
                f["params"]["update"]
                for f in b.peer.frames
                if f.get("method") == "session/update"
                and f["params"]["update"].get("toolCallId") == call["toolCallId"]
            ]
            assert [u["status"] for u in closed] == ["completed"]
            _, events = await b.persistence.load(child.header.id)
            ran = [e for e in events if isinstance(e, ToolResult)]
            assert [(e.is_error, e.content) for e in ran] == [(False, "from-child\n[exit code: 0]")]
            sent = {
                f["params"]["sessionId"]
                for f in b.peer.frames
                if "sessionId" in f.get("params", {})
            }
            assert sent == {session}
            validate(b.peer)


async def test_an_answer_a_childs_question_did_not_offer_is_a_refusal(tmp_path: Path) -> None:
    from greenroom.tools.subagents import task_plugin
    from tests.actors.test_subagents import Routed, task

    async def always(request: dict[str, Any]) -> dict[str, Any]:
        return {"outcome": {"outcome": "selected", "optionId": "allow_always"}}

    model = Routed(
        {
            "parent": [[task("child: write it")], [Say("done")]],
            "child: write": [[CallTool("write_file", {"path": "x", "content": "y"})], [Say("ok")]],
        }
    )
    async with bridge(tmp_path, model) as b:  # type: ignore[arg-type]
        from greenroom.tools.files import files_plugin

        await b.runtime.plug("tool-task", task_plugin)
        await b.runtime.plug("tool-files", files_plugin)
        b.peer.answer = always
        session = await b.peer.new_session(str(tmp_path))
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "parent"}]}
        await b.peer.call("session/prompt", prompt)
        assert b.persistence is not None
        (child,) = [s for s in await b.persistence.list() if s.header.parent_session]
        _, events = await b.persistence.load(child.header.id)
        (result,) = [e for e in events if isinstance(e, ToolResult)]
        assert result.is_error
        assert "refused" in result.content
        assert not (tmp_path / "x").exists()


async def test_session_fork_takes_a_copy_live_and_leaves_the_original(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        session = await b.peer.new_session(str(tmp_path))
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "hello"}]}
        await b.peer.call("session/prompt", prompt)
        before = [
            msgspec.to_builtins(e) for e in b.runtime.agents.by_session(session).session.events
        ]  # type: ignore[union-attr]
        forked = await b.peer.call(
            "session/fork", {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
        )
        fork = forked["result"]["sessionId"]
        assert fork != session
        assert forked["result"]["modes"]["currentModeId"] == "default"
        again = {"sessionId": fork, "prompt": [{"type": "text", "text": "on the fork"}]}
        assert (await b.peer.call("session/prompt", again))["result"]["stopReason"] == "end_turn"
        copy = b.runtime.agents.by_session(fork)
        assert copy is not None
        assert copy.session.header.forked_from == session
        assert [msgspec.to_builtins(e) for e in copy.session.events[: len(before)]] == before
        original = b.runtime.agents.by_session(session)
        assert original is not None
        assert [msgspec.to_builtins(e) for e in original.session.events] == before
        missing = await b.peer.call(
            "session/fork", {"sessionId": "nope", "cwd": str(tmp_path), "mcpServers": []}
        )
        assert missing["error"]["code"] == -32002


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


PROMPT = [{"type": "text", "text": "go"}]


async def test_a_spec_cancel_request_cancels_the_prompt_it_names(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel([[Say("x"), Hang()]])) as b:
        session = await b.peer.new_session()
        prompt = await b.peer.request("session/prompt", {"sessionId": session, "prompt": PROMPT})
        await trio.testing.wait_all_tasks_blocked()
        await b.peer.notify("$/cancel_request", {"requestId": prompt})
        assert (await b.peer.response(prompt))["result"] == {"stopReason": "cancelled"}


@pytest.mark.parametrize("method", ["session/cancel", "$/cancel_request"])
async def test_a_cancel_sent_as_a_request_acts_and_is_answered(tmp_path: Path, method: str) -> None:
    async with bridge(tmp_path, ScriptedModel([[Say("x"), Hang()]])) as b:
        session = await b.peer.new_session()
        prompt = await b.peer.request("session/prompt", {"sessionId": session, "prompt": PROMPT})
        await trio.testing.wait_all_tasks_blocked()
        params = {"sessionId": session} if method == "session/cancel" else {"requestId": prompt}
        cancel = await b.peer.request(method, params)
        assert (await b.peer.response(cancel))["result"] == {}
        assert (await b.peer.response(prompt))["result"] == {"stopReason": "cancelled"}


async def test_a_last_frame_without_its_newline_is_served(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        await b.peer.send_raw(b'{"jsonrpc":"2.0","id":"last","method":"session/list","params":{}}')
        await b.peer.close()
        await b.served.wait()
        assert "result" in await b.peer.response("last")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_id", ["1.5", '{"a":1}', "true", "[1]"])
async def test_an_id_of_the_wrong_type_is_named(tmp_path: Path, bad_id: str) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        await b.peer.send_raw(
            b'{"jsonrpc":"2.0","id":%s,"method":"session/list"}\n' % bad_id.encode()
        )
        error = await b.peer.wait_for(lambda f: "error" in f)
        assert error["id"] is None
        assert error["error"]["code"] == -32600
        assert error["error"]["message"].startswith("id must be a string, an integer or null")
        assert "result" in await b.peer.call("session/list", {})


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("member", ["params", "other"])
async def test_a_frame_nested_too_deep_is_answered_with_its_id(
    tmp_path: Path, depth: int, member: str
) -> None:
    deep = "[" * depth + "]" * depth
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        frame = f'{{"jsonrpc":"2.0","method":"session/new","{member}":{deep},"id":77}}'
        await b.peer.send_raw(frame.encode() + b"\n")
        answer = await b.peer.response(77)
        assert answer["error"]["code"] == (-32602 if member == "params" else -32600)
        assert "nested too deep" in answer["error"]["message"]
        session = await b.peer.new_session()
        prompt = await b.peer.call("session/prompt", {"sessionId": session, "prompt": PROMPT})
        assert prompt["result"] == {"stopReason": "end_turn"}


@pytest.mark.parametrize(
    ("session_id", "message"),
    [("s" * 5000, "sessionId: session id is too long"), ("", "a session id must be")],
)
async def test_acp_refuses_a_bad_session_id_naming_it(
    tmp_path: Path, session_id: str, message: str
) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        for method in ("session/load", "session/resume"):
            answer = await b.peer.call(
                method, {"sessionId": session_id, "cwd": "/tmp", "mcpServers": []}
            )
            assert answer["error"]["code"] == -32602
            assert message in answer["error"]["message"]
            assert "agent id" not in answer["error"]["message"]


@pytest.mark.parametrize(
    ("cwd", "message"),
    [
        ("/no/such/place", "cwd '/no/such/place' is not an existing directory"),
        ("/tmp/a\x00b", "cwd holds a NUL byte"),
    ],
)
async def test_session_new_refuses_a_cwd_it_cannot_use(
    tmp_path: Path, cwd: str, message: str
) -> None:
    async with bridge(tmp_path, ScriptedModel()) as b:
        answer = await b.peer.call("session/new", {"cwd": cwd, "mcpServers": []})
        assert answer["error"]["code"] == -32602
        assert message in answer["error"]["message"]
        assert b.runtime.agents.list() == []


async def test_every_method_before_initialize_is_refused_naming_it(tmp_path: Path) -> None:
    """session/new before initialize was served: the client had not said what it offers."""
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as runtime:
        client, server = trio.testing.memory_stream_pair()
        peer = Peer(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.read_loop)
            nursery.start_soon(connection.serve_connection, runtime, server)
            session = {"sessionId": "s1"}
            early = {
                "session/new": {"cwd": str(tmp_path), "mcpServers": []},
                "session/load": {"cwd": str(tmp_path), "mcpServers": [], **session},
                "session/list": {},
                "session/prompt": {"prompt": PROMPT, **session},
                "session/set_mode": {"modeId": "default", **session},
                "session/close": session,
                "session/cancel": session,  # a notification sent as a request
                "authenticate": {"methodId": "x"},
            }
            for method, params in early.items():
                answer = await peer.call(method, params)
                assert answer["error"]["code"] == -32600, (method, answer)
                assert answer["error"]["message"] == (
                    f"{method} before initialize: the client must initialize first"
                )
            assert (await peer.call("nope/nothing"))["error"]["code"] == -32601
            assert not list(tmp_path.iterdir())  # nothing was made
            await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            assert "sessionId" in (await peer.call("session/new", early["session/new"]))["result"]
            await peer.close()
            nursery.cancel_scope.cancel()


async def test_a_prompt_reusing_the_id_of_one_in_flight_is_refused(tmp_path: Path) -> None:
    """Found by the fuzz: two prompts with one id, queued together, ran as one turn and got
    one answer between them."""
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        session = await b.peer.new_session()
        prompt = {"sessionId": session, "prompt": PROMPT}
        frame = {"jsonrpc": "2.0", "id": "twice", "method": "session/prompt", "params": prompt}
        await b.peer.send_raw((json.dumps(frame) + "\n").encode() * 2)
        refused = await b.peer.wait_for(lambda f: f.get("id") == "twice" and "error" in f)
        assert refused["error"] == {
            "code": -32600,
            "message": "request id 'twice' is already a prompt's in flight",
        }
        answered = await b.peer.wait_for(lambda f: f.get("id") == "twice" and "result" in f)
        assert answered["result"] == {"stopReason": "end_turn"}
        await trio.testing.wait_all_tasks_blocked()
        assert len([f for f in b.peer.frames if f.get("id") == "twice"]) == 2
        events = b.runtime.sessions.get(session).events  # type: ignore[union-attr]
        assert len([e for e in events if isinstance(e, UserMessage)]) == 1
