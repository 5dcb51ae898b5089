"""The demo tells the whole story, in plain lines, and every beat checks out."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio

from greenroom.demo import run_story

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
