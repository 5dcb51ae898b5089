"""greenroom from synchronous code: `run_sync` and `blocking_runtime`, in this process's own
threads and in plain scripts run as real interpreters (`python -c`), on the real clock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

import greenroom.blocking as blocking
from greenroom import AgentSpec, Answer, blocking_runtime, run_sync, tool
from greenroom.models import CallTool, Hang, Say, ScriptedModel, Wait
from greenroom.protocol.events import Disposed, TurnEnd
from greenroom.session.persistence import JsonlPersistence

#: Real seconds a script may take (a loaded 2-core machine; each imports greenroom).
SCRIPT_LIMIT = 60


def script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`code` run by a fresh interpreter as ``python -W error -c``: any warning fails it."""
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=SCRIPT_LIMIT,
        check=False,
    )


def stored_ends(root: Path, session: str) -> list[object]:
    _, events = trio.run(JsonlPersistence(root).load, session)
    return [e.reason for e in events if isinstance(e, TurnEnd)]


def test_run_sync_answers_and_a_stored_session_goes_on_where_it_stopped(tmp_path: Path) -> None:
    spec = AgentSpec(name="echo", model="scripted")
    store = JsonlPersistence(tmp_path)
    first = run_sync(spec, "hello there", session="chat", persistence=store)
    assert (first.stop_reason, first.turn, first.text) == ("completed", 1, "hello there")
    again = run_sync(spec, "and again", session="chat", persistence=store)
    assert (again.turn, again.text) == (2, "and again")


def test_a_plain_script_keeps_agents_between_calls_and_its_exit_ends_their_turns(
    tmp_path: Path,
) -> None:
    done = script(
        """
        import sys
        import greenroom
        from greenroom.models import Hang, Say, ScriptedModel
        from greenroom.session.persistence import JsonlPersistence

        rt = greenroom.blocking_runtime(persistence=JsonlPersistence(sys.argv[1]))
        model = ScriptedModel([[Say("one")], [Say("two")], [Say("three"), Hang()]])
        agent = rt.start(greenroom.AgentSpec(name="a", model=model), "s").agent
        print(agent.run("first").text, agent.run("second").text)
        print(next(agent.send("this one hangs").text()), agent.status)  # from the send on
        # no close: the interpreter's exit closes the runtime
        """,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["one", "two", "three", "running"]
    assert stored_ends(tmp_path, "s")[-1] == Disposed()


def test_the_agents_verbs_are_plain_calls() -> None:
    model = ScriptedModel([[Say("first"), Wait(1)], [Say("b")], [Say("x"), Hang()]], delay=0)
    with blocking_runtime() as rt:
        handle = rt.start(AgentSpec(name="a", model=model), "s")
        agent = handle.agent
        assert (handle.id, handle.session_id, agent.status) == ("a:s", "s", "idle")
        running = agent.send("go")
        assert next(running.text()) == "first"  # the turn runs (for 1 s more)
        queued = agent.send("queued")
        steered = agent.steer("also this")
        assert agent.withdraw(queued.id)
        assert queued.answer() == Answer(stop_reason="withdrawn")
        assert running.answer() is steered.answer()  # the steering joined its turn
        hung = agent.send("hang")
        deltas = hung.text()
        assert next(deltas) == "x"
        hung.cancel("the caller left")
        assert list(deltas) == []
        assert (hung.answer().stop_reason, hung.answer().reason) == ("aborted", "the caller left")
        agent.when_idle()
        assert agent.status == "idle"
        echoed = agent.send("three words here")
        kinds = [type(event).__name__ for event in echoed.events()]
        assert kinds == ["AssistantChunk"] * 3 + ["StepEnd", "TurnEnd"]
        assert [type(entry).__name__ for entry in agent.history()][-2:] == [
            "UserEntry",
            "AssistantEntry",
        ]
        assert type(rt.history("s")[-1]).__name__ == "AssistantEntry"  # the live session's
        handle.dispose()
        with pytest.raises(RuntimeError, match="no session persistence"):
            rt.history("s")  # gone with its agent: the store is asked, and there is none


def test_an_answer_waited_past_its_timeout_leaves_the_prompt_to_run() -> None:
    with blocking_runtime(model=ScriptedModel([[Say("x"), Hang()]])) as rt:
        agent = rt.start(AgentSpec(name="a"), "s").agent
        prompt = agent.send("hang")
        with pytest.raises(TimeoutError):
            prompt.answer(timeout=0.1)
        with pytest.raises(TimeoutError):
            agent.when_idle(timeout=0.1)
        assert agent.status == "running"
        agent.cancel("enough")
        assert prompt.answer().stop_reason == "aborted"


def interrupt_once_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next call queued for the Trio thread is interrupted just after it is queued (the
    window a signal can hit before its caller waits); `monkeypatch.undo` ends it."""
    entered = blocking._Portal.enter
    interrupts = [KeyboardInterrupt()]

    def enter_then_interrupted(portal: blocking._Portal, callback: object) -> None:
        entered(portal, callback)  # type: ignore[arg-type]
        if interrupts:
            raise interrupts.pop()

    monkeypatch.setattr(blocking._Portal, "enter", enter_then_interrupted)


def test_an_interrupt_while_a_start_is_queued_leaves_nothing_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interrupt lands just after the start was handed to the Trio thread, before the
    caller waits for it (the window a signal can hit): the start never runs, or runs and is
    cancelled or undone; either way nothing is left and the next start of it works."""
    with blocking_runtime(model=ScriptedModel(delay=0)) as rt:
        interrupt_once_queued(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            rt.start(AgentSpec(name="a"), "s")
        monkeypatch.undo()
        handle = rt.start(AgentSpec(name="a"), "s")  # not "already registered"
        assert handle.agent.run("after").turn == 1


def test_a_read_interrupted_while_it_is_queued_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interrupt lands just after a read was handed to the Trio thread: the next
    ``next()`` picks that read up, so no text is lost nor read twice."""
    model = ScriptedModel([[Say("a"), Wait(0.2), Say("b"), Wait(0.2), Say("c")]], delay=0)
    with blocking_runtime(model=model) as rt:
        texts = rt.start(AgentSpec(name="a")).agent.send("go").text()
        assert next(texts) == "a"
        interrupt_once_queued(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            next(texts)
        monkeypatch.undo()
        assert list(texts) == ["b", "c"]


def test_an_interrupted_start_leaves_nothing_started(tmp_path: Path) -> None:
    done = script(
        """
        import signal, sys, threading
        import trio
        import greenroom
        from greenroom.session.persistence import JsonlPersistence

        class SlowFirstCreate(JsonlPersistence):
            slow = True

            async def create(self, header):  # the session's id is reserved meanwhile
                if self.slow:
                    self.slow = False
                    await trio.sleep(30)
                return await super().create(header)

        rt = greenroom.blocking_runtime(persistence=SlowFirstCreate(sys.argv[1]))
        main = threading.main_thread().ident
        threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT)).start()
        try:
            rt.start(greenroom.AgentSpec(name="a"), "s")
        except KeyboardInterrupt:
            print("interrupted")
        print(rt.start(greenroom.AgentSpec(name="a"), "s").agent.run("after").turn)
        rt.close()
        """,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "1"]


def test_in_a_notebook_cell_it_runs_under_the_cells_asyncio_loop() -> None:
    done = script(
        """
        import asyncio, signal
        import greenroom

        def cell():  # a cell's code runs inside the kernel's running asyncio loop
            spec = greenroom.AgentSpec(name="nb", model="scripted")
            print(greenroom.run_sync(spec, "from a cell").text)
            with greenroom.blocking_runtime() as rt:
                print(rt.start(spec).agent.run("and again").text)

        async def kernel():
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, print)
            cell()

        asyncio.run(kernel())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["from a cell", "and again"]


