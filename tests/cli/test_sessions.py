"""``greenroom sessions list|show`` reads what a runtime stored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import psycopg
import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.cli import main, sessions_root
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.session.persistence import JsonlPersistence, Persistence, SqlitePersistence
from greenroom.tools import Tool


class Args(msgspec.Struct):
    path: str


async def _read(args: Args, call: object) -> str:
    return f"contents of {args.path}"


async def _record_a_session(state: Path) -> None:
    model = ScriptedModel(
        [[Say("Let me look."), CallTool("read", {"path": "a.txt"})], [Say("Done.")]]
    )
    store = JsonlPersistence(sessions_root(state))
    async with open_runtime(
        model=model, persistence=store, tools=[Tool("read", "r", Args, _read)]
    ) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="demo-1", cwd="/work")
        handle.agent.send("what is in a.txt?")
        await handle.agent.when_idle()
        handle.agent.inject("the file changed")
        await handle.dispose()


def test_sessions_list_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trio.run(_record_a_session, tmp_path)  # real clock: a virtual one outruns fsyncs
    assert main(["sessions", "--state-dir", str(tmp_path), "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 1
    assert listed[0].startswith("demo-1  created ")
    assert listed[0].endswith("cwd /work  'what is in a.txt?'")  # titled by its first prompt
    assert main(["sessions", "--state-dir", str(tmp_path), "show", "demo-1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "turn 1 (message from user)",
        "  user: what is in a.txt?",
        "  assistant: Let me look.",
        '  tool call read {"path": "a.txt"}  [call-1]',
        "  tool result [call-1]: contents of a.txt",
        "  assistant: Done.",
        "  end: completed",
        "turn 2 (injected by user)",
        "  context from user: the file changed",
        "  end: completed",
    ]


def test_showing_a_missing_session_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sessions", "--state-dir", str(tmp_path), "show", "nope"]) == 1
    assert "greenroom sessions: no stored session 'nope'" in capsys.readouterr().err


async def _record_a_family(state: Path) -> None:
    store = JsonlPersistence(sessions_root(state))
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        parent = await rt.agents.create(agent_id="p", session_id="parent", cwd="/work")
        child = await parent.spawn(agent_id="c", session_id="child")
        await child.spawn(agent_id="g", session_id="grandchild")
        await rt.agents.create(agent_id="o", session_id="other", cwd="/work")
        await parent.dispose()
    async with open_runtime(persistence=store) as rt:
        await rt.agents.fork("parent", "fork")


def test_sessions_list_shows_children_under_their_parent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(_record_a_family, tmp_path)  # real clock: a virtual one outruns fsyncs
    assert main(["sessions", "--state-dir", str(tmp_path), "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    ids = [line.split("  created")[0] for line in listed]
    at = ids.index("parent")
    assert ids[at + 1 : at + 3] == ["  └ child", "    └ grandchild"]
    assert sorted(ids) == sorted(["parent", "  └ child", "    └ grandchild", "other", "fork"])
    assert "parent parent" in listed[at + 1]
    assert any(line.startswith("fork ") and "forked from parent" in line for line in listed)


@pytest.mark.real_clock  # a real subprocess
async def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="long")
        for n in range(300):  # a transcript far past a pipe's buffer
            handle.agent.send(f"prompt number {n} with a few more words to echo back")
            await handle.agent.when_idle()
        await handle.dispose()
    command = [sys.executable, "-m", "greenroom", "sessions", "--store", f"jsonl:{tmp_path}"]
    with trio.fail_after(30):
        for verb in (["show", "long"], ["list"]):
            # `| head -1`: read one line, then close the pipe.
            process = await trio.lowlevel.open_process(
                [*command, *verb], stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            assert process.stdout is not None
            assert process.stderr is not None
            first = await process.stdout.receive_some(100)
            await process.stdout.aclose()
            errors = b""
            while chunk := await process.stderr.receive_some():
                errors += chunk
            await process.wait()
            assert first
            assert b"Traceback" not in errors, errors.decode()


# -- reading never creates or changes a store -----------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root`, with its bytes (directories named with an empty value)."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b""
        for p in sorted(root.rglob("*"))
    }


READERS = [["list"], ["show", "s1"]]


@pytest.mark.parametrize("verb", READERS)
@pytest.mark.parametrize("store", ["sqlite:typo.db", "sqlite:nodir/typo.db", "jsonl:typo"])
def test_a_missing_store_is_an_error_naming_it_and_is_not_made(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    store: str,
    verb: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["sessions", *verb, "--store", store]) == 2
    error = capsys.readouterr().err
    assert store.partition(":")[2].split("/")[0] in error
    assert "no such" in error
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("verb", READERS)
@pytest.mark.parametrize(
    ("content", "why"),
    [(b"", "an empty database"), (b"hello, not a database\n" * 50, "file is not a database")],
)
def test_a_file_that_is_not_a_store_is_an_error_and_stays_as_it_was(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    why: str,
    verb: list[str],
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    assert main(["sessions", *verb, "--store", f"sqlite:{path}"]) == 2
    error = capsys.readouterr().err
    assert f"{path}: not a greenroom store" in error
    assert why in error
    assert snapshot(tmp_path) == {"notes.db": content}


async def _record_in(store: Persistence) -> None:
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s1")
        handle.agent.send("hello there")
        await handle.agent.when_idle()
        await handle.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_reading_a_store_leaves_it_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    where = tmp_path / "store"
    if kind == "sqlite":
        where.mkdir()
        sqlite = SqlitePersistence(where / "s.db")
        trio.run(_record_in, sqlite)  # the real clock: a writer thread's waits are real
        sqlite.close()
    else:
        trio.run(_record_in, JsonlPersistence(where))
    url = f"{kind}:{where / 's.db' if kind == 'sqlite' else where}"
    before = snapshot(where)
    assert main(["sessions", "list", "--store", url]) == 0
    assert capsys.readouterr().out.startswith("s1  created ")
    assert main(["sessions", "show", "s1", "--store", url]) == 0
    assert "  user: hello there" in capsys.readouterr().out.splitlines()
    assert snapshot(where) == before


@pytest.mark.postgres
@pytest.mark.parametrize("verb", READERS)
def test_an_empty_postgres_schema_is_an_error_and_gets_no_tables(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    assert main(["sessions", *verb, "--store", postgres_dsn]) == 2
    assert "no greenroom store there" in capsys.readouterr().err
    with psycopg.connect(postgres_dsn) as db:
        tables = db.execute("SELECT to_regclass('greenroom_schema')").fetchone()
    assert tables == (None,)


async def _record_settings(state: Path) -> None:
    store = JsonlPersistence(sessions_root(state))
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="settings")
        handle.agent.configure("mode", "read-only")
        await handle.agent.when_idle()
        handle.agent.configure("model", "default")
        await handle.agent.when_idle()
        await handle.dispose()


def test_show_labels_setting_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trio.run(_record_settings, tmp_path)
    assert main(["sessions", "--state-dir", str(tmp_path), "show", "settings"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "turn 1 (settings changed by user)",
        "  mode set to read-only",
        "  end: completed",
        "turn 2 (settings changed by user)",
        "  model set to default",
        "  end: completed",
    ]


@pytest.mark.real_clock  # a real reader process beside a live writer
async def test_a_live_sqlite_store_is_read_as_it_stands(tmp_path: Path) -> None:
    store = SqlitePersistence(tmp_path / "live.db")
    command = [sys.executable, "-m", "greenroom", "sessions", "show", "s1"]
    try:
        async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s1")
            await handle.agent.run("first words")
            assert (tmp_path / "live.db-wal").exists()  # a live writer: read mode=ro, not immutable
            with trio.fail_after(30):
                shown = await trio.run_process(
                    [*command, "--store", f"sqlite:{tmp_path / 'live.db'}"], capture_stdout=True
                )
            assert "  user: first words" in shown.stdout.decode().splitlines()
            await handle.dispose()
    finally:
        store.close()


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


@pytest.mark.parametrize("via", ["GREENROOM_HOME", "HOME"])
def test_no_state_directory_yet_is_no_sessions_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """A first `greenroom sessions list` failed with "--state-dir ...: no such directory",
    exit 2, naming a flag the user never gave."""
    monkeypatch.delenv("GREENROOM_STORE", raising=False)
    if via == "HOME":
        monkeypatch.delenv("GREENROOM_HOME", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))
        state = tmp_path / ".local" / "state" / "greenroom"
    else:
        state = tmp_path / "never-made"
        monkeypatch.setenv("GREENROOM_HOME", str(state))
    assert main(["sessions", "list"]) == 0
    err = capsys.readouterr().err
    assert err == f"no sessions yet ({state} does not exist)\n"
    assert main(["sessions", "show", "s1"]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == f"greenroom sessions: no stored session 's1': no sessions yet ({state} does not exist)\n"
    )
    assert main(["sessions", "decisions"]) == 0
    assert capsys.readouterr().err == f"no sessions yet ({state} does not exist)\n"
    assert main(["sessions", "decide", "s1", "dec-1", "allow_once"]) == 1
    assert "no stored session 's1'" in capsys.readouterr().err
    assert not state.exists()  # reading made nothing, nor did a decide of nothing
    # Given, a directory that does not exist is still the user's mistake.
    assert main(["sessions", "list", "--state-dir", str(state)]) == 2
    assert f"--state-dir {state}: no such directory" in capsys.readouterr().err
    # The default is not a flag: a file there is named as the state directory.
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("")
    assert main(["sessions", "list"]) == 2
    assert capsys.readouterr().err == (
        f"greenroom sessions: the state directory {state}: not a directory\n"
    )
