"""The README's embedding example runs as written (its model swapped for the scripted one), and
runs again: a second run takes its stored sessions on where they stopped."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import trio

from greenroom.protocol.events import TurnEnd
from greenroom.session.persistence import JsonlPersistence

ROOT = Path(__file__).resolve().parent.parent
MODEL_LINE = (
    'model = AnthropicModel("https://api.anthropic.com", "sk-ant-...", "claude-sonnet-4-5")'
)


def example() -> str:
    """The README's first Python block, answering with the scripted echo model."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(.*?)```", readme, re.S)
    assert found is not None, "the README has no Python example"
    code = found.group(1)
    assert MODEL_LINE in code, "the example's model line changed: update this test"
    scripted = "from greenroom.models import ScriptedModel\n    model = ScriptedModel(delay=0)"
    return code.replace(MODEL_LINE, scripted)


@pytest.mark.real_clock  # a real interpreter and a real MCP server
async def test_the_embedding_example_runs_and_runs_again(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example())
    with trio.fail_after(60):
        for _ in range(2):
            done = await trio.run_process(
                [sys.executable, str(script)],
                cwd=tmp_path,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert done.returncode == 0, done.stderr.decode()
            assert b"failed" not in done.stderr, done.stderr.decode()
    store = JsonlPersistence(tmp_path / "state" / "sessions")
    for session, turns in (("coder", 2), ("critic", 2)):
        _, events = await store.load(session)
        assert len([e for e in events if isinstance(e, TurnEnd)]) == turns
