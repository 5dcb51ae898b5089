"""Durable turns: `resume(..., interrupted="continue")` carries a cut turn on from its log.

Each test stores a log as a crash leaves it (a turn with no ``turn/end``), cut
at one point, then resumes it in this process and checks what is asked of the
model, which calls run again, and what the log ends with. The last tests SIGKILL
a real child process (`tests/durable_child.py`) at those points, on each backend,
and let a second one carry the turn on.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import acp
import msgspec
import pytest
import trio
import trio.testing
from acp import schema

from greenroom import open_runtime
from greenroom.acp import serve_connection
from greenroom.actors.types import PermissionRequest, ToolInvocation
from greenroom.protocol.events import (
    USER,
    AssistantChunk,
    AssistantMessage,
    Completed,
    Interrupted,
    MessageTrigger,
    PermissionDecision,
    PermissionRule,
    SessionEvent,
    SteeringMessage,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnResumed,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    ToolTurn,
)
from greenroom.session import new_header
from greenroom.session.persistence import JsonlPersistence, Persistence
from greenroom.tools import Tool
from tests import TESTS
from tests.acp_peer import Peer
from tests.agents_helpers import assert_enclosed
from tests.session.test_kill9 import Lines


class Replies:
    """Answers ``done`` and calls nothing; keeps every request. Its first chunk comes
    without a checkpoint: a continued turn has it logged before its resume returns."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        yield TextDelta("done")
        await trio.lowlevel.checkpoint()
        yield Finish("stop")


class NoArgs(msgspec.Struct):
    pass


class Runs:
    """The tools a cut turn called, each counting its runs."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}

    def tool(self, name: str, **flags: object) -> Tool[NoArgs]:
        async def run(args: NoArgs, call: ToolInvocation) -> str:
            await trio.lowlevel.checkpoint()
            self.count[name] = self.count.get(name, 0) + 1
            return f"{name} ran"

        return Tool(name, f"the {name} tool", NoArgs, run, **flags)  # type: ignore[arg-type]

    def tools(self) -> list[Tool[NoArgs]]:
        return [
            self.tool("write", kind="edit"),
            self.tool("look", kind="read"),
            self.tool("put", kind="edit", idempotent=True),
        ]


def prompt_turn(*tail: SessionEvent) -> list[SessionEvent]:
    """Turn 1 of a session, as far as `tail` takes it."""
    return [
        TurnStart(turn=1, trigger=MessageTrigger(USER)),
        UserMessage(content="do it", source=USER, message_id="m-1"),
        *tail,
    ]


def replied(*calls: str, text: str = "calling") -> AssistantMessage:
    return AssistantMessage(
        turn=1,
        step=1,
        content=text,
        tool_calls=[ToolCallChunk(f"c-{name}", name, "{}") for name in calls],
    )


def logged_call(name: str, kind: str = "other") -> ToolCall:
    return ToolCall(turn=1, step=1, call_id=f"c-{name}", name=name, arguments="{}", kind=kind)  # type: ignore[arg-type]


async def store_cut(
    store: Persistence,
    events: Sequence[SessionEvent],
    session_id: str = "s",
    cwd: str | None = None,
) -> None:
    """Store `events` as the log of `session_id`, as a crash would leave it."""
    log = await store.create(new_header(session_id, cwd=cwd))
    for seq, event in enumerate(events):
        msgspec.structs.force_setattr(event, "seq", seq)
        log.append(event)
    await log.close()


async def resume_cut(
    tmp_path: Path, events: Sequence[SessionEvent], model: Replies, runs: Runs
) -> tuple[list[SessionEvent], str, str]:
    """Resume the cut log with "continue"; the log after, the answer's stop reason and text."""
    store = JsonlPersistence(tmp_path / "sessions")
    await store_cut(store, events)
    async with open_runtime(model=model, persistence=store, tools=runs.tools()) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
        assert handle.resumed is not None
        with trio.fail_after(10):
            answer = await handle.resumed
        await handle.dispose()
    _, stored = await store.load("s")
    assert_enclosed(stored)
    return stored, answer.stop_reason, answer.text


def ends_of(events: Sequence[SessionEvent], turn: int = 1) -> list[TurnEnd]:
    return [e for e in events if isinstance(e, TurnEnd) and e.turn == turn]


