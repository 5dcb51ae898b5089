"""Installable from the ACP registry: the terminal login, ``authenticate``, ``logout``, and one
key order (``api_key=`` > the environment > the stored file) for code and the command.

The editor is the official ACP Python SDK's client (its schema models parse every answer)
against a real ``greenroom acp`` process; ``greenroom acp --login`` runs on a pseudo-terminal.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from greenroom.keys import KeyFileError, api_key, forget_keys, store_key, stored_key
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.http import endpoint
from greenroom.models.named import MissingKey, model_named

LIMIT = 30.0  # seconds
GREENROOM = (sys.executable, "-m", "greenroom")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """greenroom's home for this test, and no provider key in the environment."""
    place = tmp_path / "home"
    monkeypatch.setenv("GREENROOM_HOME", str(place))
    for name in list(os.environ):
        if name.endswith("_API_KEY"):
            monkeypatch.delenv(name)
    return place


def _keys_file(home: Path) -> Path:
    return home / "keys.json"


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


# -- the order, and the file ---------------------------------------------------------------


def test_given_beats_environment_beats_stored(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def key(given: str | None = None) -> str:
        return endpoint(None, given, "anthropic", "https://example.invalid")[1]

    store_key("ANTHROPIC_API_KEY", "from-file")
    # Code: the adapters' own rule (`endpoint`), and the command's (`model_named`).
    assert key() == "from-file"
    assert isinstance(model_named("anthropic:m", {}), AnthropicModel)
    assert api_key("ANTHROPIC_API_KEY", None, {}) == "from-file"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    assert key() == "from-env"
    assert key("given") == "given"
    assert api_key("ANTHROPIC_API_KEY", None, {"ANTHROPIC_API_KEY": "env"}) == "env"
    assert api_key("ANTHROPIC_API_KEY", "given", {"ANTHROPIC_API_KEY": "env"}) == "given"
    forget_keys()
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(MissingKey):
        model_named("anthropic:m", {})


def test_no_key_anywhere_names_the_variable_and_the_login(home: Path) -> None:
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY or run `greenroom acp --login`"):
        AnthropicModel(None, None, "m")
    with pytest.raises(MissingKey, match="ANTHROPIC_API_KEY in the environment or a key stored"):
        model_named("anthropic:m", {})


def test_the_stored_file_is_private_from_its_creation(home: Path) -> None:
    old = os.umask(0)  # a umask that would let every bit through
    try:
        path = store_key("OPENAI_API_KEY", "  sk-1  ")
        store_key("ANTHROPIC_API_KEY", "sk-2")
    finally:
        os.umask(old)
    assert path == _keys_file(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"OPENAI_API_KEY": "sk-1", "ANTHROPIC_API_KEY": "sk-2"}
    assert [p.name for p in home.iterdir()] == ["keys.json"]  # no write left behind
    assert forget_keys() is True
    assert not path.exists()
    assert forget_keys() is False


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_file_others_may_read_is_refused_and_left_as_it_is(home: Path, mode: int) -> None:
    path = _keys_file(home)
    _write(path, '{"ANTHROPIC_API_KEY": "leaked"}', mode)
    with pytest.raises(KeyFileError, match=f"mode {mode:04o}.*chmod 600"):
        stored_key("ANTHROPIC_API_KEY")
    with pytest.raises(KeyFileError):
        store_key("ANTHROPIC_API_KEY", "new")
    with pytest.raises(KeyFileError):
        forget_keys()
    with pytest.raises(KeyFileError, match=str(path)):
        AnthropicModel(None, None, "m")
    assert path.read_text() == '{"ANTHROPIC_API_KEY": "leaked"}'
    assert stat.S_IMODE(path.stat().st_mode) == mode


@pytest.mark.parametrize(
    "text", ["", "not json", '["a list"]', '{"ANTHROPIC_API_KEY": 7}', "{" * 5000]
)
def test_a_garbage_file_is_refused_and_kept(home: Path, text: str) -> None:
    path = _keys_file(home)
    _write(path, text, 0o600)
    with pytest.raises(KeyFileError, match="not a JSON object of keys"):
        stored_key("ANTHROPIC_API_KEY")
    with pytest.raises(KeyFileError):
        store_key("ANTHROPIC_API_KEY", "new")
    assert path.read_text() == text


def test_a_symbolic_link_is_refused(home: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    _write(target, '{"ANTHROPIC_API_KEY": "k"}', 0o600)
    home.mkdir()
    _keys_file(home).symlink_to(target)
    with pytest.raises(KeyFileError, match="symbolic link"):
        stored_key("ANTHROPIC_API_KEY")
    with pytest.raises(KeyFileError):
        forget_keys()
    assert target.exists()


def test_an_empty_or_broken_key_is_not_stored(home: Path) -> None:
    for bad, why in (("", "empty"), ("   ", "empty"), ("a\nb", "one line")):
        with pytest.raises(ValueError, match=why):
            store_key("ANTHROPIC_API_KEY", bad)
    assert not _keys_file(home).exists()


# -- greenroom acp --login, in a terminal ------------------------------------------------------


def _login(home: Path, *args: str, typed: list[bytes]) -> tuple[int, str]:
    """Run ``greenroom acp --login ARGS`` on a pseudo-terminal, typing each line of `typed`
    once it asks (a line typed before would be flushed as the echo is turned off)."""
    controller, terminal = os.openpty()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["GREENROOM_HOME"] = str(home)
    shown = b""
    with subprocess.Popen(
        [*GREENROOM, "acp", "--login", *args],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
    ) as process:
        os.close(terminal)
        lines = list(typed)
        asked = 0
        while True:
            ready, _, _ = select.select([controller], [], [], LIMIT)
            assert ready, f"greenroom acp --login went quiet: {shown!r}"
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal's last holder is gone
                break
            if not chunk:
                break
            shown += chunk
            if lines and shown.count(b": ") > asked:
                asked += 1
                os.write(controller, lines.pop(0))
        code = process.wait(timeout=LIMIT)
    os.close(controller)
    return code, shown.decode(errors="replace")


def test_login_asks_in_a_terminal_and_keeps_the_key_private(home: Path) -> None:
    code, shown = _login(home, "--model", "anthropic:m", typed=[b"sk-secret\n"])
    assert code == 0, shown
    assert "ANTHROPIC_API_KEY" in shown
    assert "sk-secret" not in shown  # not echoed
    path = _keys_file(home)
    assert json.loads(path.read_text()) == {"ANTHROPIC_API_KEY": "sk-secret"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_login_without_a_model_asks_the_provider(home: Path) -> None:
    code, shown = _login(home, typed=[b"gemini\n", b"k-g\n"])
    assert code == 0, shown
    assert json.loads(_keys_file(home).read_text()) == {"GEMINI_API_KEY": "k-g"}
    code, shown = _login(home, typed=[b"nobody\n"])
    assert code == 1
    assert "no provider 'nobody'" in shown


def test_login_refuses_a_file_others_may_read(home: Path) -> None:
    path = _keys_file(home)
    _write(path, "{}", 0o644)
    code, shown = _login(home, "--model", "openai:m", typed=[b"sk\n"])
    assert code == 1
    assert "mode 0644" in shown
    assert path.read_text() == "{}"


def test_login_needs_a_terminal(home: Path) -> None:
    env = {**os.environ, "GREENROOM_HOME": str(home)}
    done = subprocess.run(
        [*GREENROOM, "acp", "--login"], input=b"k\n", capture_output=True, env=env, timeout=LIMIT
    )
    assert done.returncode == 2
    assert b"stdin is not one" in done.stderr
    assert not _keys_file(home).exists()


# -- over ACP: the SDK's client ---------------------------------------------------------------


class Quiet:
    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(self, **kwargs: Any) -> Any:
        raise AssertionError("nothing should ask permission")

    def on_connect(self, conn: Any) -> None:
        pass


async def _logout(conn: Any) -> schema.LogoutResponse:
    # The SDK's client has no `logout` of its own: its connection sends it, its schema reads it.
    return schema.LogoutResponse.model_validate(await conn._conn.send_request("logout", {}))


async def _acp(home: Path, work: Path) -> None:
    env = {"GREENROOM_HOME": str(home)}
    command = (*GREENROOM, "acp", "--model", "anthropic:m", "--model", "scripted")
    async with acp.spawn_agent_process(Quiet(), *command, env=env, cwd=work) as (conn, process):
        init = await conn.initialize(protocol_version=1)
        [method] = init.auth_methods
        assert isinstance(method, schema.TerminalAuthMethod)
        assert method.id == "login"
        assert method.args == [*("acp", "--login", "--model", "anthropic:m", "--model", "scripted")]
        assert init.agent_capabilities.auth.logout is not None
        # Without a key: the new session is refused, asking for the login.
        with pytest.raises(acp.RequestError) as refused:
            await conn.new_session(cwd=str(work), mcp_servers=[])
        assert refused.value.code == -32000
        assert "ANTHROPIC_API_KEY" in str(refused.value)
        assert "'login'" in str(refused.value)
        with pytest.raises(acp.RequestError) as unknown:
            await conn.authenticate(method_id="oauth")
        assert unknown.value.code == -32602
        assert "'oauth'" in str(unknown.value)
        with pytest.raises(acp.RequestError) as still:
            await conn.authenticate(method_id="login")
        assert still.value.code == -32000
        assert process.returncode is None
    # Logged in (as the terminal would): the next start has the key.
    store_key("ANTHROPIC_API_KEY", "sk-stored")
    async with acp.spawn_agent_process(Quiet(), *command, env=env, cwd=work) as (conn, process):
        await conn.initialize(protocol_version=1)
        assert isinstance(await conn.authenticate(method_id="login"), schema.AuthenticateResponse)
        before = await conn.new_session(cwd=str(work), mcp_servers=[])
        await _logout(conn)
        assert not _keys_file(home).exists()
        with pytest.raises(acp.RequestError) as refused:
            await conn.new_session(cwd=str(work), mcp_servers=[])
        assert refused.value.code == -32000
        assert "logged out" in str(refused.value)
        # The session opened before keeps its model; a setting to the scripted one answers.
        answer = await conn.set_config_option(
            session_id=before.session_id, config_id="model", value="scripted"
        )
        assert answer is not None
        reply = await conn.prompt(session_id=before.session_id, prompt=[acp.text_block("hi")])
        assert reply.stop_reason == "end_turn"


def test_the_editor_logs_in_and_out(home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    asyncio.run(asyncio.wait_for(_acp(home, work), LIMIT))


async def _logout_of_a_bad_file(home: Path, work: Path) -> None:
    _write(_keys_file(home), "garbage", 0o600)
    env = {"GREENROOM_HOME": str(home), "OPENAI_API_KEY": "sk-env"}
    command = (*GREENROOM, "acp", "--model", "openai:m")
    async with acp.spawn_agent_process(Quiet(), *command, env=env, cwd=work) as (conn, _):
        await conn.initialize(protocol_version=1)
        await conn.new_session(cwd=str(work), mcp_servers=[])  # the environment's key
        with pytest.raises(acp.RequestError) as failed:
            await _logout(conn)
        assert failed.value.code == -32603
        assert "not a JSON object of keys" in str(failed.value)
    assert _keys_file(home).read_text() == "garbage"


def test_logout_leaves_a_file_that_is_not_its_own(home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    asyncio.run(asyncio.wait_for(_logout_of_a_bad_file(home, work), LIMIT))


# -- the stored file, fuzzed -------------------------------------------------------------------


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=st.binary(max_size=2000) | st.text(max_size=500).map(str.encode))
def test_any_stored_content_is_keys_or_a_clear_error(home: Path, content: bytes) -> None:
    path = _keys_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(0o600)
    found: str | KeyFileError | None
    try:
        found = stored_key("ANTHROPIC_API_KEY")
    except KeyFileError as exc:
        found = exc
    if isinstance(found, KeyFileError):
        assert str(path) in str(found)
    else:
        assert found is None or isinstance(found, str)
    assert path.read_bytes() == content  # never rewritten by a read
