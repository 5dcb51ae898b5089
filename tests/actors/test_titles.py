"""Titles a model writes (`greenroom.actors.titles`): when the title turn runs, what it
counts, what a model's answer makes a title."""

from __future__ import annotations

import pytest

from greenroom import AgentOptions, Limits, open_runtime
from greenroom.actors.titles import written_title
from greenroom.models import Fail, Say, ScriptedModel, Tokens
from greenroom.protocol.events import (
    ConfigSet,
    Errored,
    SessionEvent,
    StepStart,
    TitleTrigger,
    TurnEnd,
    TurnStart,
)
from greenroom.session.transcript import transcript


def _title_turns(events: list[SessionEvent]) -> list[TurnStart]:
    return [e for e in events if type(e) is TurnStart and type(e.trigger) is TitleTrigger]


async def test_the_title_turn_counts_against_the_session_limits() -> None:
    model = ScriptedModel([[Say("fine"), Tokens(10, 1)], [Say("Named"), Tokens(5, 1)]], delay=0)
    async with open_runtime(model=model) as rt:
        options = AgentOptions(titles="model", limits=Limits(session_requests=2))
        handle = await rt.agents.create(agent_id="a", session_id="s", options=options)
        await handle.agent.run("name me")
        await handle.agent.when_idle()
        answer = await handle.agent.run("again")  # the title's call was the second request
        assert answer.stop_reason == "limit"
        events = list(handle.agent.session.events)
        assert handle.agent.session.config["title"] == "Named"
        # A session at its limit already: the title's call is not made, and says why.
        model = ScriptedModel([[Say("fine")]], delay=0)
        limited = AgentOptions(titles="model", limits=Limits(session_requests=1))
        other = await rt.agents.create(agent_id="b", session_id="t", options=limited)
        await other.agent.run("name me")
        await other.agent.when_idle()
        [start] = _title_turns(list(other.agent.session.events))
        after = list(other.agent.session.events)[start.seq :]
        await handle.dispose()
        await other.dispose()
    assert sum(type(e) is StepStart for e in events) == 2
    assert not [e for e in after if type(e) is StepStart]
    end = after[-1]
    assert type(end) is TurnEnd
    assert type(end.reason) is Errored
    assert "session_requests limit" in end.reason.message


async def test_switched_on_the_title_follows_the_next_completed_turn_only() -> None:
    script = [[Fail("HTTP 500")], [Say("fine")], [Say("again")], [Say("Named after")]]
    model = ScriptedModel(script, delay=0)
    async with open_runtime(model=model) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        assert (await agent.run("first")).stop_reason == "error"
        agent.configure("titles", "model")
        await agent.when_idle()
        # Its only prompt's turn failed: no answer to name it by, so no call.
        assert not _title_turns(list(agent.session.events))
        agent.configure("titles", "prompt")
        assert (await agent.run("second")).stop_reason == "completed"
        await agent.when_idle()
        assert not _title_turns(list(agent.session.events))
        # Switched on while idle: written after the next turn that completes, not before.
        agent.configure("titles", "model")
        await agent.when_idle()
        assert not _title_turns(list(agent.session.events))
        await agent.run("third")
        await agent.when_idle()
        assert agent.session.config["title"] == "Named after"
        # Off and on again: its one try is spent, nothing more is asked.
        agent.configure("titles", "prompt")
        agent.configure("titles", "model")
        await agent.when_idle()
        events = list(agent.session.events)
        await handle.dispose()
    assert len(_title_turns(events)) == 1
    # A person reading the log sees what the turn was, and the title it wrote.
    shown = "\n".join(transcript(handle.agent.session.header, events))
    assert "(the model writes the title)" in shown
    assert "title set to Named after" in shown
    assert [e.value for e in events if type(e) is ConfigSet and e.key == "title"] == ["Named after"]


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ("Fixing the login bug", "Fixing the login bug"),
        ('"Quoted"\nand more', "Quoted"),
        ("\n\n# Title: **Markdown**  ", "Markdown"),
        ("a\x00b\u200bc  d", "a b c d"),
        ("x" * 80, "x" * 59 + "\u2026"),
        ("", None),
        ("...\n---\n``", None),
    ],
)
def test_a_title_is_one_clean_line(answer: str, title: str | None) -> None:
    assert written_title(answer) == title
