"""Every example of the docs runs as written: each Python block of docs/embedding.md (and the
README's first) in a fresh interpreter, its provider's API served on loopback."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import trio

from greenroom.models.loopback import Seen, Served, serve
from tests.wire import anthropic_text

ROOT = Path(__file__).resolve().parent.parent
HAIKU = "tasks wait in the nursery / a cancel scope shields / the turn ends cleanly"


def blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def answer(seen: Seen) -> Served:
    """What the loopback Anthropic API says to any request: a haiku."""
    return Served(pieces=anthropic_text(HAIKU))


GUIDE = blocks(ROOT / "docs" / "embedding.md")


@pytest.mark.real_clock  # real interpreters and a real socket
@pytest.mark.parametrize("index", range(len(GUIDE)))
async def test_each_example_of_the_guide_runs(tmp_path: Path, index: int) -> None:
    script = tmp_path / "example.py"
    script.write_text(GUIDE[index])
    with trio.fail_after(60):
        async with serve(answer) as api:
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
    assert done.stdout.strip(), "the example printed nothing"


def test_the_guide_has_its_examples() -> None:
    assert len(GUIDE) >= 7
