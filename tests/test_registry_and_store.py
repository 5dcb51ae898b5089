"""The registry's slots and the store's publication rules, directly."""

from __future__ import annotations

import pytest
import trio

from greenroom import open_runtime
from greenroom.actors.loop import LoopAgent
from greenroom.actors.registry import AgentIdInUse, AgentRegistry
from greenroom.models import ScriptedModel
from greenroom.protocol.model import TextDelta
from greenroom.session import SessionIdInUse, SessionStore
from greenroom.supervisor.hooks import Hooks
from greenroom.tools import ToolRegistry


def _agent(hooks: Hooks, store: SessionStore, agent_id: str) -> LoopAgent:
    return LoopAgent(
        agent_id,
        store.prepare(f"session-of-{agent_id}"),
        model=ScriptedModel(),
        tools=ToolRegistry(hooks),
        hooks=hooks,
    )


def test_register_rejects_a_duplicate_id_and_its_disposer_unregisters() -> None:
    hooks = Hooks()
    registry = AgentRegistry(hooks)
    store = SessionStore(hooks)
    agent = _agent(hooks, store, "a")
    unregister = registry.register(agent)
    with pytest.raises(AgentIdInUse, match="agent 'a' is already registered"):
        registry.register(_agent(hooks, store, "a"))
    assert registry.get("a") is agent
    assert registry.list() == [agent]
    unregister()
    unregister()  # idempotent
    assert registry.get("a") is None


async def test_one_factory_slot_whose_disposer_clears_it() -> None:
    registry = AgentRegistry(Hooks())
    with pytest.raises(RuntimeError, match="no agent factory is set"):
        await registry.create(agent_id="a", session_id="s")
    async with open_runtime() as rt:
        with pytest.raises(RuntimeError, match="an agent factory is already set"):
            rt.agents.set_factory(object())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="no agent factory is set"):
        await rt.agents.create(agent_id="a", session_id="s")


def test_prepare_rejects_a_relative_cwd_and_a_live_id() -> None:
    store = SessionStore(Hooks())
    with pytest.raises(ValueError, match="cwd must be an absolute path, got 'src'"):
        store.prepare("s", cwd="src")
    store.enter(store.prepare("s"))
    with pytest.raises(SessionIdInUse, match="session 's' is already live"):
        store.prepare("s")
    with pytest.raises(ValueError, match="a session id must be a non-empty string"):
        store.prepare("")


def test_a_stale_prepared_session_never_overwrites_a_live_one() -> None:
    store = SessionStore(Hooks())
    first = store.prepare("s")
    stale = store.prepare("s")
    detach = store.enter(first)
    with pytest.raises(SessionIdInUse, match="session 's' is already live"):
        store.enter(stale)
    assert store.get("s") is first
    detach()
    assert store.get("s") is None


async def test_the_scripted_echo_streams_one_chunk_per_word_with_its_delay() -> None:
    model = ScriptedModel(delay=0.25)
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
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
