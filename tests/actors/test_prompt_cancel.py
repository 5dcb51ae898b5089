"""`prompt.cancel(reason)`: a queued prompt is withdrawn, a running one has its turn cancelled,
and nothing else the agent holds is touched."""

from __future__ import annotations

from pathlib import Path

import trio

from greenroom import Answer, open_runtime
from greenroom.models import Hang, Say, ScriptedModel, Wait
from greenroom.protocol.events import Aborted, Completed, SteeringMessage, TurnEnd, UserMessage
from greenroom.session.persistence import JsonlPersistence
from tests.actors.test_durable_turns import Hangs, prompt_turn, store_cut
from tests.agents_helpers import assert_enclosed, new_agent, turn_ends


async def test_a_queued_prompt_is_withdrawn_with_the_reason_and_the_rest_runs() -> None:
    async with open_runtime(model=ScriptedModel([[Say("first"), Wait(2)]], delay=0)) as rt:
        agent = await new_agent(rt)
        running = agent.send("one")
        await trio.sleep(1)
        dropped, kept = agent.send("two"), agent.send("three")
        dropped.cancel("not this one")
        assert dropped.settled
        assert await dropped == Answer(stop_reason="withdrawn", reason="not this one")
        assert (await running).stop_reason == "completed"
        assert (await kept).text == "three"
        events = agent.session.events
    assert [e.content for e in events if isinstance(e, UserMessage)] == ["one", "three"]


async def test_a_running_prompt_has_its_turn_cancelled_and_the_queue_behind_it_runs() -> None:
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]], delay=0)) as rt:
        agent = await new_agent(rt)
        running = agent.send("one")
        await trio.sleep(1)
        queued = agent.send("two")
        running.cancel("the client left")
        answer = await running
        assert (answer.stop_reason, answer.reason, answer.turn) == (
            "aborted",
            "the client left",
            1,
        )
        assert (await queued).stop_reason == "completed"
        assert (await queued).text == "two"
        assert_enclosed(agent.session.events)
        assert turn_ends(agent.session.events) == [
            (1, Aborted(reason="the client left")),
            (2, Completed()),
        ]


async def test_a_prompt_sharing_its_turn_cancels_the_whole_turn() -> None:
    async with open_runtime(model=ScriptedModel([[Say("x"), Hang()]], delay=0)) as rt:
        agent = await new_agent(rt)
        first, second = agent.send("one"), agent.send("two")  # one burst: one turn
        await trio.sleep(1)
        second.cancel()
        assert (await first) is (await second)
        assert ((await first).stop_reason, (await first).reason) == ("aborted", "cancelled")


async def test_a_steered_prompt_no_step_took_yet_is_withdrawn_and_never_logged() -> None:
    model = ScriptedModel([[Say("a"), Wait(2)], [Say("b")]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        sent = agent.send("go")
        await trio.sleep(1)
        steered = agent.steer("also this")
        steered.cancel("changed my mind")
        assert await steered == Answer(stop_reason="withdrawn", reason="changed my mind")
        answer = await sent
        assert answer.stop_reason == "completed"
        assert not [e for e in agent.session.events if isinstance(e, SteeringMessage)]


async def test_one_sent_while_idle_is_withdrawn_before_its_turn_and_idle_is_released() -> None:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = await new_agent(rt)
        prompt = agent.send("never mind")
        idle = agent.when_idle()
        prompt.cancel()  # the agent's task has not run yet: still queued
        with trio.fail_after(1):
            await idle
        assert (await prompt).stop_reason == "withdrawn"
        assert agent.session.last_turn == 0
        assert (await agent.run("next")).text == "next"


async def test_cancelling_a_settled_prompt_touches_nothing() -> None:
    async with open_runtime(model=ScriptedModel([[Say("done")], [Say("x"), Wait(2)]])) as rt:
        agent = await new_agent(rt)
        done = agent.send("one")
        answer = await done
        running = agent.send("two")
        await trio.sleep(1)
        done.cancel("too late")
        assert (await done) is answer
        assert (await running).stop_reason == "completed"


async def test_the_carried_on_prompt_of_a_resumed_session_cancels_its_turn(
    tmp_path: Path,
) -> None:
    store = JsonlPersistence(tmp_path / "sessions")
    await store_cut(store, prompt_turn())
    async with open_runtime(model=Hangs(), persistence=store) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
        assert handle.resumed is not None
        await trio.sleep(1)
        handle.resumed.cancel("enough")
        answer = await handle.resumed
        assert (answer.stop_reason, answer.reason) == ("aborted", "enough")
        await handle.dispose()
    _, events = await store.load("s")
    assert [e.reason for e in events if isinstance(e, TurnEnd)] == [Aborted(reason="enough")]
