"""Decisions that outlive their process: parked, killed, answered from another process or
node, resumed. Each life is a real child process (`tests/decisions_child.py`)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from greenroom.protocol.events import DecisionMade, DecisionRequested, SessionEvent, TurnEnd
from tests import ROOT, TESTS
from tests.durable_child import store_of
from tests.session.test_kill9 import Lines

CHILD = TESTS / "decisions_child.py"


def _target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        return dsn
    return str(tmp_path / ("sessions" if backend == "jsonl" else "sessions.sqlite"))


class Child:
    """One life of the child: its lines as they come."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdout is not None
        self.process = process
        self.lines = Lines(process.stdout)
        self.seen: list[str] = []

    async def until(self, prefix: str) -> str:
        while True:
            line = await self.lines.next()
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    async def rest(self) -> list[str]:
        """Its lines to its end; it must exit 0."""
        while True:
            try:
                self.seen.append(await self.lines.next())
            except EOFError:
                break
        await self.process.wait()
        assert self.process.returncode == 0, self.seen
        return self.seen

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()


async def _child(*args: str) -> Child:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, cwd=ROOT
    )
    return Child(process)


async def _stored(backend: str, target: str) -> list[SessionEvent]:
    store = store_of(backend, target)
    try:
        _, events = await store.load("s")
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return list(events)


@pytest.mark.real_clock
@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
async def test_killed_while_parked_then_resumed_in_a_new_process_and_answered(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target, runs = _target(backend, tmp_path, request), tmp_path / "runs"
    with trio.fail_after(90):
        parked = await _child("park", backend, target, str(runs))
        decision = (await parked.until("parked ")).split()[1]
        await parked.kill()
        events = await _stored(backend, target)
        assert [e.decision_id for e in events if isinstance(e, DecisionRequested)] == [decision]
        assert not [e for e in events if isinstance(e, TurnEnd) and e.turn == events[-1].turn]
        resumed = await _child("resume", backend, target, str(runs), "allow_once")
        lines = await resumed.rest()
    assert f"asked {decision}" in lines  # the same decision, asked again
    assert "answer completed deployed" in lines
    assert "requests 1" in lines  # the parked step was not asked for again
    assert "made resumer" in lines
    assert runs.read_text() == "deploy\n"  # once


@pytest.mark.real_clock
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
async def test_an_answer_written_by_a_second_process_while_stored_is_taken_at_resume(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target, runs = _target(backend, tmp_path, request), tmp_path / "runs"
    with trio.fail_after(90):
        parked = await _child("park", backend, target, str(runs))
        decision = (await parked.until("parked ")).split()[1]
        await parked.kill()
        first = await (
            await _child("decide", backend, target, runs.name, decision, "allow_once", "ops")
        ).rest()
        second = await (
            await _child("decide", backend, target, runs.name, decision, "reject_once", "eve")
        ).rest()
        assert first == ["kept"]
        assert second == [f"refused decision {decision!r} was answered already, by ops"]
        assert not [e for e in await _stored(backend, target) if isinstance(e, DecisionMade)]
        lines = await (await _child("resume", backend, target, str(runs))).rest()
    assert "answer completed deployed" in lines
    assert "made ops" in lines
    assert runs.read_text() == "deploy\n"


@pytest.mark.real_clock
@pytest.mark.postgres
async def test_on_postgres_node_b_answers_a_turn_parked_live_on_node_a(
    postgres_dsn: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    with trio.fail_after(90):
        node_a = await _child("park", "postgres", postgres_dsn, str(runs))
        decision = (await node_a.until("parked ")).split()[1]
        node_b = await _child(
            "decide", "postgres", postgres_dsn, str(runs), decision, "allow_once", "node-b"
        )
        assert await node_b.rest() == ["kept"]
        lines = await node_a.rest()  # told through the store's notification: it goes on
    assert "answer completed deployed" in lines
    assert "requests 2" in lines
    assert runs.read_text() == "deploy\n"
    made = [e for e in await _stored("postgres", postgres_dsn) if isinstance(e, DecisionMade)]
    assert [(e.decision_id, e.by) for e in made] == [(decision, "node-b")]
