"""Every bench scenario runs, at its quick size with one repeat: a scenario that raises fails
the suite, so `make bench` cannot break unseen. Nothing here judges a figure.

A scenario whose peers are not installed (the bench extra: pydantic-ai, the OpenAI Agents
SDK, matplotlib) reports rows that say so; that is a pass, the rows' reasons are checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import SCENARIOS
from tests import ROOT

#: Real seconds one scenario's smoke run may take on a loaded 2-core machine.
LIMIT = 300


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_scenario_runs_at_a_smoke_size(scenario: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench", scenario, "--quick", "--repeats", "1"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
    said = f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, said
    document = json.loads((tmp_path / "latest.json").read_text())
    assert document["run"]["failed"] == [], said
    rows = [row for row in document["rows"] if row["scenario"] == scenario]
    assert rows, f"{scenario} reported no rows"
    for row in rows:
        if row.get("median") is None:  # a row that could not be measured says why
            assert row.get("note"), f"{scenario}: row {row['metric']!r} has no figure and no reason"
