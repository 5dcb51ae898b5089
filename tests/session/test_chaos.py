"""Chaos, measured: PostgreSQL behind a TCP proxy that passes, delays or black-holes traffic,
and a JSONL disk that fills up.

The proxy (`Proxy`) is written here with Trio: it listens on 127.0.0.1 and forwards each
connection to the suite's server on its unix socket. Node 1 reaches the server through
it; node 2 directly. The disk-full case runs in a child process whose file-size limit
(``RLIMIT_FSIZE``) is lowered and raised again, so the suite's own files are not limited.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.parse
from functools import partial
from pathlib import Path

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.acp.connection import TEARDOWN_GRACE
from greenroom.actors.events import AGENT_ERROR
from greenroom.actors.loop import CLOSING_GRACE
from greenroom.actors.prompt import Answer
from greenroom.models import ScriptedModel
from greenroom.models.scripted import CallTool, Say, Wait
from greenroom.protocol.events import (
    AssistantChunk,
    Completed,
    Errored,
    Interrupted,
    SessionEvent,
    StepEnd,
    StepStart,
    TurnAnswered,
    TurnEnd,
    TurnStart,
)
from greenroom.session.persistence import PersistenceError, SessionLocked
from greenroom.session.persistence.postgres import PostgresPersistence
from greenroom.tools.typed import tool
from tests import ROOT
from tests.acp_process import acp_process
from tests.agents_helpers import assert_enclosed
from tests.pg_server import PgServer

pytestmark = pytest.mark.real_clock

LIMIT = 90.0
TTL = 2.0
STATEMENT = 1.0  # node 1's statement deadline, seconds


class Proxy:
    """Forwards loopback TCP connections to a unix socket: ``pass`` (at once), ``delay``
    (each chunk `delay` seconds late, in order) or black-holed (nothing delivered either
    way, every socket held open, until `heal`: then what was held is delivered, as TCP
    retransmits would after a partition)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.delay = 0.0
        self._open = trio.Event()
        self._open.set()

    def black_hole(self) -> None:
        self._open = trio.Event()

    def heal(self) -> None:
        self._open.set()

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_unix_socket(str(self.target))
        except OSError:
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)

    async def _pump(
        self, source: trio.abc.ReceiveStream, sink: trio.abc.SendStream, both: trio.CancelScope
    ) -> None:
        send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver, receive, sink, both)
            try:
                while chunk := await source.receive_some():
                    send.send_nowait((trio.current_time() + self.delay, chunk))
            except trio.BrokenResourceError:
                pass
            await send.aclose()

    async def _deliver(
        self,
        receive: trio.MemoryReceiveChannel[tuple[float, bytes]],
        sink: trio.abc.SendStream,
        both: trio.CancelScope,
    ) -> None:
        async for due, chunk in receive:
            await trio.sleep_until(due)
            await self._open.wait()
            try:
                await sink.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
        both.cancel()  # one side ended: the connection ends


def _via(dsn: str, port: int, **query: str) -> str:
    """`dsn` (the suite's, on a unix socket) pointed at 127.0.0.1:`port`, with `query` added."""
    parts = urllib.parse.urlsplit(dsn)
    pairs = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "host"]
    pairs += [("host", "127.0.0.1"), ("port", str(port)), *query.items()]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(pairs)))


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


async def _store(dsn: str, node: str) -> PostgresPersistence:
    # In a thread: connecting blocks, and the proxy runs on this Trio thread.
    return await trio.to_thread.run_sync(
        partial(PostgresPersistence, dsn, node=node, lease_ttl=TTL)
    )


async def _close(store: PostgresPersistence) -> None:
    await trio.to_thread.run_sync(store.close)


def _per_turn(events: list[SessionEvent], kind: type) -> dict[int, int]:
    counts: dict[int, int] = {}
    for event in events:
        if isinstance(event, kind):
            counts[event.turn] = counts.get(event.turn, 0) + 1  # type: ignore[attr-defined]
    return counts