def resumed_of(events: Sequence[SessionEvent]) -> TurnResumed:
    (resumed,) = [e for e in events if isinstance(e, TurnResumed)]
    return resumed


def results(events: Sequence[SessionEvent]) -> dict[str, ToolResult]:
    return {e.call_id: e for e in events if isinstance(e, ToolResult)}


async def test_a_model_step_cut_mid_reply_is_requested_once_and_the_turn_completes(
    tmp_path: Path,
) -> None:
    model, runs = Replies(), Runs()
    cut = prompt_turn(
        StepStart(turn=1, step=1),
        AssistantChunk(turn=1, step=1, chunk=TextDelta("half a rep")),
    )
    events, stop, text = await resume_cut(tmp_path, cut, model, runs)
    assert len(model.requests) == 1
    assert (stop, text) == ("completed", "done")
    (end,) = ends_of(events)
    assert isinstance(end.reason, Completed)
    assert resumed_of(events).requested
    assert resumed_of(events).step == 1
    # The cut step is closed as it stands; the model answers in the next one.
    assert [e.step for e in events if isinstance(e, StepStart)] == [1, 2]


async def test_a_turn_cut_before_its_first_step_runs_it(tmp_path: Path) -> None:
    model, runs = Replies(), Runs()
    events, stop, _ = await resume_cut(tmp_path, prompt_turn(), model, runs)
    assert len(model.requests) == 1
    assert stop == "completed"
    assert len(ends_of(events)) == 1
    assert not resumed_of(events).requested


async def test_a_reply_logged_whole_is_never_requested_again(tmp_path: Path) -> None:
    model, runs = Replies(), Runs()
    cut = prompt_turn(StepStart(turn=1, step=1), replied(text="the answer"))
    events, stop, text = await resume_cut(tmp_path, cut, model, runs)
    assert model.requests == []
    assert (stop, text) == ("completed", "the answer")
    assert len(ends_of(events)) == 1


async def test_steering_logged_after_the_last_reply_asks_for_another_step(
    tmp_path: Path,
) -> None:
    model, runs = Replies(), Runs()
    cut = prompt_turn(
        StepStart(turn=1, step=1),
        replied(text="first"),
        StepEnd(turn=1, step=1),
        SteeringMessage(turn=1, content="and also this", source=USER, message_id="m-2"),
    )
    events, _, text = await resume_cut(tmp_path, cut, model, runs)
    assert text == "done"
    (request,) = model.requests
    assert "and also this" in str(request.messages[-1])
    assert len(ends_of(events)) == 1


async def test_a_call_started_without_a_result_is_interrupted_not_run_again(
    tmp_path: Path,
) -> None:
    model, runs = Replies(), Runs()
    cut = prompt_turn(StepStart(turn=1, step=1), replied("write"), logged_call("write", "edit"))
    events, stop, text = await resume_cut(tmp_path, cut, model, runs)
    assert runs.count == {}
    result = results(events)["c-write"]
    assert result.is_error
    assert result.error is not None
    assert result.error.code == "interrupted"
    assert "may or may not" in result.content
    assert resumed_of(events).interrupted == ["c-write"]
    # The model is told, and the turn goes on.
    (request,) = model.requests
    assert isinstance(request.messages[-1], ToolTurn)
    assert (stop, text) == ("completed", "done")
    assert len(ends_of(events)) == 1


@pytest.mark.parametrize(("name", "kind"), [("look", "read"), ("put", "edit")])
async def test_a_call_safe_to_repeat_is_run_again(tmp_path: Path, name: str, kind: str) -> None:
    model, runs = Replies(), Runs()
    cut = prompt_turn(StepStart(turn=1, step=1), replied(name), logged_call(name, kind))
    events, stop, _ = await resume_cut(tmp_path, cut, model, runs)
    assert runs.count == {name: 1}
    assert results(events)[f"c-{name}"].content == f"{name} ran"
    assert resumed_of(events).rerun == [f"c-{name}"]
    # Its call was logged once: by the life that was cut.
    assert [e.call_id for e in events if isinstance(e, ToolCall)] == [f"c-{name}"]
    assert stop == "completed"
    assert len(ends_of(events)) == 1


