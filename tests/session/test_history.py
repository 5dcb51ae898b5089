"""A session's conversation from code: `agent.history()` and `rt.history(session_id)` read the
log as typed values, and `rt.list_sessions()` lists the stored sessions."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import trio

from greenroom import open_runtime, tool
from greenroom.models import CallTool, Say, ScriptedModel, Think, Wait
from greenroom.protocol.events import USER, PluginSource
from greenroom.session.history import (
    AssistantEntry,
    CompactionEntry,
    ContextEntry,
    HistoryEntry,
    ToolCallEntry,
    UserEntry,
)
from greenroom.session.persistence import JsonlPersistence, SessionNotFound
from tests.actors.test_compaction import Windowed


@tool
def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: What to say.
    """
    return text.upper()


def _ids(entries: list[HistoryEntry]) -> dict[str, str]:
    return {e.text: e.message_id for e in entries if isinstance(e, UserEntry | ContextEntry)}


async def test_the_history_holds_prompts_replies_thinking_calls_and_injections() -> None:
    model = ScriptedModel(
        [
            [Think("plan"), Say("calling"), Wait(1), CallTool("shout", {"text": "hi"}, "c1")],
            [Say("done")],
        ]
    )
    async with open_runtime(model=model, tools=[shout]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        prompt = agent.send("go")
        await trio.sleep(0.5)
        agent.steer("and louder")
        await prompt
        agent.inject("a notice", source=PluginSource("bash"))
        await agent.when_idle()
        history = agent.history()
    ids = _ids(history)
    assert history == [
        UserEntry(turn=1, message_id=ids["go"], text="go", source=USER),
        AssistantEntry(turn=1, step=1, text="calling", thinking="plan"),
        ToolCallEntry(
            turn=1, step=1, call_id="c1", name="shout", arguments='{"text": "hi"}', result="HI"
        ),
        UserEntry(
            turn=1, message_id=ids["and louder"], text="and louder", source=USER, steered=True
        ),
        AssistantEntry(turn=1, step=2, text="done"),
        ContextEntry(
            turn=2, message_id=ids["a notice"], text="a notice", source=PluginSource("bash")
        ),
    ]
    encoded = msgspec.json.encode(history)
    assert msgspec.json.decode(encoded, type=list[HistoryEntry]) == history


async def test_a_compaction_is_an_entry_and_what_it_summarized_stays(tmp_path: Path) -> None:
    store = JsonlPersistence(tmp_path)
    model = Windowed(100_000, script=[("tool", "shout", '{"text": "x"}')])
    async with open_runtime(model=model, persistence=store, tools=[shout]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        for n in range(4):
            await handle.agent.run(f"question {n}")
        handle.agent.compact()
        await handle.agent.when_idle()
        live = handle.agent.history()
        assert await rt.history("s") == live  # live: its log here
        await handle.dispose()
        stored = await rt.history("s")  # not live: read off the store
        listed = await rt.list_sessions()
    assert stored == live
    assert [s.header.id for s in listed] == ["s"]
    prompts = [e.text for e in live if isinstance(e, UserEntry)]
    assert prompts == [f"question {n}" for n in range(4)]
    calls = [e for e in live if isinstance(e, ToolCallEntry)]
    assert [(c.name, c.result) for c in calls] == [("shout", "X")]
    compaction = live[-1]
    assert isinstance(compaction, CompactionEntry)
    assert compaction.summary.startswith("summary")
    assert (compaction.first_turn, compaction.last_turn) == (1, compaction.last_turn)


async def test_reading_without_a_store_or_an_unknown_id_says_why(tmp_path: Path) -> None:
    async with open_runtime() as rt:
        with pytest.raises(RuntimeError, match="cannot list the stored sessions"):
            await rt.list_sessions()
        with pytest.raises(RuntimeError, match="cannot read session 'nope'"):
            await rt.history("nope")
    async with open_runtime(persistence=JsonlPersistence(tmp_path)) as rt:
        with pytest.raises(SessionNotFound):
            await rt.history("nope")