async def test_a_black_hole_mid_turn_ends_the_turn_then_another_node_takes_over(
    pg_server: PgServer, postgres_dsn: str
) -> None:
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            proxy = Proxy(pg_server.root / ".s.PGSQL.5432")
            port = await nursery.start(proxy.serve)
            node_1 = await _store(
                _via(postgres_dsn, port, statement_timeout=f"{STATEMENT:g}s"), "node-1"
            )
            model = ScriptedModel(
                [[Say("one")], [Say("calling "), Wait(0.5), CallTool("ping")], [Say("after")]]
            )
            async with open_runtime(model=model, persistence=node_1, tools=[ping]) as rt:
                handle = await rt.agents.create(agent_id="a", session_id="s")
                agent = handle.agent
                agent.send("first")
                await agent.when_idle()
                agent.send("second")
                while not any(isinstance(e, AssistantChunk) for e in agent.session.events[-3:]):
                    await trio.sleep(0.01)
                proxy.black_hole()  # mid-step: the next write-ahead (the tool call) hangs
                cut = time.monotonic()
                await agent.when_idle()
                turn_took = time.monotonic() - cut
                began = time.monotonic()
                await handle.dispose()
                dispose_took = time.monotonic() - began
                held = list(agent.session.events)
            ends = [e for e in held if isinstance(e, TurnEnd)]
            assert [type(e.reason) for e in ends] == [Completed, Errored]
            assert turn_took < STATEMENT + 2.0, turn_took  # the statement deadline, not more
            assert dispose_took < CLOSING_GRACE, dispose_took
            assert dispose_took < 2 * STATEMENT + 1.0, dispose_took

            # Node 2, straight to the server, takes the session once node 1's lease ran out.
            node_2 = await _store(postgres_dsn, "node-2")
            refusals: list[str] = []
            while True:
                try:
                    _, stored, log = await node_2.open("s")
                    break
                except SessionLocked:
                    await trio.sleep(0.1)
                except PersistenceError as exc:  # a lock node 1 still held: lock_timeout
                    refusals.append(str(exc))
            took_over = time.monotonic() - cut
            assert took_over < TTL + STATEMENT + 3.0, took_over
            assert all("lock timeout" in refusal for refusal in refusals), refusals
            # Nothing duplicated (one start and one end per turn, seqs contiguous) and
            # nothing lost: every event node 1 wrote ahead before the black hole (turn 1,
            # and turn 2 up to its model call), then the repair's closers.
            assert [e.seq for e in stored] == list(range(len(stored)))
            assert _per_turn(stored, TurnStart) == {1: 1, 2: 1}
            assert _per_turn(stored, TurnEnd) == {1: 1, 2: 1}
            common = next(i for i, (a, b) in enumerate(zip(stored, held, strict=False)) if a != b)
            assert isinstance(stored[common - 1], StepStart)
            assert stored[common - 1].turn == 2
            assert [type(e) for e in stored[common:]] == [StepEnd, TurnEnd]
            last = stored[-1]
            assert isinstance(last, TurnEnd)
            assert isinstance(last.reason, Interrupted)
            await log.close()

            # Healed: node 1's stuck statements go through, fenced: they write nothing.
            proxy.heal()
            await trio.to_thread.run_sync(_until, lambda: not node_1.writer.stuck)
            _, again = await node_2.load("s")
            assert again == stored
            await _close(node_1)
            await _close(node_2)
            nursery.cancel_scope.cancel()


async def test_greenroom_acp_on_a_black_holed_store_answers_and_exits_in_time(
    tmp_path: Path, pg_server: PgServer, postgres_dsn: str
) -> None:
    """The issue's measurement, end to end: a black hole under ``greenroom acp``'s store.
    A cancel is answered at once and its prompt within the statement deadline (the prompt
    hung 120 s, the cancel got no answer), a later prompt fails at once naming why, and the
    end of stdin ends the process within the teardown grace (it ran on until the proxy
    healed)."""
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            proxy = Proxy(pg_server.root / ".s.PGSQL.5432")
            port = await nursery.start(proxy.serve)
            store = _via(postgres_dsn, port, statement_timeout=f"{STATEMENT:g}s")
            args = ("--store", store, "--lease-ttl", f"{TTL:g}", "--model", "scripted:0")
            async with acp_process(tmp_path / "home", *args) as node:
                session = await node.new_session(str(tmp_path))
                assert (await node.prompt(session, "before"))["result"]["stopReason"] == "end_turn"
                proxy.black_hole()
                began = time.monotonic()
                prompted = await node.request(
                    "session/prompt",
                    {"sessionId": session, "prompt": [{"type": "text", "text": "into the hole"}]},
                )
                await trio.sleep(0.3)  # its write-ahead is waiting on the hole
                cancel = await node.call("session/cancel", {"sessionId": session})
                assert cancel["result"] == {}
                assert time.monotonic() - began < 1.0  # the cancel is answered at once
                answer = await node.response(prompted)
                assert answer["result"]["stopReason"] == "cancelled", answer
                assert time.monotonic() - began < STATEMENT + 2.0  # within the deadline
                # The next prompt fails at once, naming why: the store is still not answering.
                began = time.monotonic()
                answer = await node.prompt(session, "still there?")
                assert "past its deadline (1 s)" in answer["error"]["message"], answer
                assert time.monotonic() - began < 1.0
                began = time.monotonic()
                assert await node.close() == 0
                exited = time.monotonic() - began
            assert exited < TEARDOWN_GRACE, exited
            # Another node takes the session over once the dead one's lease ran out.
            other = await _store(postgres_dsn, "node-2")
            while True:
                try:
                    _, stored, log = await other.open(session)
                    break
                except (SessionLocked, PersistenceError):
                    await trio.sleep(0.1)
            await log.close()
            assert _per_turn(stored, TurnEnd) == {1: 1}
            proxy.heal()
            await _close(other)
            nursery.cancel_scope.cancel()


