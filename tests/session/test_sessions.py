"""Sessions that survive: durability on every disposal path, repair, resume, bad input.

Real files in tmp_path, virtual time (the clock holds while a worker thread
or a persistence's writer works). Every test runs against both backends.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from greenroom import AgentOptions, Image, Text, open_runtime
from greenroom.actors.events import AGENT_DISPOSED, AGENT_ERROR
from greenroom.actors.registry import AgentIdInUse
from greenroom.actors.types import Agent, ToolInvocation
from greenroom.models import CallTool, Hang, Say, ScriptedModel, Wait
from greenroom.protocol.events import (
    COMPLETED,
    DISPOSED,
    Interrupted,
    SessionEvent,
    SessionHeader,
    StepEnd,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import (
    AssistantTurn,
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    UserTurn,
)
from greenroom.session import SessionIdInUse
from greenroom.session.persistence import (
    CorruptLog,
    JsonlPersistence,
    NotASessionLog,
    Persistence,
    PersistenceError,
    SessionExists,
    SessionNotFound,
    SqlitePersistence,
    UnsupportedVersion,
    encode_session_id,
)
from greenroom.session.persistence.postgres import PostgresPersistence
from greenroom.tools import Tool
from tests.agents_helpers import assert_enclosed, kinds, new_agent, turn_ends
from tests.persistence_helpers import Delegating, DelegatingLog, GatedOpen

Backend = Callable[[], Persistence]


@pytest.fixture(params=["jsonl", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A factory of persistence over one store: a second call reopens the same store."""
    if request.param == "jsonl":
        return lambda: JsonlPersistence(tmp_path / "sessions")
    if request.param == "sqlite":
        return lambda: SqlitePersistence(tmp_path / "sessions.sqlite")
    dsn = request.getfixturevalue("postgres_dsn")
    return lambda: PostgresPersistence(dsn)


HUNG = [[Say("partial"), Hang()]]


# -- durability on every disposal path --------------------------------------------


async def test_the_closing_turn_end_is_on_disk_after_dispose(backend: Backend) -> None:
    async with open_runtime(model=ScriptedModel(HUNG), persistence=backend()) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        await handle.dispose()
        live = list(handle.agent.session.events)
    header, stored = await backend().load("s")
    assert header.id == "s"
    assert stored == live
    assert kinds(stored)[-1] == "turn/end"
    # The turn cut by the dispose says so: disposed, never interrupted.
    assert turn_ends(stored) == [(1, DISPOSED)]


async def test_the_closing_turn_end_is_on_disk_after_the_owner_closes(backend: Backend) -> None:
    async with open_runtime(model=ScriptedModel(HUNG * 2), persistence=backend()) as rt:
        first = await rt.agents.create(agent_id="a", session_id="s1")
        second = await rt.agents.create(agent_id="b", session_id="s2")
        first.agent.send("one")
        second.agent.send("two")
        await trio.testing.wait_all_tasks_blocked()
    store = backend()
    for handle, session_id in ((first, "s1"), (second, "s2")):
        _, stored = await store.load(session_id)
        assert stored == list(handle.agent.session.events)
        assert turn_ends(stored) == [(1, DISPOSED)]


async def test_a_raising_disposed_listener_does_not_keep_the_session_in_the_store(
    backend: Backend,
) -> None:
    async with open_runtime(model=ScriptedModel(HUNG), persistence=backend()) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")

        def explode(agent: Agent) -> None:
            raise RuntimeError("listener broke")

        rt.hooks.on(AGENT_DISPOSED, explode)
        handle.agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        await handle.dispose()
        assert rt.sessions.get("s") is None
        assert rt.agents.get("a") is None
    _, stored = await backend().load("s")
    assert turn_ends(stored) == [(1, DISPOSED)]


async def test_the_prompt_is_stored_before_the_model_sees_it_and_one_flush_ends_a_turn(
    backend: Backend,
) -> None:
    flushes: list[int] = []
    stored_at_call: list[list[str]] = []

    class Counting(DelegatingLog):
        async def flush(self) -> None:
            flushes.append(agent.session.last_turn)
            await self.inner.flush()

    class Reading:
        """Reads the stored log each time it is called, then echoes."""

        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
            _, events = await backend().load("s")
            stored_at_call.append([e.content for e in events if isinstance(e, UserMessage)])
            yield TextDelta("ok")
            yield Finish("stop")

    persistence = Delegating(backend())
    persistence.log_type = Counting
    async with open_runtime(model=Reading(), persistence=persistence) as rt:
        agent = await new_agent(rt)
        for text in ("one", "two"):
            agent.send(text)
            await agent.when_idle()
    assert stored_at_call == [["one"], ["one", "two"]]
    assert flushes == [1, 2]


