"""The persistence writer: which jobs count as a run's until they are settled.

The test clock holds still while `writers_busy` says a writer holds a job of
the run; a job that stopped counting before it was settled on the run's own
thread let the clock hold forever (the suite hung in CI).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import trio

from greenroom.session.persistence.writer import Job, Writer, writers_busy


async def test_a_job_counts_as_its_runs_until_it_is_settled_on_the_runs_thread() -> None:
    worked = threading.Event()

    def work(batch: Sequence[Job]) -> None:
        worked.set()

    writer: Writer[Job] = Writer(work)
    token = trio.lowlevel.current_trio_token()
    job = Job()
    seen_at_settle: list[bool] = []
    job.on_settled = lambda _: seen_at_settle.append(writer.serves(token))
    writer.submit(job)
    assert writer.serves(token)
    assert writers_busy(token)
    # Blocking on purpose, no checkpoint: the worker finishes the batch (and, given the
    # moment, its loop), but the settle waits for this thread.
    assert worked.wait(timeout=5)
    time.sleep(0.1)  # noqa: ASYNC251
    assert not job.settled
    assert writer.serves(token)
    assert writers_busy(token)
    await job.wait()
    assert seen_at_settle == [False]
    assert not writers_busy(token)


async def test_a_failing_batch_settles_every_job_with_the_error() -> None:
    def work(batch: Sequence[Job]) -> None:
        batch[0].error = OSError("first")
        raise RuntimeError("backend bug")

    writer: Writer[Job] = Writer(work)
    jobs = [Job(), Job()]
    for job in jobs:
        writer.submit(job)
    for job in jobs:
        await job.wait()
    assert [repr(job.error) for job in jobs] in (
        [repr(OSError("first")), repr(RuntimeError("backend bug"))],
        # the second job may have waited for a batch of its own
        [repr(OSError("first")), repr(OSError("first"))],
    )
    assert not writers_busy(trio.lowlevel.current_trio_token())