async def test_a_write_that_lands_past_its_deadline_is_not_written_twice(
    pg_server: PgServer, postgres_dsn: str
) -> None:
    """A short black hole under a node that keeps its lease: the write-ahead gives up at
    the deadline and keeps its events, the held statements land when the proxy heals, and
    the next write finds them stored and writes only the rest."""
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            proxy = Proxy(pg_server.root / ".s.PGSQL.5432")
            port = await nursery.start(proxy.serve)
            dsn = _via(postgres_dsn, port, statement_timeout=f"{STATEMENT:g}s")
            node = await trio.to_thread.run_sync(
                partial(PostgresPersistence, dsn, node="node", lease_ttl=30.0)
            )
            async with open_runtime(model=ScriptedModel(), persistence=node) as rt:
                handle = await rt.agents.create(agent_id="a", session_id="s")
                agent = handle.agent
                agent.send("first")
                await agent.when_idle()
                proxy.black_hole()
                agent.send("second")
                await agent.when_idle()
                proxy.heal()
                await trio.to_thread.run_sync(_until, lambda: not node.writer.stuck)
                agent.send("third")
                await agent.when_idle()
                await handle.dispose()
                held = list(agent.session.events)
            ends = [type(e.reason) for e in held if isinstance(e, TurnEnd)]
            assert ends == [Completed, Errored, Completed]
            _, stored = await node.load("s")
            assert stored == held  # the late write landed once; the retry wrote the rest
            await _close(node)
            nursery.cancel_scope.cancel()


async def test_turns_complete_through_a_200_ms_delay_per_packet(
    pg_server: PgServer, postgres_dsn: str
) -> None:
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            proxy = Proxy(pg_server.root / ".s.PGSQL.5432")
            proxy.delay = 0.2
            port = await nursery.start(proxy.serve)
            node = await _store(_via(postgres_dsn, port), "slow")
            model = ScriptedModel([[Say("calling"), CallTool("ping")], [Say("done")]])
            async with open_runtime(model=model, persistence=node, tools=[ping]) as rt:
                handle = await rt.agents.create(agent_id="a", session_id="s")
                began = time.monotonic()
                handle.agent.send("hello")
                await handle.agent.when_idle()
                took = time.monotonic() - began
                await handle.dispose()
                held = list(handle.agent.session.events)
            assert [type(e.reason) for e in held if isinstance(e, TurnEnd)] == [Completed]
            assert took > 0.4  # it did go through the delay
            _, stored = await node.load("s")
            assert stored == held
            await _close(node)
            nursery.cancel_scope.cancel()


def assert_answers_stored(answers: list[Answer[object]], stored: list[SessionEvent]) -> None:
    """The promise of a reported turn end: every prompt answered as its turn ended has that
    turn's ``turn/end`` in the stored log, with that reason; every other answer (the store
    did not take the end) is an error naming why, and the log records it right after the
    turn's end (``turn/answered``)."""
    assert_enclosed(stored)
    ends = {e.turn: e for e in stored if isinstance(e, TurnEnd)}
    answered = {e.turn: e for e in stored if isinstance(e, TurnAnswered)}
    for answer in answers:
        assert answer.turn is not None, answer
        assert answer.turn in ends, (answer, "its end is not stored")
        end = ends[answer.turn]
        told = answered.get(answer.turn)
        if told is None:
            assert answer.stop_reason == type(end.reason).__struct_config__.tag, (answer, end)
        else:
            assert stored[end.seq + 1] is told  # right after the end it stands beside
            assert told.reason == Errored(step=0, message=answer.reason or "", code="persistence")
            assert answer.stop_reason == "error"
            assert "the turn's end was not stored" in (answer.reason or "")


