"""`when_idle` parks its awaiters itself: any number of them, any number of times, cancellable."""

from __future__ import annotations

import trio

from greenroom.models import Say, ScriptedModel, Wait
from greenroom.runtime import open_runtime


async def test_two_tasks_await_one_wait_and_both_wake_at_the_turns_end() -> None:
    async with open_runtime(model=ScriptedModel([[Wait(1), Say("done")]])) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        agent.send("go")
        idle = agent.when_idle()
        woke: list[float] = []

        async def wait() -> None:
            await idle
            woke.append(trio.current_time())

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            nursery.start_soon(wait)
        assert woke == [start + 1, start + 1]
        assert agent.status == "idle"
        await idle  # released: at once
        assert trio.current_time() == start + 1


async def test_a_cancelled_awaiter_leaves_the_others_waiting() -> None:
    async with open_runtime(model=ScriptedModel([[Wait(2), Say("done")]])) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        agent.send("go")
        idle = agent.when_idle()
        start = trio.current_time()
        with trio.move_on_after(1) as gave_up:
            await idle
        assert gave_up.cancelled_caught
        assert agent.status == "running"
        await idle
        assert trio.current_time() == start + 2
        status: str = agent.status  # read afresh: mypy narrowed it to "running" above
        assert status == "idle"
