"""The registry's index and the store's publication rules, directly."""

from __future__ import annotations

from typing import cast

import pytest
import trio

from greenroom import Agent, open_runtime
from greenroom.actors.events import AGENT_CREATED, AGENT_DISPOSED
from greenroom.actors.registry import AgentIdInUse, AgentRegistry
from greenroom.hooks import Hooks
from greenroom.models import ScriptedModel
from greenroom.protocol.model import TextDelta
from greenroom.session import SessionIdInUse, SessionStore, new_header
from tests.agents_helpers import new_agent


class _Agent:
    """Only what the registry reads of an agent: its id and its session's id."""

    def __init__(self, agent_id: str) -> None:
        self.id = agent_id
        self.session = SessionStore(Hooks()).prepare(new_header(f"session-of-{agent_id}"))


def test_register_rejects_a_duplicate_id_and_unregister_removes_it() -> None:
    hooks = Hooks()
    registry = AgentRegistry(hooks)
    agent = cast(Agent, _Agent("a"))
    events: list[str] = []
    hooks.on(AGENT_CREATED, lambda a: events.append(f"created {a.id}"))
    hooks.on(AGENT_DISPOSED, lambda a: events.append(f"disposed {a.id}"))
    registry.register(agent)
    with pytest.raises(AgentIdInUse, match="agent 'a' is already registered"):
        registry.register(cast(Agent, _Agent("a")))
    assert registry.get("a") is agent
    assert registry.by_session("session-of-a") is agent
    assert registry.list() == [agent]
    registry.unregister(agent)
    assert registry.get("a") is None
    assert registry.by_session("session-of-a") is None
    assert events == ["created a", "disposed a"]


async def test_a_create_after_the_runtime_closed_is_a_clear_error() -> None:
    async with open_runtime() as rt:
        pass
    with pytest.raises(RuntimeError, match="supervisor 'greenroom:agents' is closed"):
        await rt.agents.create(agent_id="a", session_id="s")
    assert rt.agents.list() == []
    assert rt.sessions.list() == []


def test_new_header_rejects_a_relative_cwd_and_prepare_a_live_id() -> None:
    store = SessionStore(Hooks())
    with pytest.raises(ValueError, match="cwd must be an absolute path, got 'src'"):
        new_header("s", cwd="src")
    with pytest.raises(ValueError, match="a session id must be a non-empty string"):
        new_header("")
    store.enter(store.prepare(new_header("s")))
    with pytest.raises(SessionIdInUse, match="session 's' is already live"):
        store.prepare(new_header("s"))


def test_a_stale_prepared_session_never_overwrites_a_live_one() -> None:
    store = SessionStore(Hooks())
    first = store.prepare(new_header("s"))
    stale = store.prepare(new_header("s"))
    store.enter(first)
    with pytest.raises(SessionIdInUse, match="session 's' is already live"):
        store.enter(stale)
    assert store.get("s") is first
    store.leave(first)
    assert store.get("s") is None


async def test_the_scripted_echo_streams_one_chunk_per_word_with_its_delay() -> None:
    model = ScriptedModel(delay=0.25)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        start = trio.current_time()
        agent.send("one two three four")
        await agent.when_idle()
        assert trio.current_time() - start == 1.0
        chunks = [
            e.chunk.text
            for e in agent.session.events
            if hasattr(e, "chunk") and isinstance(e.chunk, TextDelta)
        ]
        assert chunks == ["one ", "two ", "three ", "four"]