@pytest.mark.parametrize("sync", ["turn", "always", "os"])
async def test_a_turn_end_the_store_did_not_take_is_answered_error_and_logged_later(
    pg_server: PgServer, postgres_dsn: str, sync: str
) -> None:
    """A black hole between a turn's write-ahead and its closing flush: its prompt is
    answered an error naming the store's deadline (it was answered as the turn ended, with
    no turn end in the store), and once the store is back, its end and what was answered
    are both written."""
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            proxy = Proxy(pg_server.root / ".s.PGSQL.5432")
            port = await nursery.start(proxy.serve)
            dsn = _via(postgres_dsn, port, statement_timeout=f"{STATEMENT:g}s")
            node = await trio.to_thread.run_sync(
                partial(PostgresPersistence, dsn, node="node", lease_ttl=30.0, sync=sync)  # type: ignore[arg-type]
            )
            model = ScriptedModel([[Say("one")], [Say("cut "), Wait(0.5), Say("off")], [Say("3")]])
            async with open_runtime(model=model, persistence=node) as rt:
                handle = await rt.agents.create(agent_id="a", session_id="s")
                agent = handle.agent
                answers = [await agent.run("first")]
                prompt = agent.send("second")
                while not isinstance(agent.session.events[-1], AssistantChunk):
                    await trio.sleep(0.01)
                proxy.black_hole()  # written ahead already: the closing flush hangs
                answers.append(await prompt)
                proxy.heal()
                await trio.to_thread.run_sync(_until, lambda: not node.writer.stuck)
                answers.append(await agent.run("third"))
                await handle.dispose()
                held = list(agent.session.events)
            _, stored = await node.load("s")
            await _close(node)
            nursery.cancel_scope.cancel()
    assert [a.stop_reason for a in answers] == ["completed", "error", "completed"]
    assert f"past its deadline ({STATEMENT:g} s)" in (answers[1].reason or "") or (
        f"no answer within {STATEMENT:g} s" in (answers[1].reason or "")
    ), answers[1]
    assert stored == held
    assert [type(e.reason) for e in stored if isinstance(e, TurnEnd)] == [Completed] * 3
    assert_answers_stored(answers, stored)


