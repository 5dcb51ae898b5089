"""What a disposed session leaves behind: nothing that grows with the sessions a process has had.

A session's life here is what `bench scale` measures: created, prompted once, disposed.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from greenroom import open_runtime
from greenroom.models import ScriptedModel
from greenroom.models.scripted import KEPT_REQUESTS
from greenroom.runtime import Runtime
from greenroom.session.persistence import JsonlPersistence, Persistence, SqlitePersistence
from greenroom.supervisor.supervisor import EXIT_HISTORY

Life = Callable[[int], Awaitable[None]]

#: Sessions whose traced memory is measured.
SESSIONS = 100


def _life(rt: Runtime) -> Life:
    async def life(number: int) -> None:
        handle = await rt.agents.create(agent_id="a", session_id=f"s{number}")
        handle.agent.send("ping")
        await handle.agent.when_idle()
        await handle.dispose()

    return life


@pytest.fixture(params=["jsonl", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Persistence:
    if request.param == "jsonl":
        return JsonlPersistence(tmp_path / "sessions")
    return SqlitePersistence(tmp_path / "sessions.sqlite")


async def test_a_session_s_life_interns_no_string(
    store: Persistence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each string `sys.intern` is given takes a slot of the interpreter's table of interned
    strings, which a string let go keeps taken until the table is rebuilt, at up to twice its
    size. With two names interned per session (pathlib interns every name a Path is made of)
    the table was rebuilt every few thousand sessions, the first time from 32,768 slots to
    65,536 (+0.5 MB). The stores join their names as text."""
    interned: list[str] = []
    intern = sys.intern

    def counted(name: str) -> str:
        interned.append(name)
        return intern(name)

    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        life = _life(rt)
        await life(0)  # what a process does once: imports, first calls
        with monkeypatch.context() as patch:
            patch.setattr(sys, "intern", counted)
            for number in range(1, 21):
                await life(number)
    assert interned == []


async def test_disposed_sessions_leave_at_most_64_bytes_each(tmp_path: Path) -> None:
    """Traced memory over a batch of sessions, after a first batch that filled the bounded
    histories sessions feed (the supervisor's exits, the scripted model's requests) with
    traced entries. A structure that kept an entry per session (a dict by session id, a
    listener, a log's bookkeeping) would leave ~100 B or more each."""
    persistence = JsonlPersistence(tmp_path)
    async with open_runtime(model=ScriptedModel(delay=0), persistence=persistence) as rt:
        life = _life(rt)
        await life(0)  # what a process does once: imports, first calls
        tracemalloc.start()
        try:
            for number in range(1, max(EXIT_HISTORY, KEPT_REQUESTS) + 10):
                await life(number)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for number in range(1_000, 1_000 + SESSIONS):
                await life(number)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    assert (after - before) / SESSIONS <= 64
