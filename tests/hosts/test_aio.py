"""greenroom from asyncio (`greenroom.aio`): real asyncio programs under ``asyncio.run`` on the
real clock, each bounded by ``asyncio.timeout``, Trio running as the loop's guest."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from greenroom import AgentSpec, Answer, run_sync
from greenroom.aio import AioRuntime, open_runtime
from greenroom.models import Hang, Say, ScriptedModel, Wait
from greenroom.protocol.events import Disposed, TurnEnd
from greenroom.session.persistence import JsonlPersistence

T = TypeVar("T")

#: Real seconds one asyncio program may take.
LIMIT = 30


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`main` under ``asyncio.run``, bounded."""

    async def bounded() -> T:
        async with asyncio.timeout(LIMIT):
            return await main()

    return asyncio.run(bounded())


def stored_ends(root: Path, session: str) -> list[object]:
    _, events = trio.run(JsonlPersistence(root).load, session)
    return [e.reason for e in events if isinstance(e, TurnEnd)]


def test_a_program_cancels_an_awaiting_task_then_the_agent_and_goes_on() -> None:
    async def main() -> tuple[bool, Answer[Any], Answer[Any]]:
        model = ScriptedModel([[Say("working"), Hang()]], delay=0)
        async with open_runtime(model=model) as rt:
            agent = (await rt.start(AgentSpec(name="a"), "s")).agent
            prompt = agent.send("hang")
            async for text in prompt.text():  # the turn is under way
                assert text == "working"
                break
            waiting = asyncio.create_task(agent.run("queued behind it"))
            await asyncio.sleep(0.05)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            still_running = agent.status == "running"  # the cancel stopped the waiting only
            agent.cancel("enough")
            stopped = await prompt
            after = await agent.run("and after")
            return still_running, stopped, after

    still_running, stopped, after = run(main)
    assert still_running
    assert (stopped.stop_reason, stopped.reason) == ("aborted", "enough")
    assert (after.stop_reason, after.text) == ("completed", "and after")


def test_the_verbs_are_synchronous_and_cross_nothing() -> None:
    async def main() -> None:
        model = ScriptedModel([[Say("a"), Wait(1)], [Say("b")]], delay=0)
        async with open_runtime(model=model) as rt:
            handle = await rt.start(AgentSpec(name="a"), "s")
            agent = handle.agent
            assert (handle.id, handle.session_id, agent.status) == ("a:s", "s", "idle")
            first = agent.send("go")
            reader = first.events()  # from the send on: no await between
            queued = agent.send("queued")  # (one burst with "go", until withdrawn)
            assert agent.withdraw(queued.id)
            assert await queued == Answer(stop_reason="withdrawn")
            assert type(await anext(reader)).__name__ == "AssistantChunk"
            steered = agent.steer("also this")
            answer = await first
            assert (await steered) is answer
            assert answer.text == "b"
            idle = agent.when_idle()  # registered now
            assert agent.inject("a note").startswith("msg-")
            await idle
            assert [type(e).__name__ for e in agent.history()][-2:] == [
                "AssistantEntry",
                "ContextEntry",
            ]
            assert type((await rt.history("s"))[-1]).__name__ == "ContextEntry"
            await handle.dispose()

    run(main)


def test_a_cancelled_reader_loses_nothing() -> None:
    async def main() -> list[str]:
        model = ScriptedModel([[Say("a"), Wait(1), Say("b")]], delay=0)
        async with open_runtime(model=model) as rt:
            agent = (await rt.start(AgentSpec(name="a"))).agent
            texts = agent.send("go").text()
            seen = [await anext(texts)]
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):  # the wait for "b" cancelled
                    await anext(texts)
            seen += [text async for text in texts]
            return seen

    assert run(main) == ["a", "b"]


def test_runtimes_on_one_loop_share_one_trio_run_that_ends_with_the_last() -> None:
    async def main() -> tuple[bool, bool, list[str]]:
        async with open_runtime(name="one") as one, open_runtime(name="two") as two:
            shared = trio.lowlevel.in_trio_run()
            answers = await asyncio.gather(
                *(
                    rt.start(AgentSpec(name=f"a{n}", model="scripted"), f"s{n}")
                    for n, rt in enumerate((one, two))
                )
            )
            texts = [(await h.agent.run(f"hi {h.id}")).text for h in answers]
        ended = not trio.lowlevel.in_trio_run()
        async with open_runtime(name="three") as three:  # a run of its own, later
            texts.append((await (await three.start(AgentSpec(name="b"))).agent.run("x")).text)
        return shared, ended, texts

    shared, ended, texts = run(main)
    assert shared
    assert ended
    assert texts == ["hi a0:s0", "hi a1:s1", "x"]