# -- resume --------------------------------------------------------------------------


async def test_resume_continues_turns_and_history_without_duplicate_seqs(
    backend: Backend,
) -> None:
    async with open_runtime(model=ScriptedModel(delay=0), persistence=backend()) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd="/work")
        handle.agent.send("first question")
        await handle.agent.when_idle()
        await handle.dispose()
    model = ScriptedModel(delay=0)
    async with open_runtime(model=model, persistence=backend()) as rt:
        resumed = await rt.agents.resume(agent_id="a2", session_id="s")
        agent = resumed.agent
        assert agent.session.header.cwd == "/work"
        agent.send("second question")
        await agent.when_idle()
        events = agent.session.events
        assert [t for t, _ in turn_ends(events)] == [1, 2]
        assert_enclosed(events)
        assert model.requests[0].messages[:2] == [
            UserTurn("first question"),
            AssistantTurn("first question", []),  # the scripted model echoes
        ]
        assert model.requests[0].messages[-1] == UserTurn("second question")
        await resumed.dispose()
    _, stored = await backend().load("s")
    assert [e.seq for e in stored] == list(range(len(stored)))
    assert stored == list(agent.session.events)


async def test_resuming_a_live_or_loading_session_is_rejected(backend: Backend) -> None:
    store = backend()
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("hi")
        await handle.agent.when_idle()
        with pytest.raises(SessionIdInUse, match="session 's' is already live"):
            await rt.agents.resume(agent_id="b", session_id="s")
        with pytest.raises(AgentIdInUse, match="agent 'a' is already registered"):
            await rt.agents.resume(agent_id="a", session_id="other")
        await handle.dispose()
        with pytest.raises(SessionNotFound, match="no stored session 'missing'"):
            await rt.agents.resume(agent_id="b", session_id="missing")
        assert rt.agents.list() == []
        assert rt.sessions.list() == []


async def test_a_resume_whose_load_finishes_after_the_owner_closed_leaks_nothing(
    backend: Backend,
) -> None:
    store = backend()
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("hi")
        await handle.agent.when_idle()
        await handle.dispose()
    gated = GatedOpen(store)

    outcome: list[BaseException] = []

    async def resume(rt: object) -> None:
        try:
            await runtime.agents.resume(agent_id="a", session_id="s")
        except RuntimeError as exc:
            outcome.append(exc)

    async with trio.open_nursery() as nursery:
        async with open_runtime(model=ScriptedModel(delay=0), persistence=gated) as runtime:
            nursery.start_soon(resume, runtime)
            await trio.testing.wait_all_tasks_blocked()
        gated.gate.set()
    assert len(outcome) == 1
    assert "is closed" in str(outcome[0])
    assert runtime.agents.list() == []
    assert runtime.sessions.list() == []


# -- crash repair ------------------------------------------------------------------------


def _line(event: SessionEvent) -> bytes:
    return msgspec.json.encode(event) + b"\n"


async def _stored_turn(tmp_path: Path) -> tuple[JsonlPersistence, Path, list[SessionEvent]]:
    """A JSONL session with one completed turn, written through the runtime."""
    store = JsonlPersistence(tmp_path / "sessions")
    async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("hello there")
        await handle.agent.when_idle()
        events = list(handle.agent.session.events)
        await handle.dispose()
    return store, Path(store.path("s")), events


async def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    store, path, events = await _stored_turn(tmp_path)
    with open(path, "ab") as file:
        file.write(b'{"type":"turn/start","turn":2,"trig')
    torn = path.read_bytes()
    _, loaded = await JsonlPersistence(store.root).load("s")
    assert loaded == events
    assert path.read_bytes() == torn  # a load writes nothing
    _, opened, log = await JsonlPersistence(store.root).open("s")
    await log.close()
    assert opened == events
    assert path.read_bytes().endswith(b"\n")  # taking it live repairs it


