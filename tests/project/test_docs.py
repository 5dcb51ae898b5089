"""Every example of the docs runs as written: each Python block of docs/embedding.md in a
fresh interpreter, its provider's API served on loopback, what it prints compared with the
``text`` block after it when there is one; docs/testing.md's blocks as the test modules of a
user's suite, run by pytest with greenroom's plugin. (The README's:
tests/project/test_readme.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from greenroom.models.loopback import Seen, Served, serve
from tests import ROOT
from tests.wire import anthropic_text

HAIKU = "tasks wait in the nursery / a cancel scope shields / the turn ends cleanly"


#: A fenced block and, if one follows at once, the ``text`` block of what it prints.
BLOCK = re.compile(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", re.S)


def blocks(path: Path) -> list[str]:
    return [code for code, _ in BLOCK.findall(path.read_text())]


def printed(path: Path) -> list[str]:
    """What each block of `path` prints, as the docs say ("" where they do not)."""
    return [text for _, text in BLOCK.findall(path.read_text())]


def answer(seen: Seen) -> Served:
    """What the loopback Anthropic API says to any request: a haiku."""
    return Served(pieces=anthropic_text(HAIKU))


GUIDE = blocks(ROOT / "docs" / "embedding.md")
PRINTED = printed(ROOT / "docs" / "embedding.md")


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
    if PRINTED[index]:
        assert done.stdout.decode() == PRINTED[index]


def test_the_guide_has_its_examples() -> None:
    assert len(GUIDE) >= 7


def test_the_testing_guide_is_a_suite_that_passes(tmp_path: Path) -> None:
    guide = blocks(ROOT / "docs" / "testing.md")
    assert guide, "docs/testing.md has no Python example"
    for number, code in enumerate(guide):
        name = "conftest.py" if code.startswith("pytest_plugins") else f"test_guide_{number}.py"
        (tmp_path / name).write_text(code)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout


#: What the README and the guides may import from greenroom: its facade and the documented
#: subpackages (the hosts, the models, the test kit), never a floor beneath them.
FACADE = {"greenroom", "greenroom.aio", "greenroom.models", "greenroom.testing"}


def test_the_readme_and_the_guides_import_only_the_facade() -> None:
    found: set[str] = set()
    for path in (ROOT / "README.md", ROOT / "docs" / "embedding.md", ROOT / "docs" / "testing.md"):
        for code in blocks(path):
            found |= set(re.findall(r"^\s*from (greenroom[\w.]*) import", code, re.M))
            found |= set(re.findall(r"^\s*import (greenroom[\w.]*)", code, re.M))
    assert found, "no example imports greenroom"
    assert found <= FACADE, sorted(found - FACADE)