def test_leaving_the_block_is_not_cut_short_by_a_cancel(tmp_path: Path) -> None:
    async def holder(opened: asyncio.Future[None]) -> None:
        async with open_runtime(persistence=JsonlPersistence(tmp_path)) as rt:
            spec = AgentSpec(name="a", model=ScriptedModel([[Hang()]]))
            (await rt.start(spec, "s")).agent.send("hang")
            opened.set_result(None)
            await asyncio.sleep(3600)

    async def main() -> str:
        async with open_runtime(name="keeps the run up"):
            opened = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(holder(opened))
            await opened
            task.cancel()
            for _ in range(3):  # the task is closing its runtime: cancel it again, and again
                await asyncio.sleep(0)
                task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return (tmp_path / "s.jsonl").read_text().splitlines()[-1]  # as the task ended

    last = run(main)
    assert '"type":"turn/end"' in last
    assert '"disposed"' in last
    assert stored_ends(tmp_path, "s") == [Disposed()]


def test_a_loop_shut_down_with_a_runtime_open_disposes_its_agents_first(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            textwrap.dedent(
                """
                import asyncio, sys
                import greenroom, greenroom.aio
                from greenroom.models import Hang, ScriptedModel
                from greenroom.session.persistence import JsonlPersistence

                async def main():
                    block = greenroom.aio.open_runtime(persistence=JsonlPersistence(sys.argv[1]))
                    rt = await block.__aenter__()  # and never left
                    spec = greenroom.AgentSpec(name="a", model=ScriptedModel([[Hang()]]))
                    (await rt.start(spec, "s")).agent.send("hang")
                    await asyncio.sleep(0.1)

                asyncio.run(main())
                print("exited")
                """
            ),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=LIMIT * 2,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exited"]
    assert stored_ends(tmp_path, "s") == [Disposed()]


def test_a_cancelled_start_leaves_nothing_started() -> None:
    """Cancel the start after each number of loop passes in turn: every cancelled one leaves
    the session free (a start that finished as its caller was cancelled is undone)."""

    async def main() -> tuple[int, int]:
        cancelled = finished = 0
        async with open_runtime() as rt:
            for passes in range(40):
                start = asyncio.create_task(rt.start(AgentSpec(name="a"), "s"))
                for _ in range(passes):
                    await asyncio.sleep(0)
                start.cancel()
                try:
                    handle = await start
                except asyncio.CancelledError:
                    cancelled += 1
                else:
                    finished += 1
                    await handle.dispose()
                again = await rt.start(AgentSpec(name="a"), "s")  # free: nothing was left
                await again.dispose()
        return cancelled, finished

    cancelled, finished = run(main)
    assert cancelled > 0  # both sides of the window were reached
    assert finished > 0


def test_a_closed_runtime_and_another_thread_are_refused_naming_it() -> None:
    async def main() -> None:
        async with open_runtime(name="mine") as rt:
            agent = (await rt.start(AgentSpec(name="a"))).agent
            prompt = agent.send("hi")
            thread_error = await asyncio.to_thread(_error_of, lambda: agent.send("x"))
            assert "used from another thread than its event loop's" in thread_error
        assert (await prompt).stop_reason in {"completed", "disposed"}
        for call in (lambda: agent.send("again"), agent.cancel, prompt.cancel):
            with pytest.raises(RuntimeError, match=r"greenroom\.aio runtime 'mine' is closed"):
                call()
        with pytest.raises(RuntimeError, match=r"greenroom\.aio runtime 'mine' is closed"):
            await rt.start(AgentSpec(name="b"))

    run(main)


def _error_of(call: Callable[[], object]) -> str:
    try:
        call()
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_errors_come_out_as_themselves_and_run_sync_says_to_await() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="give open_runtime either model= or"):
            async with open_runtime(model=ScriptedModel(), models={}):
                pass
        async with open_runtime() as rt:
            with pytest.raises(ValueError, match="AgentSpec 'a': model"):
                await rt.start(AgentSpec(name="a", model="nonsense:model"))
            with pytest.raises(RuntimeError, match=r"await agent\.run\(\.\.\.\) there instead"):
                run_sync(AgentSpec(name="a"), "hi")
            assert isinstance(rt, AioRuntime)

    run(main)


def test_prompt_cancel_stops_only_its_own_turn() -> None:
    async def main() -> tuple[Answer[Any], Answer[Any]]:
        model = ScriptedModel([[Say("x"), Hang()]], delay=0)
        async with open_runtime(model=model) as rt:
            agent = (await rt.start(AgentSpec(name="a"))).agent
            running = agent.send("one")
            async for _ in running.text():
                break
            queued = agent.send("two")
            running.cancel("the client left")
            return await running, await queued

    running, queued = run(main)
    assert (running.stop_reason, running.reason) == ("aborted", "the client left")
    assert (queued.stop_reason, queued.text) == ("completed", "two")