async def test_an_open_final_turn_is_closed_interrupted_and_the_closers_persist(
    tmp_path: Path,
) -> None:
    store, path, events = await _stored_turn(tmp_path)
    model = ScriptedModel([[CallTool("bash", {"command": "sleep 100"})]])

    class Command(msgspec.Struct):
        command: str

    async def hang(args: Command, call: ToolInvocation) -> str:
        await trio.sleep_forever()
        return "unreachable"

    # A process killed mid-tool-call would have written these:
    async with open_runtime(model=model, tools=[Tool("bash", "runs", Command, hang)]) as rt:
        agent = await new_agent(rt, agent_id="x", session_id="scratch")
        agent.send("run it")
        await trio.testing.wait_all_tasks_blocked()
        partial = list(agent.session.events)
    with open(path, "ab") as file:
        for offset, event in enumerate(partial):
            file.write(_line(msgspec.structs.replace(event, seq=len(events) + offset)))
    _, loaded, log = await JsonlPersistence(store.root).open("s")
    await log.close()
    closers = loaded[len(events) + len(partial) :]
    assert kinds(closers) == ["tool/result", "step/end", "turn/end"]
    result, step_end, turn_end = closers
    assert isinstance(result, ToolResult)
    assert result.is_error
    assert result.error is not None
    assert result.error.code == "interrupted"
    assert isinstance(step_end, StepEnd)
    assert step_end.step == 1
    assert isinstance(turn_end, TurnEnd)
    assert turn_end.reason == Interrupted()
    assert_enclosed(loaded)
    # Persisted: a second load reads the same log and adds nothing.
    _, again = await JsonlPersistence(store.root).load("s")
    assert again == loaded


