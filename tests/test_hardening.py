"""Hostile clients and long-lived embedders: every repro of the hardening issue, pinned."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.cli import main
from greenroom.models import Hang, Say, ScriptedModel
from greenroom.session.persistence import JsonlPersistence, SqlitePersistence
from tests.acp_peer import bridge
from tests.acp_process import acp_process

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


async def test_a_session_id_the_backend_cannot_store_is_refused_before_anything_exists(
    tmp_path: Path,
) -> None:
    huge = "s" * 5000
    async with open_runtime(persistence=JsonlPersistence(tmp_path)) as rt:
        with pytest.raises(ValueError, match=r"session id is too long to store.*at most 200"):
            await rt.agents.create(agent_id="a", session_id=huge)
        with pytest.raises(ValueError, match=r"session id is too long to store.*at most 200"):
            await rt.agents.resume(agent_id="a", session_id=huge)
        assert rt.agents.list() == []
        assert rt.sessions.list() == []
    assert list(tmp_path.iterdir()) == []


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


def test_the_sqlite_backend_takes_long_ids(tmp_path: Path) -> None:
    SqlitePersistence(tmp_path / "db").check_session_id("s" * 5000)


# -- the state directory -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["sessions", "list", "--state-dir", "{missing}"], "no such directory"),
        (["sessions", "--state-dir", "{missing}", "list"], "no such directory"),
        (["sessions", "list", "--state-dir", "{file}"], "not a directory"),
        (["acp", "--state-dir", "{file}"], "not a directory"),
        (["acp", "--state-dir", "{file}/below"], "cannot create it"),
        (["demo", "--plain", "--state-dir", "{file}"], "not a directory"),
    ],
)
def test_an_unusable_state_dir_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], problem: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("not a directory")
    missing = tmp_path / "missing"
    argv = [a.format(file=file, missing=missing) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert problem in err
    assert str(argv[argv.index("--state-dir") + 1]) in err


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["sessions", "--store", "mysql://u:hunter2@h/db", "list"], "not a store URL"),
        (["sessions", "--store", "jsonl:", "list"], "not a store URL"),
        (["acp", "--store", "sqlite:{file}/below.db"], "its folder {file}: not a directory"),
        (["demo", "--plain", "--store", "jsonl:{file}"], "not a directory"),
        (
            ["sessions", "--store", "postgresql://u:hunter2@/db?host={missing}", "list"],
            "cannot reach PostgreSQL database 'db' at {missing}",
        ),
        (
            ["acp", "--store", "postgresql:///db?host={missing}&password=hunter2"],
            "cannot reach PostgreSQL",
        ),
    ],
)
def test_an_unusable_store_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], problem: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("not a directory")
    missing = tmp_path / "missing"
    argv = [a.format(file=file, missing=missing) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert problem.format(file=file, missing=missing) in err
    assert "--store" in err
    assert "hunter2" not in err


def test_sessions_list_takes_the_state_dir_after_the_verb(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sessions").mkdir()
    assert main(["sessions", "list", "--state-dir", str(tmp_path)]) == 0
    assert f"no sessions in {tmp_path / 'sessions'}" in capsys.readouterr().err


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
