"""The turns' scope: one `CancelScope` an agent's turns run in until a cancel uses it up.

What a turn's own scope used to guarantee still holds with one scope shared by
many turns: a cancel ends only the turn it cuts, the turns after it run and can
be cancelled again, an error raised beside the cancel fails the turn as before
(it does not escape the agent), and disposal ends the turn in flight.
"""

from __future__ import annotations

import msgspec
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation
from greenroom.models import CallTool, Hang, Say, ScriptedModel
from greenroom.protocol.events import COMPLETED, DISPOSED, Aborted, Errored, TurnEnd
from greenroom.tools import Tool


class _NoArgs(msgspec.Struct):
    pass


def _ends(events: object) -> list[object]:
    return [e.reason for e in events if isinstance(e, TurnEnd)]  # type: ignore[attr-defined]


async def test_each_cancel_ends_only_the_turn_it_cuts_and_the_next_turns_run() -> None:
    # Three hung turns, each cancelled, each followed by a turn that completes: every
    # cancel uses up a scope, and the next wake-up has a fresh one.
    scripts = [s for _ in range(3) for s in ([Hang()], [Say("after")])]
    async with open_runtime(model=ScriptedModel(scripts, delay=0)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        for round_ in range(3):
            agent.send("hang")
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "running"
            agent.cancel(f"stop {round_}")
            answer = await agent.run("again")
            assert answer.text == "after"
        ends = _ends(agent.session.events)
        assert ends == [
            Aborted(f"stop {n}") if i % 2 == 0 else COMPLETED for n in range(3) for i in (0, 1)
        ]
        assert agent.status == "idle"


async def test_an_error_raised_beside_the_cancel_fails_the_turn_and_the_agent_goes_on() -> None:
    # The tool's nursery raises the cancel and, from its child, an error: one group.
    async def trap(_args: _NoArgs, _call: ToolInvocation) -> str:
        async def fails_when_cancelled() -> None:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                raise ValueError("cleanup failed") from None

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fails_when_cancelled)
            await trio.sleep_forever()
        return "never"

    model = ScriptedModel([[CallTool("trap", {})], [Say("fine")]], delay=0)
    async with open_runtime(model=model, tools=[Tool("trap", "traps", _NoArgs, trap)]) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        assert agent.status == "running"
        agent.cancel("stop")
        with trio.fail_after(5):
            await agent.when_idle()
        ends = _ends(agent.session.events)
        assert len(ends) == 1
        assert isinstance(ends[0], Errored)
        assert ends[0].step == 1  # the group's message, as when the turn had its own scope
        assert (await agent.run("next")).text == "fine"
        assert agent.status == "idle"


async def test_dispose_ends_the_turn_in_flight_after_turns_shared_the_scope() -> None:
    async with open_runtime(model=ScriptedModel([[Say("one")], [Hang()]], delay=0)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        assert (await agent.run("first")).text == "one"
        agent.send("hang")
        await trio.testing.wait_all_tasks_blocked()
        assert agent.status == "running"
        with trio.fail_after(5):
            await handle.dispose()
        assert _ends(agent.session.events) == [COMPLETED, DISPOSED]
        assert agent.status == "disposed"