class NeverAsked:
    """Permissions that fail the test if anyone is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def decide(self, request: PermissionRequest) -> PermissionDecision:
        await trio.lowlevel.checkpoint()
        self.asked.append(request.tool)
        return "reject_once"


async def test_an_always_answer_logged_before_the_cut_is_not_asked_again(
    tmp_path: Path,
) -> None:
    model, runs, permissions = Replies(), Runs(), NeverAsked()
    cut = prompt_turn(
        StepStart(turn=1, step=1),
        replied("put"),
        PermissionRule(tool="put", allow=True),
        logged_call("put", "edit"),
    )
    store = JsonlPersistence(tmp_path / "sessions")
    await store_cut(store, cut)
    async with open_runtime(
        model=model, persistence=store, tools=runs.tools(), permissions=permissions
    ) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
        assert handle.resumed is not None
        await handle.resumed
        await handle.dispose()
    assert permissions.asked == []
    assert runs.count == {"put": 1}  # run again, as allowed before the cut


async def test_calls_the_log_never_reached_had_not_run_and_run_now(tmp_path: Path) -> None:
    model, runs = Replies(), Runs()
    cut = prompt_turn(StepStart(turn=1, step=1), replied("write", "look"))
    events, _, _ = await resume_cut(tmp_path, cut, model, runs)
    assert runs.count == {"write": 1, "look": 1}
    assert resumed_of(events).rerun == []
    assert resumed_of(events).interrupted == []
    assert [e.call_id for e in events if isinstance(e, ToolCall)] == ["c-write", "c-look"]


async def test_a_call_with_its_result_logged_is_left_alone(tmp_path: Path) -> None:
    model, runs = Replies(), Runs()
    cut = prompt_turn(
        StepStart(turn=1, step=1),
        replied("look", "write"),
        logged_call("look", "read"),
        ToolResult(turn=1, step=1, call_id="c-look", content="looked before"),
        logged_call("write", "edit"),
    )
    events, _, _ = await resume_cut(tmp_path, cut, model, runs)
    assert runs.count == {}
    assert results(events)["c-look"].content == "looked before"
    assert results(events)["c-write"].error.code == "interrupted"  # type: ignore[union-attr]
    assert len(ends_of(events)) == 1


class Hangs:
    """A model that never answers."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        await trio.sleep_forever()
        yield Finish("stop")  # pragma: no cover


async def test_a_continued_turn_is_cancelled_like_any_other(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path / "sessions")
    await store_cut(store, prompt_turn(StepStart(turn=1, step=1)))
    async with open_runtime(model=Hangs(), persistence=store) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
        assert handle.resumed is not None
        await trio.sleep(1)  # the step asked again, its model hanging
        assert handle.agent.status == "running"
        handle.agent.cancel("enough")
        answer = await handle.resumed
        assert (answer.stop_reason, answer.reason) == ("aborted", "enough")
        assert str(handle.agent.status) == "idle"  # (mypy narrowed it to "running")
        await handle.dispose()
    _, events = await store.load("s")
    assert_enclosed(events)
    assert len(ends_of(events)) == 1


async def test_close_stays_the_default(tmp_path: Path) -> None:
    model, runs = Replies(), Runs()
    store = JsonlPersistence(tmp_path / "sessions")
    await store_cut(store, prompt_turn(StepStart(turn=1, step=1)))
    async with open_runtime(model=model, persistence=store, tools=runs.tools()) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s")
        assert handle.resumed is None
        await handle.dispose()
    _, events = await store.load("s")
    (end,) = ends_of(events)
    assert isinstance(end.reason, Interrupted)
    assert model.requests == []
    assert not [e for e in events if isinstance(e, TurnResumed)]


async def test_a_session_with_no_cut_turn_has_nothing_to_carry_on(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path / "sessions")
    await store_cut(store, prompt_turn(TurnEnd(turn=1, reason=Interrupted())))
    async with open_runtime(persistence=store) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
        assert handle.resumed is None
        await handle.dispose()


