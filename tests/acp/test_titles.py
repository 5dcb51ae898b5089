"""Session titles a model writes (``--titles model``) and the boolean config option that
switches them per session (issue 42, part 2).

The peer is the in-process client of tests/acp_peer.py; every frame it gets is read by the
official ACP SDK's schema types (a ``notice``, not in the SDK, by the spec's schema for it),
and the requests it sends are built by them.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import trio
from acp import schema

from greenroom import Price, Prices
from greenroom.actors.titles import TITLE_DEADLINE, TITLE_FAILED, TITLE_TOKENS
from greenroom.models import Fail, Hang, Say, ScriptedModel, Tokens
from greenroom.models.scripted import Action
from greenroom.protocol.events import (
    ConfigSet,
    Disposed,
    Errored,
    SessionEvent,
    TitleTrigger,
    TurnEnd,
    TurnStart,
    TurnUsage,
)
from greenroom.protocol.model import ModelRequest, StreamChunk
from greenroom.session.persistence import JsonlPersistence
from tests.acp_editor import checked_updates
from tests.acp_peer import Bridge, Peer, bridge

PROMPT = [{"type": "text", "text": "hello world, how are you?"}]
NOTICES = {"_meta": {"notice": True}}
BOOLEANS = {"session": {"configOptions": {"boolean": {}}}}
MODEL = "test-model"
TABLE = Prices(
    {
        MODEL: Price(
            input=Decimal("3"),
            cached_input=Decimal("0.30"),
            cache_write=Decimal("3.75"),
            output=Decimal("15"),
            reasoning=Decimal("15"),
            as_of=datetime.date(2026, 1, 1),
            source="the tests",
        )
    }
)


class Counted(ScriptedModel):
    """The scripted model, named (so its replies are priced) and counting its calls."""

    model_name = MODEL

    def __init__(self, scripts: list[list[Action]]) -> None:
        super().__init__(scripts, delay=0)
        self.calls = 0

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.calls += 1
        return super().stream(request)


def _titles(frames: list[dict[str, Any]]) -> list[str]:
    return [
        u["title"] for u in checked_updates(frames) if u["sessionUpdate"] == "session_info_update"
    ]


def _title_turns(events: list[SessionEvent]) -> list[TurnStart]:
    return [e for e in events if type(e) is TurnStart and type(e.trigger) is TitleTrigger]


def _logged(b: Bridge, session: str) -> list[SessionEvent]:
    """The log of the live `session` (its store's is the same, as a load shows)."""
    agent = b.runtime.agents.by_session(session)
    assert agent is not None
    return list(agent.session.events)


async def _prompted(peer: Peer, session: str, text: str = "") -> dict[str, Any]:
    prompt = [{"type": "text", "text": text}] if text else PROMPT
    request = schema.PromptRequest(session_id=session, prompt=prompt)  # type: ignore[arg-type]
    answer = await peer.call("session/prompt", request.model_dump(by_alias=True, mode="json"))
    schema.PromptResponse.model_validate(answer["result"])
    return answer


async def test_the_model_writes_the_title_once_after_the_first_turn(tmp_path: Path) -> None:
    model = Counted(
        [
            [Say("I am well, thank you."), Tokens(100, 10)],
            [Say('Title: "**Greeting the world**"'), Tokens(40, 4)],
            [Say("again"), Tokens(120, 5)],
        ]
    )
    async with bridge(tmp_path, model, prices=TABLE, titles="model") as b:
        peer = b.peer
        session = await peer.new_session(str(tmp_path))
        answer = await _prompted(peer, session)
        assert answer["result"]["stopReason"] == "end_turn"
        told = await peer.wait_for(
            lambda f: (
                f.get("method") == "session/update"
                and f["params"]["update"]["sessionUpdate"] == "session_info_update"
                and f["params"]["update"]["title"] == "Greeting the world"
            )
        )
        # The prompt's answer went out first; the prompt's own title before it.
        assert peer.index_of(answer) < peer.index_of(told)
        assert _titles(peer.frames) == ["hello world, how are you?", "Greeting the world"]
        # The call's tokens are the session's: its cost told after it, both calls priced.
        costs = [
            u["cost"]["amount"]
            for u in checked_updates(peer.frames[peer.index_of(told) :])
            if u["sessionUpdate"] == "usage_update" and "cost" in u
        ]
        both = (140 * 3 + 14 * 15) / 1_000_000
        assert costs == [pytest.approx(both)]
        # Asked as the title asks: small, no tools, the prompt and its answer.
        request = model.requests[1]
        assert request.max_output_tokens == TITLE_TOKENS
        assert not request.tools
        assert "hello world" in request.messages[0].content
        assert "I am well" in request.messages[0].content
        # Not twice: a second turn makes no title call.
        await _prompted(peer, session, "and now?")
        assert model.calls == 3
        listed = await peer.call("session/list", {})
        [info] = schema.ListSessionsResponse.model_validate(listed["result"]).sessions
        assert info.title == "Greeting the world"  # the model's, as the store lists it
        events = _logged(b, session)
        [start] = _title_turns(events)
        end = next(e for e in events if type(e) is TurnEnd and e.turn == start.turn)
        turn = events[start.seq : end.seq + 1]
        assert [type(e).__name__ for e in turn] == [
            "TurnStart",
            "StepStart",
            "StepEnd",
            "ConfigSet",
            "TurnUsage",
            "TurnEnd",
        ]
        [written] = [e for e in turn if type(e) is ConfigSet]
        assert (written.key, written.value) == ("title", "Greeting the world")
        [usage] = [e for e in turn if type(e) is TurnUsage]
        assert (usage.usage.input_tokens, usage.usage.output_tokens) == (40, 4)
        assert (usage.session.input_tokens, usage.session.output_tokens) == (140, 14)
        # A load replays the title the model wrote, last, without calling it again.
        await peer.call("session/close", {"sessionId": session})
        mark = len(peer.frames)
        loaded = await peer.call(
            "session/load", {"sessionId": session, "cwd": str(tmp_path), "mcpServers": []}
        )
        schema.LoadSessionResponse.model_validate(loaded["result"])
        assert _titles(peer.frames[mark:])[-1] == "Greeting the world"
        await _prompted(peer, session, "once more")
        assert model.calls == 4  # the prompt's step only
        assert len(_title_turns(_logged(b, session))) == 1


@pytest.mark.parametrize(
    ("title_call", "why"),
    [
        ([Fail("HTTP 500: the server broke")], "the model failed: HTTP 500: the server broke"),
        ([Say("  ** ... **  "), Tokens(30, 3)], "the model's answer held no title"),
        ([Hang()], f"the model did not answer within {TITLE_DEADLINE:g} s"),
    ],
    ids=["error", "garbage", "timeout"],
)
async def test_a_title_not_written_keeps_the_prompts_and_says_so(
    tmp_path: Path, title_call: list[Action], why: str
) -> None:
    model = Counted([[Say("fine")], title_call])
    async with bridge(tmp_path, model, capabilities=NOTICES, titles="model") as b:
        peer = b.peer
        session = await peer.new_session(str(tmp_path))
        await _prompted(peer, session)
        notice = await peer.wait_for(
            lambda f: (
                f.get("method") == "session/update"
                and f["params"]["update"]["sessionUpdate"] == "notice"
            )
        )
        update = notice["params"]["update"]
        assert update["title"] == "The title was not written"
        assert update["description"].startswith(f"the title was not written: {why}")
        assert _titles(peer.frames) == ["hello world, how are you?"]
        events = _logged(b, session)
        [end] = [e for e in events if type(e) is TurnEnd][-1:]
        assert type(end.reason) is Errored
        assert end.reason.code == TITLE_FAILED
        assert not [e for e in events if type(e) is ConfigSet and e.key == "title"]
        # Its one try: the next turn tries no more.
        await _prompted(peer, session, "next")
        assert model.calls == 3


async def test_closing_the_session_ends_its_title_call(tmp_path: Path) -> None:
    model = Counted([[Say("fine")], [Hang()]])
    async with bridge(tmp_path, model, titles="model") as b:
        peer = b.peer
        session = await peer.new_session(str(tmp_path))
        await _prompted(peer, session)
        while model.calls < 2:  # the title's call hangs
            await trio.sleep(0.1)
        started = trio.current_time()
        closed = await peer.call("session/close", {"sessionId": session})
        assert closed == {"jsonrpc": "2.0", "id": closed["id"], "result": {}}
        assert trio.current_time() - started < 1  # not its 30 s: cancelled with the session
        assert b.runtime.agents.by_session(session) is None
        _header, events = await JsonlPersistence(tmp_path).load(session)
    [start] = _title_turns(list(events))
    end = next(e for e in events if type(e) is TurnEnd and e.turn == start.turn)
    assert type(end.reason) is Disposed
    assert not [e for e in events if type(e) is ConfigSet and e.key == "title"]


# -- the boolean config option ----------------------------------------------------------------


def _options(result: dict[str, Any]) -> dict[str, Any]:
    return {o["id"]: o for o in result["configOptions"]}


async def test_the_titles_option_is_offered_to_a_client_that_takes_booleans(
    tmp_path: Path,
) -> None:
    async with bridge(tmp_path, ScriptedModel(delay=0), capabilities=BOOLEANS) as b:
        answer = await b.peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        created = schema.NewSessionResponse.model_validate(answer["result"])
    [titles] = [o for o in created.config_options or () if o.id == "titles"]
    assert isinstance(titles, schema.SessionConfigOptionBoolean)
    assert (titles.name, titles.current_value) == ("Model-written titles", False)
    # --titles model is the default a session starts with.
    async with bridge(tmp_path, ScriptedModel(delay=0), capabilities=BOOLEANS, titles="model") as b:
        answer = await b.peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        schema.NewSessionResponse.model_validate(answer["result"])
        assert _options(answer["result"])["titles"]["currentValue"] is True
    # A client that does not declare them gets the select options it always had.
    async with bridge(tmp_path, ScriptedModel(delay=0), titles="model") as b:
        answer = await b.peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        schema.NewSessionResponse.model_validate(answer["result"])
        assert list(_options(answer["result"])) == ["mode", "model", "thought_level"]
        assert {o["type"] for o in answer["result"]["configOptions"]} == {"select"}


def _set(session: str, config_id: str, value: bool | str) -> dict[str, Any]:
    if isinstance(value, bool):
        request: Any = schema.SetSessionConfigOptionBooleanRequest(
            session_id=session, config_id=config_id, type="boolean", value=value
        )
    else:
        request = schema.SetSessionConfigOptionSelectRequest(
            session_id=session, config_id=config_id, value=value
        )
    params: dict[str, Any] = request.model_dump(by_alias=True, exclude_none=True, mode="json")
    return params


async def test_the_titles_option_is_set_logged_and_reloaded(tmp_path: Path) -> None:
    model = Counted([[Say("fine")], [Say("A Named Session")]])
    where = {"cwd": str(tmp_path), "mcpServers": []}
    async with bridge(tmp_path, model, capabilities=BOOLEANS) as b:
        peer = b.peer
        session = await peer.new_session(str(tmp_path))
        mark = len(peer.frames)
        answer = await peer.call("session/set_config_option", _set(session, "titles", True))
        result = schema.SetSessionConfigOptionResponse.model_validate(answer["result"])
        assert _options(answer["result"])["titles"]["currentValue"] is True
        assert len(result.config_options) == 4
        told = [
            u for u in checked_updates(peer.frames[mark:]) if u["sessionUpdate"] != "usage_update"
        ]
        assert [u["sessionUpdate"] for u in told] == ["config_option_update"]
        await _prompted(peer, session)
        await peer.wait_for(lambda f: "A Named Session" in str(f))
        events = _logged(b, session)
        settings = [(e.key, e.value) for e in events if type(e) is ConfigSet]
        assert settings == [("titles", "model"), ("title", "A Named Session")]
        await peer.call("session/close", {"sessionId": session})
        loaded = await peer.call("session/load", {"sessionId": session, **where})
        schema.LoadSessionResponse.model_validate(loaded["result"])
        assert _options(loaded["result"])["titles"]["currentValue"] is True
        # Off again: logged, told, and a session that had its title keeps it.
        answer = await peer.call("session/set_config_option", _set(session, "titles", False))
        assert _options(answer["result"])["titles"]["currentValue"] is False
        events = _logged(b, session)
        assert [(e.key, e.value) for e in events if type(e) is ConfigSet][-1] == (
            "titles",
            "prompt",
        )
        checked_updates(peer.frames)
    assert model.calls == 2


async def test_a_bad_config_option_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async with bridge(tmp_path, ScriptedModel(delay=0), capabilities=BOOLEANS) as b:
        peer = b.peer
        answer = await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        session = answer["result"]["sessionId"]
        before = answer["result"]["configOptions"]
        titles_on = {"sessionId": session, "configId": "titles", "value": "on"}
        wrong_type = {"sessionId": session, "configId": "titles", "type": "select", "value": True}
        untyped = {"sessionId": session, "configId": "titles", "value": True}
        bad = [
            (titles_on, "'titles' is a boolean option: its value is true or false"),
            (wrong_type, "'titles' is a boolean option"),
            (untyped, 'with type "boolean", got true'),
            (_set(session, "mode", True), "'mode' is a select option"),
            (_set(session, "nope", "x"), "unknown config option 'nope'"),
            (_set(session, "instructions", "be evil"), "unknown config option 'instructions'"),
            ({"sessionId": session, "configId": "titles", "value": 1}, "$.value"),
        ]
        for params, named in bad:
            refused = await peer.call("session/set_config_option", params)
            schema.AgentResponse.model_validate(refused)
            assert refused["error"]["code"] == -32602, refused
            assert named in refused["error"]["message"]
        events = _logged(b, session)
        assert not [e for e in events if type(e) is ConfigSet]
        where = {"cwd": str(tmp_path), "mcpServers": []}
        await peer.call("session/close", {"sessionId": session})
        loaded = await peer.call("session/load", {"sessionId": session, **where})
        assert loaded["result"]["configOptions"] == before
    # Not offered to a client that does not take booleans: unknown to it.
    async with bridge(tmp_path, ScriptedModel(delay=0)) as b:
        session = await b.peer.new_session(str(tmp_path))
        refused = await b.peer.call("session/set_config_option", _set(session, "titles", True))
        assert refused["error"]["code"] == -32602
        assert "unknown config option 'titles'" in refused["error"]["message"]
