"""The demo tells the supervision story in order."""

from __future__ import annotations

import pytest

from greenroom.demo import supervision_story


async def test_demo_story_restarts_then_shuts_down_in_reverse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    await supervision_story()
    lines = capsys.readouterr().out.splitlines()
    events = [line.split("] ", 1)[1] for line in lines if line.startswith("[t=")]
    assert events.index("start flaky") < events.index(
        "exit  root/flaky: error, restarts=0 (RuntimeError: flaky lost its connection)"
    )
    shutdown = events[
        events.index("shutting down: reverse start order, each child within its grace") :
    ]
    stops = [e.split(":")[0] for e in shutdown if e.startswith("stop")]
    assert stops == ["stop  pool-2", "stop  pool-1", "stop  flaky", "stop  steady"]
    assert "exit  pool/pool-2: killed, restarts=0" in shutdown
    assert shutdown[-1] == "root closed; every child stopped"
    assert "├── flaky  running  permanent  restarts=2" in lines