async def test_a_corrupt_line_before_the_last_turn_end_is_an_error_naming_file_and_line(
    tmp_path: Path,
) -> None:
    store, path, _ = await _stored_turn(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[3] = b"{garbage"
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    with pytest.raises(CorruptLog, match=rf"{path.name}: line 4 is corrupt"):
        await JsonlPersistence(store.root).load("s")
    assert path.read_bytes() == before  # nothing rewritten


async def test_a_seq_gap_keeps_the_contiguous_prefix(tmp_path: Path) -> None:
    store, path, events = await _stored_turn(tmp_path)
    stray = TurnStart(turn=2, trigger=events[0].trigger)  # type: ignore[union-attr]
    with open(path, "ab") as file:
        file.write(_line(msgspec.structs.replace(stray, seq=len(events) + 5)))
    _, loaded = await JsonlPersistence(store.root).load("s")
    assert loaded == events


# -- bad input ------------------------------------------------------------------------


async def test_an_unknown_header_version_is_a_typed_error_and_nothing_is_rewritten(
    tmp_path: Path,
) -> None:
    store = JsonlPersistence(tmp_path)
    path = Path(store.path("s"))
    path.write_bytes(b'{"type":"session","version":7,"id":"s","created_at":1}\n')
    with pytest.raises(UnsupportedVersion, match=rf"{path}: session log version 7"):
        await store.load("s")
    assert path.read_bytes() == b'{"type":"session","version":7,"id":"s","created_at":1}\n'


async def test_a_file_that_is_not_a_session_log_is_a_typed_error(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    path = Path(store.path("s"))
    path.write_bytes(b"hello, I am a shopping list\n")
    with pytest.raises(NotASessionLog, match=rf"{path}: line 1 is not a session header"):
        await store.load("s")
    assert path.read_bytes() == b"hello, I am a shopping list\n"
    assert await store.list() == []  # listed sessions skip it


async def test_the_list_shows_the_title_a_model_wrote_through_later_lives(
    backend: Backend,
) -> None:
    """`list` gives the title a model wrote (``config/set title``) in place of the first
    prompt's, and keeps it through later turns and a new life of the session. The first
    answer is long: in a JSONL log the title lies past the head `list` reads."""
    options = AgentOptions(titles="model")
    model = ScriptedModel([[Say("x" * 70_000)], [Say("Greeting the world")]], delay=0)
    store = backend()
    async with open_runtime(model=model, persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        await handle.agent.run("hello world")
        await handle.agent.when_idle()
        [listed] = await store.list()
        assert listed.title == "Greeting the world"
        await handle.dispose()
    store = backend()
    async with open_runtime(model=ScriptedModel(), persistence=store) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s", options=options)
        await handle.agent.run("and now?")
        await handle.dispose()
    [listed] = await store.list()
    assert listed.title == "Greeting the world"


async def test_a_first_prompt_holding_a_nul_is_stored_and_listed_without_it(
    backend: Backend,
) -> None:
    """PostgreSQL's text cannot hold a NUL: a prompt's title leaves it out on every store
    (the prompt keeps it), instead of failing every write of the session."""
    store = backend()
    model = ScriptedModel([[Say("ok")]], delay=0)
    async with open_runtime(model=model, persistence=store) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        answer = await handle.agent.run("a\x00b")
        assert (answer.stop_reason, answer.text) == ("completed", "ok")
        assert handle.agent.session.title == "ab"
        await handle.dispose()
    [listed] = await store.list()
    assert listed.title == "ab"
    _, events = await store.load("s")
    assert [e.content for e in events if isinstance(e, UserMessage)] == ["a\x00b"]


async def test_a_missing_session_is_a_typed_error_with_the_path(backend: Backend) -> None:
    with pytest.raises(SessionNotFound, match="no stored session 'nope'"):
        await backend().load("nope")


@pytest.mark.parametrize(
    "hostile",
    ["../x", "a/b", "\x00", "..", ".", "/etc/passwd", "ünï/cødé", "x" * 60, "y" * 10_000],
)
async def test_hostile_ids_stay_inside_the_store(
    backend: Backend, tmp_path: Path, hostile: str
) -> None:
    store = backend()
    header = SessionHeader(id=hostile, created_at=1)
    if isinstance(store, JsonlPersistence) and len(hostile) > 1000:
        # Too long for a file name: rejected clearly, before touching the disk.
        with pytest.raises(ValueError, match="session id is too long to store"):
            await store.create(header)
        with pytest.raises(ValueError, match="session id is too long to store"):
            await store.load(hostile)
        assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
        return
    if isinstance(store, PostgresPersistence) and "\x00" in hostile:
        # PostgreSQL's text cannot hold it: refused clearly, before anything is stored.
        with pytest.raises(ValueError, match="cannot hold a NUL character"):
            await store.create(header)
        assert await store.list() == []
        return
    log = await store.create(header)
    assert (await store.load(hostile))[0] == header
    assert [s.header.id for s in await store.list()] == [hostile]
    for path in tmp_path.rglob("*"):
        assert path.parent in (tmp_path, tmp_path / "sessions", tmp_path / "sessions.sqlite.locks")
    await log.close()


def test_encoded_ids_never_carry_separators_dots_or_nul() -> None:
    for hostile in ("../x", "a/b", "\x00", "..", "c:\\x", "😀"):
        stem = encode_session_id(hostile)
        assert not set(stem) & {"/", "\\", ".", "\x00"}


async def test_a_failing_drain_is_reported_and_the_events_wait_for_the_next(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    inner = backend()
    failures = [OSError(28, "No space left on device")]

    class Flaky(DelegatingLog):
        async def flush(self) -> None:
            if failures:
                raise failures.pop()
            await self.inner.flush()

    persistence = Delegating(inner)
    persistence.log_type = Flaky
    errors: list[str] = []
    async with open_runtime(model=ScriptedModel(delay=0), persistence=persistence) as rt:
        rt.hooks.on(AGENT_ERROR, lambda agent, turn, step, exc: errors.append(str(exc)))
        handle = await rt.agents.create(agent_id="a", session_id="s")
        with caplog.at_level(logging.ERROR, logger="greenroom.agent"):
            handle.agent.send("one")
            await handle.agent.when_idle()
        assert errors == ["[Errno 28] No space left on device"]
        assert "flush of session 's' failed" in caplog.text
        handle.agent.send("two")  # the agent stays usable
        await handle.agent.when_idle()
        live = list(handle.agent.session.events)
        await handle.dispose()
    _, stored = await backend().load("s")
    assert stored == live + stored[len(live) :]
    assert turn_ends(stored) == [(1, COMPLETED), (2, COMPLETED)]
    assert [e.content for e in stored if isinstance(e, UserMessage)] == ["one", "two"]


async def test_an_async_stream_of_slow_turns_survives_a_dispose_mid_wait(
    backend: Backend,
) -> None:
    model = ScriptedModel([[Say("a"), Wait(5), Say("b")]])
    async with open_runtime(model=model, persistence=backend()) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await trio.sleep(2)
        await handle.dispose()
    _, stored = await backend().load("s")
    assert turn_ends(stored) == [(1, DISPOSED)]
    assert kinds(stored).count("assistant/chunk") == 1


async def test_creating_a_stored_session_is_refused_and_stores_nothing(backend: Backend) -> None:
    async with open_runtime(model=ScriptedModel(delay=0), persistence=backend()) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd="/work")
        handle.agent.send("hello")
        await handle.agent.when_idle()
        await handle.dispose()
        with pytest.raises(SessionExists, match="session 's' is stored already"):
            await rt.agents.create(agent_id="b", session_id="s")
        assert rt.agents.list() == []
        assert rt.sessions.list() == []
    header, stored = await backend().load("s")
    assert header.cwd == "/work"
    assert turn_ends(stored) == [(1, COMPLETED)]


async def test_events_of_a_session_whose_drains_all_failed_never_corrupt_a_new_life(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = JsonlPersistence(tmp_path)
    broken = [True]

    class FullDisk(DelegatingLog):
        """While the disk is full, nothing it is given reaches the file, to the end."""

        def append(self, event: SessionEvent) -> None:
            if not broken[0]:
                self.inner.append(event)

        async def write_ahead(self) -> None:
            if broken[0]:
                raise PersistenceError("[Errno 28] No space left on device")
            await self.inner.write_ahead()

        async def flush(self) -> None:
            if broken[0]:
                raise PersistenceError("[Errno 28] No space left on device")
            await self.inner.flush()

    failing = Delegating(store)
    failing.log_type = FullDisk

    with caplog.at_level(logging.ERROR, logger="greenroom.agent"):
        async with open_runtime(model=ScriptedModel(delay=0), persistence=failing) as rt:
            first = await rt.agents.create(agent_id="a", session_id="s")
            first.agent.send("lost to a full disk")
            await first.agent.when_idle()
            await first.dispose()
            # Its last flush failed too: reported, and its events died with that life.
            assert "flush of session 's' failed" in caplog.text
            broken[0] = False
            second = await rt.agents.resume(agent_id="b", session_id="s")
            second.agent.send("written")
            await second.agent.when_idle()
            await second.dispose()
    _, stored = await store.load("s")
    assert_enclosed(stored)
    assert turn_ends(stored) == [(1, COMPLETED)]


async def test_a_failed_drain_is_retried_when_the_agent_is_disposed(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    failures = [OSError(5, "I/O error")]

    class FailsOnce(DelegatingLog):
        async def flush(self) -> None:
            if failures:
                raise failures.pop()
            await self.inner.flush()

    once = Delegating(store)
    once.log_type = FailsOnce

    async with open_runtime(model=ScriptedModel(delay=0), persistence=once) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("hello")
        await handle.agent.when_idle()
        await handle.dispose()  # no turn runs after the failure: the dispose drains
    _, stored = await store.load("s")
    assert turn_ends(stored) == [(1, COMPLETED)]


async def test_a_session_id_the_backend_cannot_store_is_refused_before_anything_exists(
    tmp_path: Path,
) -> None:
    huge = "s" * 5000
    async with open_runtime(persistence=JsonlPersistence(tmp_path)) as rt:
        with pytest.raises(ValueError, match=r"session id is too long to store.*at most 200"):
            await rt.agents.create(agent_id="a", session_id=huge)
        with pytest.raises(ValueError, match=r"session id is too long to store.*at most 200"):
            await rt.agents.resume(agent_id="a", session_id=huge)
        assert rt.agents.list() == []
        assert rt.sessions.list() == []
    assert list(tmp_path.iterdir()) == []


def test_the_sqlite_backend_takes_long_ids(tmp_path: Path) -> None:
    SqlitePersistence(tmp_path / "db").check_session_id("s" * 5000)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_every_file_of_a_store_is_private_to_its_user(tmp_path: Path, kind: str) -> None:
    """Sessions hold prompts and file contents: the SQLite database, its -wal and -shm were
    made 0644, the folder of its blobs 0755, where JSONL made its files 0600."""
    root = tmp_path / "store"
    root.mkdir()
    store: Persistence = (
        JsonlPersistence(root / "sessions") if kind == "jsonl" else SqlitePersistence(root / "s.db")
    )
    previous = os.umask(0o022)  # the usual one, whatever this process was given
    try:
        async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s1")
            await handle.agent.run([Text("look"), Image(b"\x89PNG...", "image/png")])
            made = sorted(root.rglob("*"))
            modes = {path.relative_to(root): stat.S_IMODE(path.stat().st_mode) for path in made}
            await handle.dispose()
    finally:
        os.umask(previous)
    assert {p.name.rsplit(".", 1)[-1] for p in modes if p.suffix} >= (
        {"jsonl", "lock"} if kind == "jsonl" else {"db", "db-wal", "db-shm", "lock"}
    ), modes
    assert any(len(p.name) == 64 for p in modes), modes  # a blob
    loose = {p: oct(m) for p, m in modes.items() if m != (0o700 if (root / p).is_dir() else 0o600)}
    assert loose == {}
