"""SIGKILL at random moments: every reload is whole, and nothing that acted is lost.

Real processes on the real clock: each kill is bounded by ``trio.fail_after``.
Each round starts a child that resumes the session (so repair and resume are
exercised again and again), lets it run turns for a random while (tool calls
that write marker files, streamed replies, steering), kills it with SIGKILL,
then reloads the session in this process and checks that:

* the log is whole: seqs contiguous, every turn closed (repair closes a cut one);
* every marker file has its tool call in the log (a call is logged before it runs);
* every prompt and steer the model was shown is in the log (logged before the call).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from greenroom.protocol.events import SteeringMessage, ToolCall, UserMessage
from greenroom.session.persistence import JsonlPersistence, Persistence, SqlitePersistence
from tests import TESTS
from tests.agents_helpers import assert_enclosed

CHILD = TESTS / "kill9_child.py"
KILLS = 15  # per backend: 30 across the suite


class Lines:
    """Lines from a child's stdout."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise EOFError("the child closed its stdout")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


def _store(backend: str, path: Path) -> Persistence:
    return JsonlPersistence(path) if backend == "jsonl" else SqlitePersistence(path)


@pytest.mark.real_clock
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
async def test_sigkill_at_random_points_loses_nothing_that_acted(
    backend: str, tmp_path: Path
) -> None:
    path = tmp_path / ("sessions" if backend == "jsonl" else "sessions.sqlite")
    markers = tmp_path / "markers"
    markers.mkdir()
    rng = random.Random(f"kill9-{backend}")
    shown: set[str] = set()
    with trio.fail_after(150):
        for _ in range(KILLS):
            process = await trio.lowlevel.open_process(
                [sys.executable, str(CHILD), backend, str(path), str(markers)],
                stdout=subprocess.PIPE,
            )
            assert process.stdout is not None
            lines = Lines(process.stdout)
            try:
                assert await lines.next() == "ready"
                with trio.move_on_after(rng.uniform(0.0, 0.2)):
                    while True:
                        line = await lines.next()
                        if line.startswith("saw "):
                            shown.update(t for t in line[4:].split("|") if t)
            finally:
                process.send_signal(signal.SIGKILL)
                await process.wait()
                await process.stdout.aclose()
            assert process.returncode == -signal.SIGKILL
            _, events = await _store(backend, path).load("s")
            assert_enclosed(events)
            calls = {e.call_id for e in events if isinstance(e, ToolCall)}
            assert {m.name for m in markers.iterdir()} <= calls
            texts = {e.content for e in events if isinstance(e, UserMessage | SteeringMessage)}
            assert shown <= texts
    assert len(list(markers.iterdir())) > 0
    assert any(text.startswith("steer ") for text in shown)
