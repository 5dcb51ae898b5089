"""The README's examples run as written: its first (one turn from synchronous code) against
the Anthropic API served on loopback; its embedding example with its model swapped for a
scripted one that plays the same conversation, run twice (the second run takes its stored
sessions on where they stopped), and exiting non-zero, saying why, when its turns fail."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import trio

from greenroom.models.loopback import Served, serve
from greenroom.protocol.events import TurnEnd
from greenroom.session.persistence import JsonlPersistence
from tests import ROOT
from tests.wire import anthropic_text

MODEL_LINE = 'MODEL = "anthropic:claude-sonnet-4-5"  # ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL'
HAIKU = "tasks wait in the nursery / a cancel scope shields / the turn ends cleanly"
#: The coder writes and counts (a tool call, then the answer); the critic answers a Review.
PLAYED = f"""from greenroom.models import CallTool, Say, ScriptedModel
MODEL = ScriptedModel(
    [
        [Say("Counting first. "), CallTool("word_count", {{"text": "{HAIKU}"}})],
        [Say("{HAIKU}")],
        [Say('{{"verdict": "approve", "reasons": ["it scans", "it is about Trio"]}}')],
    ],
    delay=0,
)"""
FAILING = """from greenroom.models import Fail, ScriptedModel
MODEL = ScriptedModel([[Fail("ConnectError: api.anthropic.com unreachable")]])"""


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def example(model: str) -> str:
    """The README's embedding example (its second Python block), its model line replaced
    by `model`."""
    code = blocks()[1]
    assert MODEL_LINE in code, "the example's model line changed: update this test"
    return code.replace(MODEL_LINE, model)


async def run_example(tmp_path: Path, model: str) -> trio.CompletedProcess[bytes]:
    script = tmp_path / "example.py"
    script.write_text(example(model))
    return await trio.run_process(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


@pytest.mark.real_clock  # a real interpreter and a real socket
async def test_the_first_example_prints_the_models_answer(tmp_path: Path) -> None:
    first = blocks()[0]
    assert len(first.strip().splitlines()) <= 8  # the first screen's promise
    script = tmp_path / "first.py"
    script.write_text(first)
    with trio.fail_after(60):
        async with serve(lambda seen: Served(pieces=anthropic_text(HAIKU))) as api:
            env = {**os.environ, "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test"}
            done = await trio.run_process(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == HAIKU + "\n"
    (request,) = api.requests
    assert request.body["system"][0]["text"] == "You write haiku about concurrency."


@pytest.mark.real_clock  # a real interpreter
async def test_the_embedding_example_runs_and_runs_again(tmp_path: Path) -> None:
    with trio.fail_after(60):
        for _ in range(2):
            done = await run_example(tmp_path, PLAYED)
            assert done.returncode == 0, done.stderr.decode()
            assert b"failed" not in done.stderr, done.stderr.decode()
            assert done.stdout.decode().splitlines() == [
                f"Counting first. {HAIKU}",
                "[word_count -> 15]",
                "critic: approve (it scans; it is about Trio)",
            ]
    store = JsonlPersistence(tmp_path / "state" / "sessions")
    for session in ("coder", "critic"):
        _, events = await store.load(session)
        ends = [e.reason for e in events if isinstance(e, TurnEnd)]
        assert [type(reason).__name__ for reason in ends] == ["Completed", "Completed"]


@pytest.mark.real_clock  # a real interpreter
async def test_the_embedding_example_says_so_when_its_turn_fails(tmp_path: Path) -> None:
    with trio.fail_after(60):
        done = await run_example(tmp_path, FAILING)
    errors = done.stderr.decode()
    assert done.returncode == 1, errors
    assert "coder: error: ConnectError: api.anthropic.com unreachable" in errors
    assert "agent 'coder:coder' (session 'coder'): turn 1 failed: ConnectError" in errors