async def test_greenroom_acp_never_answers_end_turn_for_a_turn_the_store_did_not_take(
    tmp_path: Path, pg_server: PgServer, postgres_dsn: str
) -> None:
    """The issue's measurement: a black hole one step into a prompt under ``greenroom acp
    --sync always``. The prompt was answered ``end_turn`` while the store had none of its
    turn; now it is a JSON-RPC error naming the store, and once the store is back the next
    holder's log has the turn's end and what was answered."""
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            proxy = Proxy(pg_server.root / ".s.PGSQL.5432")
            port = await nursery.start(proxy.serve)
            store = _via(postgres_dsn, port, statement_timeout=f"{STATEMENT:g}s")
            args = ("--store", store, "--sync", "always", "--model", "scripted:0.3")
            async with acp_process(tmp_path / "home", *args) as node:
                session = await node.new_session(str(tmp_path))
                prompted = await node.request(
                    "session/prompt",
                    {"sessionId": session, "prompt": [{"type": "text", "text": "one two three"}]},
                )
                await node.until(
                    lambda frame: (
                        frame.get("method") == "session/update"
                        and frame["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                    )
                )
                proxy.black_hole()  # its write-ahead is in; its closing flush is not
                answer = await node.response(prompted)
                assert "result" not in answer, answer
                assert "the turn's end was not stored" in answer["error"]["message"], answer
                proxy.heal()
                await trio.sleep(STATEMENT)  # the held statement lands at once: unstuck
                assert (await node.prompt(session, "again"))["result"]["stopReason"] == "end_turn"
                assert await node.close() == 0
            other = await _store(postgres_dsn, "node-2")
            _, stored = await other.load(session)
            await _close(other)
            nursery.cancel_scope.cancel()
    ends = [e for e in stored if isinstance(e, TurnEnd)]
    assert [(e.turn, type(e.reason)) for e in ends] == [(1, Completed), (2, Completed)]
    told = stored[ends[0].seq + 1]
    assert isinstance(told, TurnAnswered)
    assert told.turn == 1
    assert isinstance(told.reason, Errored)
    assert told.reason.message in answer["error"]["message"]


@pytest.mark.parametrize("sync", ["turn", "always", "os"])
def test_a_full_disk_at_the_closing_flush_answers_error_and_the_end_lands_later(
    tmp_path: Path, sync: str
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.session.test_chaos import disk_full_at_the_end;"
            f" disk_full_at_the_end({str(tmp_path)!r}, {sync!r})",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["stop_reasons"] == ["completed", "error", "completed"]
    path = str(tmp_path / "sessions" / "s.jsonl")
    assert f"cannot write {path}: [Errno 27] File too large" in seen["reason"]
    assert seen["stored"] == seen["held"]
    assert seen["promise"] == "kept"


def disk_full_at_the_end(root: str, sync: str) -> None:
    """The child: the file may not grow between a turn's write-ahead and its closing flush."""
    import resource
    import signal

    from greenroom.session.persistence import JsonlPersistence

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    store = JsonlPersistence(Path(root) / "sessions", sync=sync)  # type: ignore[arg-type]
    model = ScriptedModel([[Say("one")], [Say("cut "), Wait(0.2), Say("x" * 4000)], [Say("3")]])

    async def run() -> dict[str, object]:
        async with open_runtime(model=model, persistence=store) as rt:
            handle = await rt.agents.create(agent_id="a", session_id="s")
            agent = handle.agent
            answers = [await agent.run("first")]
            prompt = agent.send("second")
            while not isinstance(agent.session.events[-1], AssistantChunk):
                await trio.sleep(0.01)
            size = os.path.getsize(store.path("s"))  # its write-ahead is in
            resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, resource.RLIM_INFINITY))
            answers.append(await prompt)
            resource.setrlimit(
                resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
            answers.append(await agent.run("third"))
            await handle.dispose()
            held = [json.loads(line) for line in _encode(agent.session.events)]
        _, stored = await store.load("s")
        assert_answers_stored(answers, list(stored))
        return {
            "stop_reasons": [a.stop_reason for a in answers],
            "reason": answers[1].reason,
            "held": held,
            "stored": [json.loads(line) for line in _encode(stored)],
            "promise": "kept",
        }

    print(json.dumps(trio.run(run)))


def _until(check: object) -> None:
    deadline = time.monotonic() + 30
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.02)


# -- a full disk ------------------------------------------------------------------------------


def test_a_full_disk_fails_the_write_naming_the_file_and_loses_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from tests.session.test_chaos import disk_full; disk_full({str(tmp_path)!r})",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    path = str(tmp_path / "sessions" / "s.jsonl")
    # The failing write named the file and the limit's error.
    assert f"cannot write {path}: [Errno 27] File too large" in seen["error"]
    # The full-disk turn ended in error; once space returned, the next turn worked.
    assert seen["ends"] == ["completed", "error", "completed"]
    # Every event the session had is on disk, once, in order.
    assert seen["stored"] == seen["held"]


def disk_full(root: str) -> None:
    """The child: a session on JSONL whose file may not grow while the limit is low."""
    import resource
    import signal

    from greenroom.session.persistence import JsonlPersistence

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    store = JsonlPersistence(Path(root) / "sessions")
    errors: list[str] = []

    async def run() -> dict[str, object]:
        async with open_runtime(model=ScriptedModel(), persistence=store) as rt:
            rt.hooks.on(AGENT_ERROR, lambda agent, turn, step, error: errors.append(str(error)))
            handle = await rt.agents.create(agent_id="a", session_id="s")
            agent = handle.agent
            agent.send("before")
            await agent.when_idle()
            size = os.path.getsize(store.path("s"))
            resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, resource.RLIM_INFINITY))
            agent.send("full " + "x" * 4000)
            await agent.when_idle()
            resource.setrlimit(
                resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
            agent.send("after")
            await agent.when_idle()
            await handle.dispose()
            held = [json.loads(line) for line in _encode(agent.session.events)]
        _, stored = await store.load("s")
        ends = [e.reason for e in stored if isinstance(e, TurnEnd)]
        turn_errors = [e.message for e in ends if isinstance(e, Errored)]
        return {
            "error": " ".join(errors + turn_errors),
            "ends": [type(e).__name__.lower().replace("errored", "error") for e in ends],
            "held": held,
            "stored": [json.loads(line) for line in _encode(stored)],
        }

    print(json.dumps(trio.run(run)))


def _encode(events: list[SessionEvent]) -> list[bytes]:
    return [_encoder.encode(event) for event in events]


_encoder = msgspec.json.Encoder()
