"""SIGKILL at random moments: every reload succeeds, loses at most the unflushed tail.

Real processes on the real clock: each kill is bounded by ``trio.fail_after``.
Each round starts a child that resumes the session (so repair and resume are
exercised again and again), lets it write for a random while, kills it with
SIGKILL, then reloads the session in this process and checks it.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from greenroom.session.persistence import JsonlPersistence, Persistence, SqlitePersistence
from tests.agents_helpers import assert_enclosed

CHILD = Path(__file__).with_name("kill9_child.py")
KILLS = 25  # per backend: 50 across the suite


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
async def test_sigkill_at_random_points_never_loses_a_flushed_turn(
    backend: str, tmp_path: Path
) -> None:
    path = tmp_path / ("sessions" if backend == "jsonl" else "sessions.sqlite")
    rng = random.Random(f"kill9-{backend}")
    stored_before = 0
    with trio.fail_after(120):
        for _ in range(KILLS):
            process = await trio.lowlevel.open_process(
                [sys.executable, str(CHILD), backend, str(path)],
                stdout=subprocess.PIPE,
            )
            assert process.stdout is not None
            lines = Lines(process.stdout)
            flushed = stored_before
            try:
                assert await lines.next() == "ready"
                with trio.move_on_after(rng.uniform(0.0, 0.15)):
                    while True:
                        flushed = int((await lines.next()).split()[1])
            finally:
                process.send_signal(signal.SIGKILL)
                await process.wait()
                await process.stdout.aclose()
            assert process.returncode == -signal.SIGKILL
            _, events = await _store(backend, path).load("s")
            # Whole events only, seqs contiguous, every turn closed (repair closes a cut one).
            assert_enclosed(events)
            # At most the unflushed tail is lost: everything reported flushed is there.
            assert len(events) >= flushed
            stored_before = len(events)
    assert stored_before > 0