async def test_run_sync_inside_a_trio_run_says_to_await_run() -> None:
    with pytest.raises(RuntimeError, match=r"await agent\.run\(\.\.\.\) there instead"):
        run_sync(AgentSpec(name="a"), "hi")


def test_a_closed_runtime_refuses_every_call_naming_it() -> None:
    rt = blocking_runtime(name="mine")
    agent = rt.start(AgentSpec(name="a", model="scripted")).agent
    prompt = agent.send("hi")
    rt.close()
    rt.close()  # idempotent
    assert prompt.answer().stop_reason in {"completed", "disposed"}
    for call in (
        lambda: agent.send("again"),
        lambda: agent.cancel(),
        lambda: prompt.cancel(),
        lambda: rt.start(AgentSpec(name="b")),
    ):
        with pytest.raises(RuntimeError, match="blocking runtime 'mine' is closed"):
            call()


def test_a_tool_calling_back_into_its_runtime_gets_an_error_not_a_deadlock() -> None:
    holder: list[object] = []

    @tool
    def status_of_myself() -> str:
        """Read the calling agent's status through the blocking runtime."""
        return str(holder[0].status)  # type: ignore[attr-defined]

    model = ScriptedModel([[CallTool("status_of_myself", {})], [Say("done")]])
    spec = AgentSpec(name="a", model=model, tools=[status_of_myself])
    with blocking_runtime() as rt:
        agent = rt.start(spec).agent
        holder.append(agent)
        answer = agent.run("go")
    (call,) = answer.tool_calls
    assert call.is_error
    assert "from inside a Trio run" in call.result


def test_a_reader_interrupted_mid_wait_loses_nothing() -> None:
    done = script(
        """
        import signal, threading
        import greenroom
        from greenroom.models import Say, ScriptedModel, Wait

        # Margins for a loaded machine: the reader is parked within 1 s, "b" comes 3 s later.
        model = ScriptedModel([[Say("a"), Wait(4), Say("b")]], delay=0)
        with greenroom.blocking_runtime(model=model) as rt:
            events = rt.start(greenroom.AgentSpec(name="a")).agent.send("go").text()
            print(next(events))
            main = threading.main_thread().ident
            threading.Timer(1.0, signal.pthread_kill, (main, signal.SIGINT)).start()
            try:
                next(events)  # waits for "b": interrupted
            except KeyboardInterrupt:
                print("interrupted")
            print(*events)  # "b", read by the wait the interrupt left, then the end
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["a", "interrupted", "b"]
