"""What each sync policy promises, observed through the fsyncs themselves.

``os.fsync`` and ``os.fdatasync`` are wrapped to note, for each call, which
file they synced and how long the file was then; a turn's end is "covered" once an fsync of the log
saw the file at least as long as it was when the end was reported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from greenroom import open_runtime
from greenroom.actors.events import AGENT_TURN_END
from greenroom.actors.types import Agent
from greenroom.models import ScriptedModel
from greenroom.protocol.events import TurnEndReason
from greenroom.session.persistence import JsonlPersistence, SyncPolicy
from tests.persistence_helpers import Fsyncs


async def _turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: SyncPolicy
) -> tuple[Fsyncs, list[tuple[int, int]], int]:
    """Three turns and a dispose: the fsyncs, (file size, covered) at each report, and what
    the dispose left covered."""
    store = JsonlPersistence(tmp_path, sync=sync)
    path = store.path("s")
    fsyncs = Fsyncs(monkeypatch, path)
    reports: list[tuple[int, int]] = []

    def reported(agent: Agent, turn: int, reason: TurnEndReason) -> None:
        reports.append((os.path.getsize(path), fsyncs.covered()))

    async with open_runtime(model=ScriptedModel(delay=0.01), persistence=store) as rt:
        rt.hooks.on(AGENT_TURN_END, reported)
        handle = await rt.agents.create(agent_id="a", session_id="s")
        for text in ("one two", "three four", "five six"):
            handle.agent.send(text)
            await handle.agent.when_idle()
        await handle.dispose()
        covered_at_dispose = fsyncs.covered()
    assert os.path.getsize(path) > 0
    return fsyncs, reports, covered_at_dispose - os.path.getsize(path)


async def test_always_reports_a_turns_end_only_after_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, reports, uncovered = await _turns(tmp_path, monkeypatch, "always")
    assert uncovered == 0
    assert len(reports) == 3
    for size, covered in reports:
        assert covered >= size


async def test_turn_syncs_each_turn_off_the_agents_path_and_dispose_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs, reports, uncovered = await _turns(tmp_path, monkeypatch, "turn")
    assert uncovered == 0  # dispose returned only after the last fsync
    assert len(reports) == 3
    assert any(covered < size for size, covered in reports)  # reported before its fsync
    assert 3 <= len(fsyncs.sizes) <= 4  # one per turn (and the dispose's), never per event


async def test_os_never_fsyncs_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs, reports, _ = await _turns(tmp_path, monkeypatch, "os")
    assert len(reports) == 3
    assert fsyncs.sizes == []