async def test_an_unknown_interrupted_is_refused_naming_it(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path / "sessions")
    await store_cut(store, prompt_turn())
    async with open_runtime(persistence=store) as rt:
        with pytest.raises(
            ValueError, match="interrupted must be one of close, continue, not 'go'"
        ):
            await rt.agents.resume(agent_id="a", session_id="s", interrupted="go")  # type: ignore[arg-type]
    _, events = await store.load("s")  # nothing was opened: the cut turn is as it was
    assert len(events) == 2 + 1  # the two logged, and load's in-memory closer


# -- a real process SIGKILLed mid-turn, then carried on by the next ---------------------

CHILD = TESTS / "durable_child.py"
BACKENDS = ["jsonl", "sqlite", "postgres"]


def _target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        return dsn
    return str(tmp_path / ("sessions" if backend == "jsonl" else "sessions.sqlite"))


async def _life(backend: str, target: str, cut: str, runs: Path, *, kill: bool) -> list[str]:
    """Run the child once; with `kill`, SIGKILL it at its ``cut`` line. Its lines."""
    process = await trio.lowlevel.open_process(
        [sys.executable, str(CHILD), backend, target, cut, str(runs)], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    lines = Lines(process.stdout)
    seen: list[str] = []
    try:
        while True:
            try:
                line = await lines.next()
            except EOFError:
                break
            seen.append(line)
            if kill and line == "cut":
                break
    finally:
        if kill:
            process.send_signal(signal.SIGKILL)
        await process.wait()
        await process.stdout.aclose()
    assert process.returncode == (-signal.SIGKILL if kill else 0), seen
    return seen


async def _stored(backend: str, target: str) -> list[SessionEvent]:
    store = _child_store(backend, target)
    try:
        _, events = await store.load("s")
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return list(events)


def _child_store(backend: str, target: str) -> Persistence:
    from tests.durable_child import store_of

    return store_of(backend, target)


@pytest.mark.real_clock
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_process_killed_during_a_model_step_has_the_step_requested_once_more(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target, runs = _target(backend, tmp_path, request), tmp_path / "runs"
    with trio.fail_after(90):
        first = await _life(backend, target, "model", runs, kill=True)
        assert first == ["request UserTurn", "cut"]
        second = await _life(backend, target, "model", runs, kill=False)
    assert second == ["request UserTurn", "answer completed done after ''"]
    events = await _stored(backend, target)
    assert_enclosed(events)
    assert len(ends_of(events)) == 1
    assert resumed_of(events).requested
    # The write-ahead logged the cut step before the model was asked: it is closed as it
    # stands (its chunks were never written), and the model answers in the next one.
    assert [e.step for e in events if isinstance(e, StepStart)] == [1, 2]


@pytest.mark.real_clock
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_process_killed_in_a_tool_call_gives_it_an_interrupted_result_not_a_rerun(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target, runs = _target(backend, tmp_path, request), tmp_path / "runs"
    with trio.fail_after(90):
        await _life(backend, target, "write", runs, kill=True)
        second = await _life(backend, target, "write", runs, kill=False)
    assert runs.read_text() == "write\n"  # it ran once, in the life that was killed
    assert second[0] == "request ToolTurn"  # no step was asked again: the call's result is next
    assert second[-1].startswith("answer completed done after 'interrupted: ")
    events = await _stored(backend, target)
    assert_enclosed(events)
    assert len(ends_of(events)) == 1
    assert results(events)["call-1"].error.code == "interrupted"  # type: ignore[union-attr]
    assert resumed_of(events).interrupted == ["call-1"]


@pytest.mark.real_clock
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_process_killed_in_a_read_tool_call_has_it_run_again(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target, runs = _target(backend, tmp_path, request), tmp_path / "runs"
    with trio.fail_after(90):
        await _life(backend, target, "read", runs, kill=True)
        second = await _life(backend, target, "read", runs, kill=False)
    assert runs.read_text() == "look\nlook\n"
    assert second == ["request ToolTurn", "answer completed done after 'look ran'"]
    events = await _stored(backend, target)
    assert_enclosed(events)
    assert len(ends_of(events)) == 1
    assert results(events)["call-1"].content == "look ran"
    assert resumed_of(events).rerun == ["call-1"]


# -- over ACP, with the official SDK client ---------------------------------------------


class Updates:
    """The client side of the SDK connection: every session/update, in order."""

    def __init__(self) -> None:
        self.updates: list[Any] = []
        self.changed = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        self.changed.set()

    async def request_permission(self, **kwargs: Any) -> Any:
        raise AssertionError("nothing here asks permission")

    def on_connect(self, conn: Any) -> None:
        pass

    def text(self) -> str:
        return "".join(
            u.content.text for u in self.updates if isinstance(u, schema.AgentMessageChunk)
        )

    async def wait_for_text(self, text: str) -> None:
        while text not in self.text():
            self.changed.clear()
            await self.changed.wait()


async def test_over_acp_a_load_answers_before_the_carried_on_turn_is_shown(
    tmp_path: Path,
) -> None:
    store = JsonlPersistence(tmp_path / "sessions")
    cut = prompt_turn(StepStart(turn=1, step=1))
    await store_cut(store, cut, "cut-1", str(tmp_path))
    async with open_runtime(model=Replies(), persistence=store) as runtime:
        client, server = trio.testing.memory_stream_pair()
        peer = Peer(client)
        served = trio.Event()

        async def serve() -> None:
            await serve_connection(runtime, server, interrupted="continue")
            served.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(peer.read_loop)
            await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            load = {"sessionId": "cut-1", "cwd": str(tmp_path), "mcpServers": []}
            answered = await peer.call("session/load", load)
            with trio.fail_after(10):
                said = await peer.wait_for(
                    lambda f: (
                        f.get("method") == "session/update"
                        and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                    )
                )
            replayed = await peer.wait_for(
                lambda f: (
                    f.get("method") == "session/update"
                    and f["params"]["update"]["sessionUpdate"] == "user_message_chunk"
                )
            )
            # The cut turn as it was stored, the answer, then the turn carried on.
            assert peer.index_of(replayed) < peer.index_of(answered) < peer.index_of(said)
            assert said["params"]["update"]["content"]["text"] == "done"
            await peer.close()
            await served.wait()
            nursery.cancel_scope.cancel()
    _, events = await store.load("cut-1")
    assert len(ends_of(events)) == 1


def test_acp_load_replays_the_cut_turn_then_carries_it_on(tmp_path: Path) -> None:
    """``greenroom acp --interrupted continue``: the load replays the cut turn as it is
    logged and answers; the turn then goes on, its updates sent after that answer; a
    prompt sent next is answered as usual."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    store: Persistence = JsonlPersistence(home / "sessions")
    cut: list[SessionEvent] = [
        TurnStart(turn=1, trigger=MessageTrigger(USER)),
        UserMessage(content="carry this on", source=USER, message_id="m-1"),
        StepStart(turn=1, step=1),
    ]
    trio.run(store_cut, store, cut, "cut-1", str(work))
    updates = Updates()
    client: Any = updates  # the SDK's Client protocol, as the SDK calls it
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")

    async def scenario() -> None:
        async with acp.spawn_agent_process(
            client,
            *command,
            "--interrupted",
            "continue",
            env={"GREENROOM_HOME": str(home)},
            cwd=work,
        ) as (conn, process):
            await conn.initialize(protocol_version=1)
            await conn.load_session(session_id="cut-1", cwd=str(work), mcp_servers=[])
            replayed = len(updates.updates)
            users = [
                u for u in updates.updates[:replayed] if isinstance(u, schema.UserMessageChunk)
            ]
            assert [u.content.text for u in users] == ["carry this on"]
            await updates.wait_for_text("carry this on")  # the echo model, asked again
            answer = await conn.prompt(session_id="cut-1", prompt=[acp.text_block("and then")])
            assert answer.stop_reason == "end_turn"
            # Each update once: none of the continued turn's both replayed and sent live.
            assert updates.text() == "carry this onand then"
        assert await asyncio.wait_for(process.wait(), 10) == 0

    asyncio.run(asyncio.wait_for(scenario(), 60))
    _, events = trio.run(store.load, "cut-1")
    assert_enclosed(events)
    assert [(e.turn, type(e.reason)) for e in events if isinstance(e, TurnEnd)] == [
        (1, Completed),
        (2, Completed),
    ]
    assert resumed_of(events).requested
