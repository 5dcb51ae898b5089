"""Compaction: a session longer than its model's context window stays answerable.

Virtual time unless marked: a model of a tiny window (`Windowed`) that refuses a
request over it, as a provider does, and answers a summarizing request with a
numbered summary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.acp.presenter import SUMMARY_CHUNK_CHARS
from greenroom.actors.compaction import (
    BYTES_PER_TOKEN,
    KEPT_CHARS,
    SUMMARY_SYSTEM,
    CompactionPolicy,
)
from greenroom.actors.types import AgentOptions, ToolInvocation
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.base import ContextOverflow, context_window_of
from greenroom.models.openai import OpenAIChatModel
from greenroom.protocol.events import (
    COMPLETED,
    REFUSED,
    USER,
    Aborted,
    AssistantMessage,
    Compacted,
    CompactionStart,
    CompactionTrigger,
    Cut,
    MessageTrigger,
    PermissionRule,
    SessionEvent,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    ToolTurn,
    Usage,
    UserTurn,
)
from greenroom.session import Session, new_header
from greenroom.session.persistence import JsonlPersistence
from greenroom.session.transcript import transcript
from greenroom.tools import Tool
from tests import ROOT, TESTS
from tests.agents_helpers import new_agent, turn_ends


def tokens(request: ModelRequest) -> int:
    """A request's size as the test's provider counts it: 4 bytes a token of its system
    prompt, its tools' JSON and each message's texts (a call's name and arguments too),
    and 6 tokens a message for its role and framing (more than greenroom reckons)."""
    size = len((request.system or "").encode()) + len(msgspec.json.encode(request.tools))
    for message in request.messages:
        size += 24 + len(message.content.encode())
        for call in getattr(message, "tool_calls", ()):
            size += len(call.name) + len(call.arguments.encode())
    return -(-size // BYTES_PER_TOKEN)


class Windowed:
    """A model that holds `context_window` tokens: a longer request is refused
    (`ContextOverflow`, as the adapters raise a provider's refusal); a summarizing request
    gets ``summary N``; any other gets ``answer N`` and its usage, or the script's next
    reply (``("tool", name, arguments)`` calls a tool)."""

    def __init__(
        self,
        context_window: int,
        *,
        summary: str = "ok",
        usage: bool = True,
        script: list[tuple[str, ...]] | None = None,
    ) -> None:
        self.context_window = self.limit = context_window
        self.summary = summary  # "ok", "fail", "hang"
        self.usage = usage
        self.script = list(script or [])
        self.sizes: list[int] = []
        self.requests: list[ModelRequest] = []
        self.summaries = 0
        self.answers = 0

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply(request)

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        size = tokens(request)
        self.sizes.append(size)
        self.requests.append(request)
        await trio.sleep(0.01)
        if size > self.limit:
            raise ContextOverflow(f"prompt is too long: {size} tokens > {self.limit}")
        if request.system == SUMMARY_SYSTEM:
            if self.summary == "fail":
                raise RuntimeError("the summarizer is down")
            if self.summary == "hang":
                await trio.sleep_forever()
            self.summaries += 1
            yield TextDelta(f"summary {self.summaries}")
            yield Finish("stop")
            return
        if self.script:
            step = self.script.pop(0)
            if step[0] == "tool":
                yield ToolCallChunk(f"call-{len(self.script)}", step[1], step[2])
                yield Finish("tool-calls")
                return
        self.answers += 1
        yield TextDelta(f"answer {self.answers}")
        if self.usage:
            yield Usage(input_tokens=size, output_tokens=3)
        yield Finish("stop")


class NoArgs(msgspec.Struct):
    pass


def compactions(events: list[SessionEvent] | Any) -> list[Compacted]:
    return [e for e in events if isinstance(e, Compacted)]


# -- the history after a compaction ---------------------------------------------------------


def _at(seq: int, event: Any) -> Any:
    return msgspec.structs.replace(event, seq=seq)


def test_the_model_is_sent_the_summary_then_the_kept_events() -> None:
    """Summary first; the events from kept_seq on verbatim (a cut one shortened with a
    marker); a refused turn among them left out; a remembered answer still applies."""
    start = MessageTrigger(USER)
    log: list[Any] = [
        TurnStart(turn=1, trigger=start),
        UserMessage(content="old question", source=USER, message_id="m1"),
        AssistantMessage(turn=1, step=1, content="old answer"),
        PermissionRule(tool="bash", allow=True),
        TurnEnd(turn=1, reason=COMPLETED),
        TurnStart(turn=2, trigger=start),  # 5: kept from here
        UserMessage(content="kept question", source=USER, message_id="m2"),
        AssistantMessage(
            turn=2, step=1, content="", tool_calls=[ToolCallChunk("c1", "bash", "{}")]
        ),
        ToolResult(turn=2, step=1, call_id="c1", content="x" * 5_000),  # 8: cut
        TurnEnd(turn=2, reason=COMPLETED),
        TurnStart(turn=3, trigger=start),
        UserMessage(content="refused question", source=USER, message_id="m3"),
        TurnEnd(turn=3, reason=REFUSED),
        TurnStart(turn=4, trigger=start),
    ]
    log.append(
        Compacted(
            turn=4,
            step=1,
            summary="they talked",
            first_seq=0,
            kept_seq=5,
            first_turn=1,
            last_turn=1,
            model="m",
            tokens_before=9_000,
            tokens_after=600,
            cuts=[Cut(8, 100)],
        )
    )
    log.append(UserMessage(content="after", source=USER, message_id="m4"))
    session = Session(new_header("s"), [_at(i, e) for i, e in enumerate(log)])
    messages = list(session.messages())
    assert messages[0] == UserTurn('<summary of="turn 1">they talked</summary>')
    assert messages[1] == UserTurn("kept question")
    assert isinstance(messages[3], ToolTurn)
    assert "[4900 of 5000 characters were cut" in messages[3].content
    assert len(messages[3].content) < 300
    assert [m.content for m in messages[4:]] == ["after"]  # the refused turn: left out
    assert session.permissions == {"bash": True}
    assert len(session.events) == len(log)  # the log keeps every event


# -- automatic ------------------------------------------------------------------------------


async def test_a_thousand_turns_stay_answerable_under_a_tiny_window() -> None:
    model = Windowed(1_000)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(1_000):
            answer = await agent.run(f"question {n}: " + "tell me more about it " * 4)
            assert answer.text.startswith("answer"), (n, answer)
        events = list(agent.session.events)
    assert all(reason == COMPLETED for _, reason in turn_ends(events))
    assert max(model.sizes) <= model.context_window
    assert len(compactions(events)) > 10
    assert model.answers == 1_000
    asked = [e.content for e in events if isinstance(e, UserMessage)]
    assert asked == [f"question {n}: " + "tell me more about it " * 4 for n in range(1_000)]


async def test_without_reported_usage_the_bytes_rule_alone_keeps_requests_under() -> None:
    model = Windowed(600, usage=False)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt, options=AgentOptions(system_prompt="be brief " * 20))
        for n in range(200):
            await agent.run(f"question {n} " + "words " * 20)
        events = list(agent.session.events)
    assert all(reason == COMPLETED for _, reason in turn_ends(events))
    assert max(model.sizes) <= model.context_window
    assert compactions(events)


async def test_the_threshold_and_the_verbatim_part_are_options() -> None:
    late, early = Windowed(2_000), Windowed(2_000)
    async with open_runtime(model=late) as rt:
        agent = await new_agent(rt)
        for n in range(60):
            await agent.run(f"question {n} " + "words " * 20)
        late_events = compactions(agent.session.events)
    policy = CompactionPolicy(threshold=0.4, keep=0.1)
    async with open_runtime(model=early) as rt:
        agent = await new_agent(rt, options=AgentOptions(compaction=policy))
        for n in range(60):
            await agent.run(f"question {n} " + "words " * 20)
        early_events = compactions(agent.session.events)
    assert len(early_events) > len(late_events) >= 1
    assert max(e.tokens_before for e in early_events) <= 0.4 * 2_000 + 200
    assert max(e.tokens_after for e in early_events) < max(e.tokens_after for e in late_events)


@pytest.mark.parametrize(
    "policy",
    [
        {"threshold": 0.5, "keep": 0.6},
        {"threshold": 0.5, "keep": 0.4},  # with the summary's 0.1: due again at once
        {"keep": 0.3, "summary": 0.0},
        {"threshold": 1.2},
    ],
)
def test_a_policy_that_cannot_hold_is_refused(policy: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"keep \+ summary <= 0.9 \* threshold"):
        CompactionPolicy(**policy)


@pytest.mark.parametrize("deadline", [0.0, -1.0, float("nan"), float("inf")])
def test_a_deadline_that_is_no_time_is_refused(deadline: float) -> None:
    with pytest.raises(ValueError, match="deadline must be seconds > 0"):
        CompactionPolicy(deadline=deadline)


def test_known_families_have_their_windows() -> None:
    assert context_window_of("claude-sonnet-4-5") == 200_000
    assert context_window_of("gpt-4o-mini") == 128_000
    assert context_window_of("gpt-4.1-mini") == 1_047_576
    assert context_window_of("gpt-4") == 8_192
    assert context_window_of("my-local-llama") == 128_000


async def test_an_overflow_the_estimate_missed_compacts_and_retries_once() -> None:
    """A window the estimate does not know (the adapter says none): the refusal compacts."""

    model = Windowed(900)
    del model.context_window
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(80):
            answer = await agent.run(f"question {n} " + "words " * 20)
            assert answer.text.startswith("answer")
        events = list(agent.session.events)
    assert all(reason == COMPLETED for _, reason in turn_ends(events))
    assert compactions(events)


# -- on request -----------------------------------------------------------------------------


async def test_compact_while_idle_is_a_turn_of_its_own() -> None:
    model = Windowed(100_000)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(6):
            await agent.run(f"question {n}")
        agent.compact("keep the numbers")
        await agent.when_idle()
        events = list(agent.session.events)
        last_start = [e for e in events if isinstance(e, TurnStart)][-1]
        assert last_start.trigger == CompactionTrigger(USER)
        (compacted,) = compactions(events)
        assert compacted.instructions == "keep the numbers"
        assert "keep the numbers" in model.requests[-1].messages[0].content
        assert turn_ends(events)[-1] == (7, COMPLETED)
        await agent.run("and now?")
        sent = model.requests[-1].messages
        assert sent[0].content.startswith('<summary of="turns 1-')
        assert len(sent) < 2 * 6


async def test_compact_while_running_applies_before_the_next_step() -> None:
    model = Windowed(100_000, script=[("tool", "look", "{}")])

    async def look(args: NoArgs, invocation: ToolInvocation) -> str:
        assert invocation.agent is not None
        invocation.agent.compact()
        return "looked"

    tool = Tool("look", "look", NoArgs, look)
    async with open_runtime(model=model, tools=[tool]) as rt:
        agent = await new_agent(rt)
        for n in range(5):
            model.script = [] if n < 4 else [("tool", "look", "{}")]
            await agent.run(f"question {n}")
        events = list(agent.session.events)
    (compacted,) = compactions(events)
    assert (compacted.turn, compacted.step) == (5, 2)
    assert turn_ends(events)[-1] == (5, COMPLETED)


async def test_a_cancel_during_a_compaction_aborts_the_turn_and_ends_the_compaction() -> None:
    """The compaction that started is logged as started and as ended (degraded, the cancel
    its reason: nothing here needed cutting, so the history is as before), then the turn
    ends ``aborted``."""
    model = Windowed(100_000)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(6):
            await agent.run(f"question {n}")
        model.summary = "hang"
        before = len(agent.session.events)
        messages = list(agent.session.messages())
        agent.compact()
        await trio.sleep(1)
        assert model.requests[-1].system == SUMMARY_SYSTEM
        agent.cancel("enough")
        await agent.when_idle()
        events = list(agent.session.events)
        assert turn_ends(events)[-1] == (7, Aborted("enough"))
        (compacted,) = compactions(events)
        assert compacted.degraded == "cancelled: enough"
        assert isinstance(events[compacted.started], CompactionStart)
        assert list(agent.session.messages()) == messages
        kinds = [type(e).__struct_config__.tag for e in events[before:]]
        assert kinds == [
            "turn/start",
            "step/start",
            "context/compacting",
            "context/compacted",
            "step/end",
            "turn/end",
        ]
        model.summary = "ok"
        answer = await agent.run("still there?")
        assert answer.text.startswith("answer")


async def test_a_failed_summary_truncates_tool_outputs_and_says_so() -> None:
    model = Windowed(1_500, summary="fail")

    async def dump(args: NoArgs, invocation: ToolInvocation) -> str:
        return "y" * 3_000

    tool = Tool("dump", "dump", NoArgs, dump)
    async with open_runtime(model=model, tools=[tool]) as rt:
        agent = await new_agent(rt)
        for n in range(12):
            model.script = [("tool", "dump", "{}")]
            answer = await agent.run(f"question {n}")
            assert answer.text.startswith("answer")
        events = list(agent.session.events)
    assert all(reason == COMPLETED for _, reason in turn_ends(events))
    degraded = [c for c in compactions(events) if c.degraded]
    assert degraded
    assert "the summarizer is down" in (degraded[0].degraded or "")
    assert degraded[0].cuts
    assert all(c.kept == KEPT_CHARS for c in degraded[0].cuts)
    asked = [
        size
        for size, r in zip(model.sizes, model.requests, strict=True)
        if r.system != SUMMARY_SYSTEM
    ]
    assert max(asked) <= 1_500


async def test_a_single_message_larger_than_the_window_is_cut_with_a_marker() -> None:
    model = Windowed(1_000)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        await agent.run("hello")
        answer = await agent.run("z" * 20_000)
        assert answer.text.startswith("answer")
        (compacted,) = compactions(agent.session.events)
    sent = model.requests[-1].messages
    huge = [m for m in sent if isinstance(m, UserTurn) and m.content.startswith("zzz")]
    assert len(huge) == 1
    assert "of 20000 characters were cut" in huge[0].content
    assert compacted.cuts
    assert max(model.sizes) <= 1_000


# -- persistence ----------------------------------------------------------------------------


async def test_resume_after_a_compaction_sends_the_same_request(tmp_path: Path) -> None:
    model = Windowed(1_000)
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        for n in range(40):
            await handle.agent.run(f"question {n} " + "words " * 10)
        assert compactions(handle.agent.session.events)
        await handle.agent.run("next")
        before = model.requests[-1]
        await handle.dispose()
    model.requests.clear()
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s")
        # The same prompt again: the request is the old one plus the old answer and it.
        before_history = list(before.messages)
        history = list(handle.agent.session.messages())
        assert history[: len(before_history)] == before_history
        lines = list(transcript(handle.agent.session.header, handle.agent.session.events))
        await handle.dispose()
    for n in range(40):
        assert any(f"question {n} " in line for line in lines)
    assert any(line.startswith("  compacted") for line in lines)


@pytest.mark.real_clock
@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01, 0.03])
async def test_sigkill_during_compaction_loads_compacted_or_not(
    tmp_path: Path, delay: float
) -> None:
    child = TESTS / "compaction_child.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, str(child), str(tmp_path)], stdout=subprocess.PIPE, env=env
        )
        assert process.stdout is not None
        seen = b""
        while b"summarizing" not in seen:
            chunk = await process.stdout.receive_some()
            assert chunk, f"the child ended early: {seen!r}"
            seen += chunk
        await trio.sleep(delay)
        process.send_signal(signal.SIGKILL)
        await process.wait()
    persistence = JsonlPersistence(tmp_path)
    header, events = await persistence.load("s")
    session = Session(header, events)
    # How many compactions landed before the kill depends on the machine's speed; each one
    # is one event, whole or absent, and the history starts at the latest.
    asked = [e.content for e in events if isinstance(e, UserMessage)]
    assert asked == [f"question {n}" for n in range(len(asked))]
    history = list(session.messages())
    if compactions(events):
        assert history[0].content.startswith("<summary")
    else:
        assert [m.content for m in history if isinstance(m, UserTurn)][: len(asked)] == asked


# -- a provider's refusal, over the wire ----------------------------------------------------

OVERFLOW_BODIES = {
    "openai": {
        "error": {
            "message": "This model's maximum context length is 128000 tokens. However, your"
            " messages resulted in 131072 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
    "anthropic": {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 211234 tokens > 200000 maximum",
        },
    },
}


@pytest.mark.real_clock
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_providers_overflow_error_compacts_and_retries_the_step(kind: str) -> None:
    from tests.sse_server import Served, client_tls, sse_server
    from tests.wire import anthropic_text, openai_text

    text = openai_text if kind == "openai" else anthropic_text
    refusal = Served(400, body=msgspec.json.encode(OVERFLOW_BODIES[kind]))
    replies = [Served(pieces=text(f"answer {n}")) for n in range(4)]
    replies += [refusal, Served(pieces=text("the summary")), Served(pieces=text("answer 4"))]
    with trio.fail_after(30):
        async with sse_server(replies, tls=True) as server:
            if kind == "openai":
                model: Any = OpenAIChatModel(
                    server.url + "/v1", "sk-test", "gpt-4o-mini", verify=client_tls()
                )
            else:
                model = AnthropicModel(
                    server.url, "sk-test", "claude-sonnet-4-5", verify=client_tls()
                )
            async with open_runtime(model=model) as rt:
                agent = await new_agent(rt)
                for n in range(4):
                    await agent.run(f"question {n} " + "words " * 50)
                answer = await agent.run("question 4")
                events = list(agent.session.events)
    assert answer.stop_reason == "completed"
    assert answer.text == "answer 4"
    (compacted,) = compactions(events)
    assert compacted.summary == "the summary"
    assert compacted.turn == 5
    bodies = [seen.body for seen in server.requests]
    assert len(bodies) == 7
    summarizing, retried = bodies[5], bodies[6]
    assert SUMMARY_SYSTEM in json.dumps(summarizing)
    assert "the summary" in json.dumps(retried)
    assert "question 4" in json.dumps(retried)
    assert len(json.dumps(retried)) < len(json.dumps(bodies[4]))


@pytest.mark.real_clock
async def test_a_second_overflow_fails_the_turn_and_the_next_prompt_is_tried_again() -> None:
    from tests.sse_server import Served, client_tls, sse_server
    from tests.wire import openai_text

    refusal = Served(400, body=msgspec.json.encode(OVERFLOW_BODIES["openai"]))
    replies = [Served(pieces=openai_text("answer 0")), Served(pieces=openai_text("answer 1"))]
    replies += [refusal, Served(pieces=openai_text("the summary")), refusal]
    replies += [Served(pieces=openai_text("answer 2"))]
    with trio.fail_after(30):
        async with sse_server(replies, tls=True) as server:
            model = OpenAIChatModel(server.url + "/v1", "sk-test", "gpt-4o", verify=client_tls())
            async with open_runtime(model=model) as rt:
                agent = await new_agent(rt)
                for n in range(2):
                    await agent.run(f"question {n}")
                failed = await agent.run("question 2")
                again = await agent.run("question 3")
    assert failed.stop_reason == "error"
    assert "context_length" in (failed.reason or "") or "maximum context" in (failed.reason or "")
    assert again.text == "answer 2"


# -- ACP: /compact with the official SDK client, then a load that replays it all -----------


def test_compact_over_acp_then_a_load_replays_every_message(tmp_path: Path) -> None:
    import asyncio

    import acp
    from acp import schema

    from tests.acp.test_e2e import Recorder

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    env = {"GREENROOM_HOME": str(home)}
    asked = [f"question number {n}" for n in range(6)]

    def users(recorder: Recorder) -> list[str]:
        return [
            u.content.text for _, u in recorder.updates if isinstance(u, schema.UserMessageChunk)
        ]

    async def first() -> str:
        recorder = Recorder()
        async with acp.spawn_agent_process(recorder, *command, env=env, cwd=work) as (conn, _):
            await conn.initialize(protocol_version=1)
            session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
            for question in asked:
                await conn.prompt(session_id=session, prompt=[acp.text_block(question)])
            answer = await conn.prompt(
                session_id=session, prompt=[acp.text_block("/compact keep the numbers")]
            )
            assert answer.stop_reason == "end_turn"
            assert "Compacted " in recorder.text(session)
            usages = [u for _, u in recorder.updates if isinstance(u, schema.UsageUpdate)]
            assert usages
            after = await conn.prompt(session_id=session, prompt=[acp.text_block("and then")])
            assert after.stop_reason == "end_turn"
            return session

    async def second(session: str) -> None:
        recorder = Recorder()
        async with acp.spawn_agent_process(recorder, *command, env=env, cwd=work) as (conn, _):
            await conn.initialize(protocol_version=1)
            await conn.load_session(session_id=session, cwd=str(work), mcp_servers=[])
            assert users(recorder) == [*asked, "and then"]
            assert "Compacted " in recorder.text(session)

    async def scenario() -> None:
        session = await asyncio.wait_for(first(), 60)
        await asyncio.wait_for(second(session), 60)

    asyncio.run(scenario())


def test_the_command_line_sets_an_api_models_window(capsys: pytest.CaptureFixture[str]) -> None:
    from greenroom.cli import main
    from greenroom.models.named import model_named

    environ = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-test"}
    local = model_named("openai:my-local-llama", environ, 8_192)
    assert getattr(local, "context_window", None) == 8_192
    assert getattr(model_named("openai:gpt-4.1", environ), "context_window", None) == 1_047_576
    claude = model_named("anthropic:claude-haiku-4-5", environ)
    assert getattr(claude, "context_window", None) == 200_000
    with pytest.raises(SystemExit) as exited:
        main(["acp", "--context-window", "0"])
    assert exited.value.code == 2
    assert "--context-window must be tokens > 0, got 0" in capsys.readouterr().err


async def test_the_runtimes_policy_applies_unless_the_agents_options_say_otherwise() -> None:
    async def compacted_tokens(model: Windowed, **options: Any) -> list[int]:
        async with open_runtime(
            model=model, compaction=CompactionPolicy(threshold=0.3, keep=0.1)
        ) as rt:
            agent = await new_agent(rt, **options)
            for n in range(60):
                await agent.run(f"question {n} " + "words " * 20)
            return [c.tokens_before for c in compactions(agent.session.events)]

    runtimes = await compacted_tokens(Windowed(2_000))
    own = await compacted_tokens(
        Windowed(2_000), options=AgentOptions(compaction=CompactionPolicy())
    )
    assert max(runtimes) <= 0.3 * 2_000 + 200 < min(own)


class Family(Windowed):
    """A parent that gives each prompt to a child (``task``); a child that calls ``dump``
    four times, then answers at length; summaries fail, so compactions truncate."""

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        size = tokens(request)
        self.sizes.append(size)
        self.requests.append(request)
        await trio.sleep(0.01)
        if size > self.limit:
            raise ContextOverflow(f"prompt is too long: {size} tokens > {self.limit}")
        if request.system == SUMMARY_SYSTEM:
            raise RuntimeError("the summarizer is down")
        last = request.messages[-1]
        self.answers += 1
        if any("child:" in m.content for m in request.messages):
            if sum(isinstance(m, ToolTurn) for m in request.messages) < 4:
                yield ToolCallChunk(f"dump-{self.answers}", "dump", "{}")
                yield Finish("tool-calls")
                return
            yield TextDelta("R" * 1_500)
        elif isinstance(last, UserTurn):
            arguments = json.dumps({"prompt": f"child: look into {self.answers}"})
            yield ToolCallChunk(f"task-{self.answers}", "task", arguments)
            yield Finish("tool-calls")
            return
        else:
            yield TextDelta("done")
        yield Finish("stop")


async def test_sub_agents_compact_on_their_own_and_task_results_are_never_cut() -> None:
    from greenroom.session.store import SESSION_CREATED
    from greenroom.tools.subagents import task_plugin

    async def dump(args: NoArgs, invocation: ToolInvocation) -> str:
        return "y" * 3_000

    model = Family(2_500)
    async with open_runtime(model=model, tools=[Tool("dump", "dump", NoArgs, dump)]) as rt:
        await rt.plug("tool-task", task_plugin)
        sessions: list[Session] = []
        rt.hooks.on(SESSION_CREATED, sessions.append)
        parent = await new_agent(rt, session_id="p")
        for n in range(8):
            answer = await parent.run(f"question {n}")
            assert answer.text == "done"
        events = list(parent.session.events)
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [r.content for r in results] == ["R" * 1_500] * 8
    degraded = compactions(events)
    assert degraded
    assert all(c.degraded for c in degraded)
    assert not {cut.seq for c in degraded for cut in c.cuts} & {r.seq for r in results}
    children = [s for s in sessions if s.id != "p"]
    assert len(children) == 8
    for child in children:  # each compacted its own history: the dumps cut
        (compacted, *_) = compactions(child.events)
        assert compacted.cuts
    assert max(model.sizes) <= model.limit


async def test_compact_asked_in_a_turns_last_step_runs_when_the_turn_ends() -> None:
    model = Windowed(100_000, script=[("tool", "look", "{}")])

    async def look(args: NoArgs, invocation: ToolInvocation) -> str:
        return "looked"

    tool = Tool("look", "look", NoArgs, look)
    async with open_runtime(model=model, tools=[tool]) as rt:
        agent = await new_agent(rt)
        for n in range(5):
            await agent.run(f"question {n}")
        prompt = agent.send("last one")
        while model.answers < 6:  # the answer's step has begun: no step follows it
            await trio.sleep(0.001)
        agent.compact()
        await agent.when_idle()
        assert prompt.settled
        events = list(agent.session.events)
    (compacted,) = compactions(events)
    starts = [e for e in events if isinstance(e, TurnStart)]
    assert starts[-1].trigger == CompactionTrigger(USER)
    assert compacted.turn == starts[-1].turn == 7


async def test_compact_of_a_model_without_a_window_summarizes_and_cuts_nothing() -> None:
    model = Windowed(100_000)
    del model.context_window
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(6):
            await agent.run(f"question {n} " + "words " * 100)
        agent.compact()
        await agent.when_idle()
        (compacted,) = compactions(agent.session.events)
        history = [m.content for m in agent.session.messages()]
    assert compacted.summary == "summary 1"
    assert compacted.cuts == []
    assert compacted.last_turn >= 3
    assert "question 5 " + "words " * 100 in history  # the newest turn stays verbatim


async def test_the_embedder_sees_a_compaction_in_prompt_events() -> None:
    model = Windowed(100_000)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(5):
            await agent.run(f"question {n}")
        prompt = agent.send("one more")
        agent.compact()
        seen = [event async for event in prompt.events()]
    kinds = [type(event).__name__ for event in seen]
    assert kinds.index("CompactionStart") < kinds.index("Compacted")
    assert kinds.index("Compacted") < kinds.index("AssistantChunk")
    assert kinds[-1] == "TurnEnd"


async def test_compact_refuses_instructions_that_are_not_text_and_a_disposed_agent() -> None:
    from greenroom.actors.types import AgentDisposed

    async with open_runtime(model=Windowed(100_000)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        with pytest.raises(TypeError, match="compaction instructions must be text"):
            handle.agent.compact(5)  # type: ignore[arg-type]
        await handle.agent.when_idle()
        assert not compactions(handle.agent.session.events)
        await handle.dispose()
        with pytest.raises(AgentDisposed):
            handle.agent.compact()


# -- ACP: the unstable compaction entity, for a client that declares it ----------------------

#: ACP's unstable schema (schema/v1/schema.unstable.json of agentclientprotocol/
#: agent-client-protocol) for the two updates, a text block their only content (greenroom
#: sends no other), and no member it does not name: a misspelt one fails.
_COMPACTION_SCHEMA: dict[str, Any] = {
    "$defs": {
        "ContentBlock": {
            "type": "object",
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
            "required": ["type", "text"],
            "additionalProperties": False,
        },
        "CompactionStatus": {"enum": ["in_progress", "completed", "failed", "cancelled"]},
    },
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "sessionUpdate": {"const": "compaction_update"},
                "compactionId": {"type": "string"},
                "status": {"$ref": "#/$defs/CompactionStatus"},
                "summary": {"type": ["array", "null"], "items": {"$ref": "#/$defs/ContentBlock"}},
                "error": {"type": ["string", "null"]},
                "_meta": {"type": ["object", "null"]},
            },
            "required": ["sessionUpdate", "compactionId", "status"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "sessionUpdate": {"const": "compaction_summary_chunk"},
                "compactionId": {"type": "string"},
                "content": {"$ref": "#/$defs/ContentBlock"},
                "_meta": {"type": ["object", "null"]},
            },
            "required": ["sessionUpdate", "compactionId", "content"],
            "additionalProperties": False,
        },
    ],
}

#: A summary of several chunks (each line numbered, so a chunk out of order shows).
_LONG_SUMMARY = (
    "## Retained context\n\n"
    + "".join(f"- fact {n}: the numbers were {n * 7} and {n * 11}\n" for n in range(400)).strip()
)  # as the compaction logs it


class Summarizing(Windowed):
    """`Windowed`, but its summary is `text`, streamed in deltas of 1,000 characters."""

    def __init__(self, text: str) -> None:
        super().__init__(100_000)
        self.text = text

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        if request.system != SUMMARY_SYSTEM:
            async for chunk in super()._reply(request):
                yield chunk
            return
        for start in range(0, len(self.text), 1_000):
            yield TextDelta(self.text[start : start + 1_000])
        yield Finish("stop")


def _check_frames(frames: list[dict[str, Any]]) -> None:
    """Every frame JSON-RPC 2.0; every compaction update as ACP's unstable schema says."""
    import jsonschema

    for frame in frames:
        assert frame["jsonrpc"] == "2.0", frame
        if "method" not in frame:
            assert "id" in frame, frame
            assert ("result" in frame) != ("error" in frame), frame
        elif frame["method"] == "session/update":
            update = frame["params"]["update"]
            if update["sessionUpdate"].startswith("compaction"):
                jsonschema.validate(update, _COMPACTION_SCHEMA)


def _compaction_shown(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [u for u in updates if u["sessionUpdate"].startswith("compaction")]


async def _compacted_over_acp(
    root: Path, model: Windowed, capabilities: dict[str, Any]
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Three prompts, ``/compact``, one more prompt over ACP, then a load on a new
    connection; the session, its live updates and its replayed ones (both checked by
    `_check_frames`)."""
    from tests.acp_peer import bridge

    def prompt(session: str, text: str) -> dict[str, Any]:
        return {"sessionId": session, "prompt": [{"type": "text", "text": text}]}

    initialize = {"protocolVersion": 1, "clientCapabilities": capabilities}
    async with bridge(root, model) as b:
        assert "result" in await b.peer.call("initialize", initialize)
        session = await b.peer.new_session()
        for n in range(3):
            await b.peer.call("session/prompt", prompt(session, f"question {n}"))
        answer = await b.peer.call("session/prompt", prompt(session, "/compact"))
        assert answer["result"]["stopReason"] == "end_turn"
        await b.peer.call("session/prompt", prompt(session, "and then"))
        live = b.peer.updates(session)
        _check_frames(b.peer.frames)
    async with bridge(root, Windowed(100_000)) as b:
        assert "result" in await b.peer.call("initialize", initialize)
        load = {"sessionId": session, "cwd": "/tmp", "mcpServers": []}
        assert "result" in await b.peer.call("session/load", load)
        replayed = b.peer.updates(session)
        _check_frames(b.peer.frames)
    return session, live, replayed


async def test_a_client_declaring_compaction_sees_the_entity_live_and_on_load(
    tmp_path: Path,
) -> None:
    capabilities = {"session": {"compaction": {}}}
    session, live, replayed = await _compacted_over_acp(
        tmp_path, Summarizing(_LONG_SUMMARY), capabilities
    )
    for updates in (live, replayed):
        assert not any("Compacted " in u.get("content", {}).get("text", "") for u in updates)

    # Live: in_progress, the summary in chunks (in order), completed; then the usage.
    shown = _compaction_shown(live)
    start, *chunks, end = shown
    (compaction_id,) = {u["compactionId"] for u in shown}
    assert compaction_id.startswith(f"{session}/")
    assert start == {
        "sessionUpdate": "compaction_update",
        "compactionId": compaction_id,
        "status": "in_progress",
    }
    assert len(chunks) == -(-len(_LONG_SUMMARY) // SUMMARY_CHUNK_CHARS) > 1
    assert {c["sessionUpdate"] for c in chunks} == {"compaction_summary_chunk"}
    assert "".join(c["content"]["text"] for c in chunks) == _LONG_SUMMARY
    assert (end["status"], "summary" in end) == ("completed", False)  # the chunks' stays
    facts = end["_meta"]["greenroom"]
    assert (facts["first_turn"], facts["model"]) == (1, "default")
    assert facts["last_turn"] >= 2
    assert facts["tokens_before"] > 0
    assert "degraded" not in facts
    after = live[live.index(end) + 1]
    assert (after["sessionUpdate"], after["used"]) == ("usage_update", facts["tokens_after"])

    # Replayed: one completed update carrying the whole summary, at the same place.
    (materialized,) = _compaction_shown(replayed)
    assert materialized == {
        "sessionUpdate": "compaction_update",
        "compactionId": compaction_id,
        "status": "completed",
        "summary": [{"type": "text", "text": _LONG_SUMMARY}],
        "_meta": end["_meta"],
    }
    at = replayed.index(materialized)
    assert replayed[at + 1]["sessionUpdate"] == "usage_update"
    users = [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"]
    before = [u for u in replayed[:at] if u["sessionUpdate"] == "user_message_chunk"]
    assert users == ["question 0", "question 1", "question 2", "and then"]
    assert len(before) == 3


@pytest.mark.parametrize(
    "capabilities",
    [{}, {"session": None}, {"session": {}}, {"session": {"compaction": None}}],
    ids=["no-session", "null-session", "no-compaction", "null-compaction"],
)
async def test_a_client_not_declaring_compaction_sees_an_agent_message(
    tmp_path: Path, capabilities: dict[str, Any]
) -> None:
    summary = "the numbers were 7 and 11"
    _, live, replayed = await _compacted_over_acp(tmp_path, Summarizing(summary), capabilities)
    for updates in (live, replayed):
        assert not _compaction_shown(updates)
        (notice,) = [u for u in updates if "Compacted " in u.get("content", {}).get("text", "")]
        assert notice["sessionUpdate"] == "agent_message_chunk"
        assert notice["content"]["text"].endswith(f"turns: {summary}\n")
        assert updates[updates.index(notice) + 1]["sessionUpdate"] == "usage_update"


async def test_a_degraded_compaction_says_why_and_sends_no_empty_summary(
    tmp_path: Path,
) -> None:
    """The summary call fails and cutting tool outputs was enough (nothing dropped, so no
    summary, not even a marker): the entity completes without one, and
    ``_meta.greenroom.degraded`` says why."""
    capabilities = {"session": {"compaction": {}}}
    _, live, replayed = await _compacted_over_acp(
        tmp_path, Windowed(100_000, summary="fail"), capabilities
    )
    start, end = _compaction_shown(live)
    assert (start["status"], end["status"]) == ("in_progress", "completed")
    facts = end["_meta"]["greenroom"]
    assert "the summarizer is down" in facts["degraded"]
    assert facts["model"] == ""
    (materialized,) = _compaction_shown(replayed)
    assert materialized["status"] == "completed"
    assert "summary" not in materialized
    assert materialized["_meta"] == end["_meta"]


@pytest.mark.parametrize(
    ("capabilities", "named"),
    [
        ({"session": {"compaction": True}}, "$.clientCapabilities.session.compaction"),
        ({"session": []}, "$.clientCapabilities.session"),
    ],
)
async def test_a_malformed_compaction_capability_is_refused_by_name(
    capabilities: dict[str, Any], named: str
) -> None:
    from tests.acp_peer import bridge

    async with bridge(None, Windowed(100_000)) as b:
        initialize = {"protocolVersion": 1, "clientCapabilities": capabilities}
        refused = await b.peer.call("initialize", initialize)
        assert refused["error"]["code"] == -32602
        assert f"at `{named}`" in refused["error"]["message"]
        assert "result" in await b.peer.call("initialize", {"protocolVersion": 1})
        assert await b.peer.new_session()
