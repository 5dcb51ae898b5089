"""The demo tells the whole story, in plain lines, and every beat checks out."""

from __future__ import annotations

import io
import os
import shlex
import sys
from pathlib import Path

import pytest
import trio

from greenroom.cli import main
from greenroom.demo import alternate_screen, run_story

pytestmark = pytest.mark.real_clock  # real bash processes


async def test_the_plain_demo_tells_every_beat_and_all_check_out(tmp_path: Path) -> None:
    out = io.StringIO()
    with trio.fail_after(60):
        summary = await run_story(tmp_path, out=out, live=False, pace=0.15)
    assert [what for what, _, _ in summary] == [
        "a burst is batched into one turn",
        "a steer joins the running turn",
        "a cancel drops a queued prompt",
        "another session is refused the task",
        "ownership survives the reload",
        "the completion notice reaches its owner",
        "a dispose writes the closing turn/end to disk",
        "a resume continues the turn numbering",
    ]
    assert all(ok for _, _, ok in summary), summary
    text = out.getvalue()
    assert "\x1b[" not in text  # plain: no terminal control
    assert "turn 1 took 3 prompts" in text
    assert "task bash-1 belongs to another session" in text
    assert "read back from disk: last event is turn/end disposed" in text
    assert text.rstrip().splitlines()[-1].startswith("a resume continues the turn numbering")


async def test_a_second_run_into_the_same_store_tells_it_again(tmp_path: Path) -> None:
    from greenroom.session.persistence import JsonlPersistence

    with trio.fail_after(60):
        first = await run_story(tmp_path, out=io.StringIO(), pace=0.15, tag="-one")
        second = await run_story(tmp_path, out=io.StringIO(), pace=0.15, tag="-two")
    assert all(ok for _, _, ok in first + second), (first, second)
    stored = {s.header.id for s in await JsonlPersistence(tmp_path / "sessions").list()}
    assert stored == {
        f"{name}-{run}" for name in ("planner", "builder", "reviewer") for run in ("one", "two")
    }


async def test_the_live_view_fits_80x24_on_the_alternate_screen_and_gives_it_back(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    with trio.fail_after(60):
        await run_story(tmp_path, out=out, live=True, pace=0.15)
    text = out.getvalue()
    assert text.startswith("\x1b[?1049h\x1b[?25l")
    drawn, _, after = text.partition("\x1b[?25h\x1b[?1049l")
    assert after  # the screen came back before the last frame and the summary
    frames = drawn.split("\x1b[H")[1:]
    assert len(frames) > 5
    for shown in frames:
        lines = shown.removesuffix("\x1b[J").split("\x1b[K\n")[:-1]
        assert len(lines) <= 23
        assert all(len(line) <= 80 for line in lines)
    assert "\x1b[2J" not in text  # redraws overwrite in place, nothing pushed to scrollback


def test_the_screen_comes_back_on_an_interrupt() -> None:
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), alternate_screen(out, True):
        raise KeyboardInterrupt
    assert out.getvalue() == "\x1b[?1049h\x1b[?25l\x1b[?25h\x1b[?1049l"


def test_sessions_list_says_where_the_demos_sessions_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GREENROOM_HOME", str(tmp_path))
    (tmp_path / "sessions").mkdir()
    (tmp_path / "demo" / "sessions").mkdir(parents=True)
    assert main(["sessions", "list"]) == 0
    err = capsys.readouterr().err
    assert f"greenroom demo keeps its sessions in {tmp_path / 'demo' / 'sessions'}" in err
    assert f"greenroom sessions list --state-dir {tmp_path / 'demo'}" in err


async def test_the_demo_ends_saying_it_ran_on_an_echo_and_how_to_read_its_sessions(
    tmp_path: Path,
) -> None:
    venv_bin = Path(sys.executable).parent
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != venv_bin
    )
    env = {**os.environ, "PATH": path, "GREENROOM_HOME": str(tmp_path / "home")}
    state = tmp_path / "state"
    with trio.fail_after(120):
        done = await trio.run_process(
            [str(venv_bin / "greenroom"), "demo", "--plain", "--state-dir", str(state)],
            env=env,
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
        )
        *_, echo, last = done.stdout.decode().rstrip().splitlines()
        assert "the demo's model is an echo" in echo
        assert "calls no model API" in echo
        assert last.startswith(f"the echo's sessions are in {state / 'sessions'}: ")
        told = shlex.split(last.partition(": ")[2])
        assert told == [str(venv_bin / "greenroom"), "sessions", "list", "--state-dir", str(state)]
        listed = await trio.run_process(told, env=env, cwd=tmp_path, capture_stdout=True)
    ids = sorted(line.split()[0].rpartition("-")[0] for line in listed.stdout.decode().splitlines())
    assert ids == ["builder", "planner", "reviewer"]  # each with this run's suffix
