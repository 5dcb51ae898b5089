"""Compaction that cannot kill a session: attacked as a hostile or merely unlucky model would.

A bounded summary, the window learned from a refusal, the estimate's rate corrected,
a failing summarizer bounded and visible, the turn's goal carried past the summary,
instructions capped. Virtual time unless marked; the loopback server speaks OpenAI's
wire format and refuses as OpenAI does.
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
from hypothesis import given, settings
from hypothesis import strategies as st

from greenroom import open_runtime
from greenroom.acp.presenter import INTERRUPTED_COMPACTION, Presenter
from greenroom.actors.compaction import (
    CARRIED_SHARE,
    MAX_INSTRUCTIONS,
    SUMMARY_SYSTEM,
    WINDOW_KEY,
    CompactionPolicy,
    bounded_summary,
)
from greenroom.backoff import Backoff
from greenroom.models.base import ContextOverflow
from greenroom.models.openai import OpenAIChatModel
from greenroom.protocol.acp import UsageUpdate
from greenroom.protocol.events import (
    AssistantMessage,
    Compacted,
    CompactionStart,
    ConfigSet,
    ModelRetry,
    SessionEvent,
    TurnEnd,
    TurnResumed,
    UserMessage,
)
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    Usage,
)
from greenroom.session import Session
from greenroom.session.persistence import JsonlPersistence
from greenroom.tools import Tool
from greenroom.tools.todo import todo_plugin
from tests import ROOT, TESTS
from tests.agents_helpers import assert_enclosed, new_agent
from tests.sse_server import Hold, Seen, Served, sse, sse_server
from tests.wire import oai, oai_usage


def compactions(events: Any) -> list[Compacted]:
    return [e for e in events if isinstance(e, Compacted)]


def starts(events: Any) -> list[CompactionStart]:
    return [e for e in events if isinstance(e, CompactionStart)]


class NoArgs(msgspec.Struct):
    pass


# -- the summary's bound ----------------------------------------------------------------------


def test_a_summary_past_its_budget_is_cut_at_a_line_with_a_marker() -> None:
    lines = [f"- fact {n}: the numbers were {n * 7}" for n in range(200)]
    summary = "\n".join(lines)
    text, why = bounded_summary(summary, 1_000)
    assert why is not None
    assert len(text.encode()) <= 1_000
    kept, marker = text.rsplit("\n", 1)
    assert kept.split("\n") == lines[: len(kept.split("\n"))]  # whole lines only
    assert marker.startswith("[the summary was cut here:")
    assert "past the summary's budget" in why
    assert bounded_summary("short\nenough", 1_000) == ("short\nenough", None)
    stopped, why = bounded_summary("line one\nline two, unfinish", 1_000, limited=True)
    assert stopped.startswith("line one\n[the summary was cut here:")
    assert why is not None
    assert "output limit" in why
    wide = "字" * 2_000  # 6,000 bytes, one line: cut by bytes, at a character
    text, _ = bounded_summary(wide, 1_000)
    assert len(text.encode()) <= 1_000


@given(
    summary=st.text(min_size=1, max_size=3_000),
    limit=st.integers(min_value=200, max_value=2_000),
    limited=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_any_summary_leaves_within_its_budget(summary: str, limit: int, limited: bool) -> None:
    text, why = bounded_summary(summary, limit, limited)
    if why is None:
        assert text == summary
        assert len(summary.encode()) <= limit
        return
    assert len(text.encode()) <= limit
    kept = text.rpartition("\n[the summary was cut here:")[0]
    assert summary.startswith(kept)


# -- a provider that holds 6,000 tokens, and hostile summaries -------------------------------

#: The server's window: 6,000 tokens at 4 characters a token of its messages.
WINDOW = 6_000
WINDOW_CHARS = 4 * WINDOW


class SmallServer:
    """An OpenAI-compatible server holding `WINDOW` tokens (4 characters a token of its
    messages' texts and calls): a longer request is refused as OpenAI refuses it (HTTP 400,
    ``context_length_exceeded``, "maximum context length is 6000 tokens"); a summarizing
    request is answered as `hostile` says; any other ``answer N``, with its usage."""

    def __init__(self, hostile: str) -> None:
        self.hostile = hostile
        self.refusals = 0
        self.answers = 0
        self.summaries: list[dict[str, Any]] = []
        self.sizes: list[int] = []

    def __call__(self, seen: Seen) -> Served:
        body = seen.body
        messages = body["messages"]
        chars = sum(len(m.get("content") or "") for m in messages)
        chars += sum(
            len(c["function"]["arguments"]) for m in messages for c in m.get("tool_calls", ())
        )
        if chars > WINDOW_CHARS:
            self.refusals += 1
            error = {
                "message": f"This model's maximum context length is {WINDOW} tokens. However,"
                f" your messages resulted in {chars // 4} tokens. Please reduce the length of"
                " the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
            return Served(400, body=json.dumps({"error": error}).encode())
        self.sizes.append(chars)
        if messages[0]["content"] == SUMMARY_SYSTEM:
            self.summaries.append(body)
            return self._summary(len(self.summaries))
        self.answers += 1
        return Served(pieces=_text(f"answer {self.answers}", chars // 4))

    def _summary(self, n: int) -> Served:
        match self.hostile:
            case "huge":  # 3x the window, whatever it was asked
                return Served(pieces=_text(_lines(3 * WINDOW_CHARS), 3 * WINDOW))
            case "growing":
                return Served(pieces=_text(_lines(n * 8_000), n * 2_000))
            case "empty":
                return Served(pieces=_text("", 0))
            case "http-500":
                return Served(500, body=b'{"error": {"message": "the summarizer is down"}}')
            case _:  # "hang": headers, then nothing
                return Served(pieces=[Hold()])


def _lines(chars: int) -> str:
    return "".join(
        f"- the user asked about item {n:06d} and we answered\n" for n in range(chars // 50)
    )


def _text(text: str, prompt: int) -> list[bytes]:
    deltas = [oai({"content": text[i : i + 2_000]}) for i in range(0, len(text), 2_000)]
    return sse(*deltas, oai(finish="stop"), oai_usage(prompt, 3), "[DONE]")


#: Retries over in a fraction of a second (the summarizer's 500s among them).
QUICK = Backoff(initial=0.01, maximum=0.02, multiplier=2.0, jitter=0.0)


@pytest.mark.real_clock
@pytest.mark.parametrize("hostile", ["huge", "growing", "empty", "http-500", "hang"])
@pytest.mark.parametrize("given", [False, True], ids=["window-unknown", "window-given"])
async def test_sixty_prompts_through_a_small_window_survive_hostile_summaries(
    hostile: str, given: bool
) -> None:
    server = SmallServer(hostile)
    filler = "tell me more about the items and what they do next; " * 18  # ~950 characters
    with trio.fail_after(120):
        async with sse_server(server) as http:
            model = OpenAIChatModel(
                http.url + "/v1",
                "sk-test",
                "local-model",
                context_window=WINDOW if given else None,
                backoff=QUICK,
                retry_budget=0.1,
            )
            policy = CompactionPolicy(deadline=0.5)
            async with open_runtime(model=model, compaction=policy) as rt:
                agent = await new_agent(rt)
                for n in range(60):
                    answer = await agent.run(f"question {n}: {filler}")
                    assert answer.stop_reason == "completed", (n, answer.reason)
                    assert answer.text.startswith("answer ")
                events = list(agent.session.events)
    assert server.answers == 60
    assert server.refusals == (0 if given else 1)
    assert max(server.sizes) <= WINDOW_CHARS
    assert_enclosed(events)
    done = compactions(events)
    assert len(done) >= 3
    budget = int(0.1 * WINDOW * 4)  # the summary's share of the window, in bytes
    for compacted in done:
        assert isinstance(events[compacted.started], CompactionStart)
        assert len(compacted.summary.encode()) <= budget
        assert compacted.tokens_after < 0.5 * WINDOW
    if not given:  # the refusal taught the window: logged for a resumed session
        learned = [e for e in events if isinstance(e, ConfigSet) and e.key.startswith(WINDOW_KEY)]
        assert [(e.key, e.value) for e in learned] == [(WINDOW_KEY + "default", str(WINDOW))]
        assert starts(events)[0].cause == "overflow"
        assert all(s.cause == "threshold" for s in starts(events)[1:])
    for body in server.summaries:  # each summarizing request asks for at most its share
        assert body["max_tokens"] == WINDOW // 10
    if hostile in ("huge", "growing"):
        assert all(c.cut and c.degraded is None for c in done)
        assert all(c.summary.endswith("]") for c in done)
    else:
        reasons = {c.degraded for c in done}
        assert None not in reasons
        expected = {"empty": "summary was empty", "http-500": "HTTP 500", "hang": "0.5 s"}
        assert all(expected[hostile] in (r or "") for r in reasons), reasons
    if hostile == "http-500":  # the summarizer's retries are shown as a step's are
        assert any(isinstance(e, ModelRetry) and "HTTP 500" in e.error for e in events)


# -- a virtual provider: its own tokenizer, its own window ------------------------------------


class Provider:
    """A model of `limit` tokens at `rate` bytes a token of the request (its system
    prompt, its tools, each message's texts and 24 bytes of framing): a longer request is
    refused (`ContextOverflow`, the limit named as Anthropic names it). A summarizing
    request is answered as `summary` says, any other with ``answer N`` (and its usage,
    unless `usage` is false) or the script's next tool call. `window` is what the adapter
    says it holds (None: nothing)."""

    def __init__(
        self,
        limit: int,
        *,
        window: int | None = None,
        rate: float = 4.0,
        usage: bool = True,
        summary: str = "ok",
        script: list[tuple[str, str]] | None = None,
    ) -> None:
        self.limit = limit
        if window is not None:
            self.context_window = window
        self.rate = rate
        self.usage = usage
        self.summary = summary
        self.script = list(script or [])
        self.requests: list[ModelRequest] = []
        self.sizes: list[int] = []
        self.refusals = 0
        self.answers = 0

    def tokens(self, request: ModelRequest) -> int:
        size = len((request.system or "").encode()) + len(msgspec.json.encode(request.tools))
        for message in request.messages:
            size += 24 + len(message.content.encode())
            for call in getattr(message, "tool_calls", ()):
                size += len(call.name) + len(call.arguments.encode())
        return int(size / self.rate) + 1

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply(request)

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        size = self.tokens(request)
        await trio.sleep(0.01)
        if size > self.limit:
            self.refusals += 1
            raise ContextOverflow(
                f"prompt is too long: {size} tokens > {self.limit} maximum",
                "context-overflow",
                window=self.limit,
            )
        self.requests.append(request)
        self.sizes.append(size)
        if request.system == SUMMARY_SYSTEM:
            async for chunk in self._summary(request):
                yield chunk
            return
        if self.script:
            name, arguments = self.script.pop(0)
            yield ToolCallChunk(f"call-{len(self.script)}", name, arguments)
            yield Finish("tool-calls")
            return
        self.answers += 1
        yield TextDelta(f"answer {self.answers}")
        if self.usage:
            yield Usage(input_tokens=size, output_tokens=3)
        yield Finish("stop")

    async def _summary(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        match self.summary:
            case "ok":
                yield TextDelta("the user asked questions; each was answered")
            case "empty":
                yield TextDelta("   ")
            case "refusal":
                yield TextDelta("I can't help with that")
                yield Finish("refusal")
                return
            case "error":
                yield Finish("error", "the summarizer broke down")
                return
            case "huge":  # ignores its output limit
                for _ in range(1_000):
                    yield TextDelta("the user asked about many things at great length\n")
            case "limited":  # stops at its output limit, mid-line
                yield TextDelta("the goal: answer questions\nthe last one was abou")
                yield Finish("max-tokens")
                return
            case "fail":
                raise RuntimeError("the summarizer is down")
            case _:  # "hang"
                await trio.sleep_forever()
        yield Finish("stop")


def _asked(model: Provider) -> list[int]:
    return [
        size
        for size, r in zip(model.sizes, model.requests, strict=True)
        if r.system != SUMMARY_SYSTEM
    ]


@pytest.mark.parametrize(
    "summary", ["empty", "refusal", "error", "huge", "limited", "fail", "hang"]
)
async def test_every_bad_summary_ends_in_a_compaction_and_the_turn_goes_on(summary: str) -> None:
    model = Provider(1_500, window=1_500, summary=summary)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(40):
            answer = await agent.run(f"question {n} " + "words " * 30)
            assert answer.stop_reason == "completed", (n, answer.reason)
        events = list(agent.session.events)
    assert model.answers == 40
    assert model.refusals == 0
    assert_enclosed(events)
    done = compactions(events)
    assert len(done) >= 2
    assert len(starts(events)) == len(done)
    for compacted in done:
        assert isinstance(events[compacted.started], CompactionStart)
        assert len(compacted.summary.encode()) <= 0.1 * 1_500 * 4
    if summary in ("huge", "limited"):  # written, but cut: a marker says so
        assert all(c.cut is not None and c.degraded is None for c in done)
    else:  # none could be written: why is in the log
        why = {
            "empty": "summary was empty",
            "refusal": "finished refusal",
            "error": "broke down",
            "fail": "summarizer is down",
            "hang": "took longer than 30 s",
        }[summary]
        assert all(why in (c.degraded or "") for c in done), [c.degraded for c in done]


async def test_a_refusal_teaches_the_window_once_and_a_resumed_session_keeps_it(
    tmp_path: Path,
) -> None:
    model = Provider(2_000)  # the adapter says nothing of its window
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        for n in range(60):
            answer = await handle.agent.run(f"question {n} " + "words " * 40)
            assert answer.stop_reason == "completed"
        first = list(handle.agent.session.events)
        await handle.dispose()
    assert model.refusals == 1
    assert [(e.key, e.value) for e in first if isinstance(e, ConfigSet)] == [
        (WINDOW_KEY + "default", "2000")
    ]
    assert len(compactions(first)) >= 3  # proactive from then on
    model.refusals = 0
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s")
        session = handle.agent.session
        for n in range(60, 120):
            answer = await handle.agent.run(f"question {n} " + "words " * 40)
            assert answer.stop_reason == "completed"
        events = list(session.events)
        last = next(e for e in reversed(events) if isinstance(e, AssistantMessage))
        (usage,) = Presenter(["default"], {"default": 128_000}).present(session, last, replay=True)
        await handle.dispose()
    assert model.refusals == 0
    assert len(compactions(events)) > len(compactions(first))
    assert isinstance(usage, UsageUpdate)
    assert usage.size == 2_000


async def test_a_given_window_larger_than_the_real_one_is_corrected_by_the_refusal() -> None:
    model = Provider(2_000, window=8_000)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(120):
            answer = await agent.run(f"question {n} " + "words " * 20)
            assert answer.stop_reason == "completed"
    assert model.refusals == 1


@pytest.mark.parametrize("rate", [2.0, 3.0])
async def test_the_rate_is_corrected_by_what_the_provider_reports(rate: float) -> None:
    """A denser tokenizer than 4 bytes a token (CJK text, code): the replies' reported
    input tokens correct the rate, so no request past the given window is sent."""
    model = Provider(2_000, window=2_000, rate=rate)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(150):
            answer = await agent.run(f"question {n} " + "words " * 20 + "x" * (n % 7) * 300)
            assert answer.stop_reason == "completed", (n, answer.reason)
        events = list(agent.session.events)
    assert model.refusals == 0
    assert compactions(events)


async def test_a_model_reporting_no_usage_keeps_a_margin_below_the_threshold() -> None:
    """3.2 bytes a token, never reported: the bytes rule alone counts a fifth too few, which
    the threshold taken lower absorbs (at the threshold itself this provider refuses)."""
    model = Provider(2_000, window=2_000, rate=3.2, usage=False)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        for n in range(150):
            answer = await agent.run(f"question {n} " + "words " * 20)
            assert answer.stop_reason == "completed", (n, answer.reason)
        events = list(agent.session.events)
    assert model.refusals == 0
    assert max(_asked(model)) <= 2_000
    assert compactions(events)


# -- the goal survives compaction -------------------------------------------------------------

GOAL = "Port the billing module to the new ledger API and keep every test green."


async def test_a_long_turn_keeps_the_users_request_and_the_open_plan_verbatim() -> None:
    plan = {
        "entries": [
            {"content": "read the old module", "priority": "high", "status": "completed"},
            {"content": "port the ledger calls", "priority": "high", "status": "in_progress"},
            {"content": "run the tests", "priority": "medium", "status": "pending"},
        ]
    }
    script = [("todo", json.dumps(plan))] + [("dump", "{}")] * 12
    model = Provider(3_000, window=3_000, script=script)

    async def dump(args: NoArgs, invocation: Any) -> str:
        return "y" * 2_500

    async with open_runtime(model=model, tools=[Tool("dump", "dump", NoArgs, dump)]) as rt:
        await rt.plug("tool-todo", todo_plugin)
        agent = await new_agent(rt)
        answer = await agent.run(GOAL)
        events = list(agent.session.events)
    assert answer.stop_reason == "completed"
    done = compactions(events)
    assert len(done) >= 3
    first = events[done[0].seq]
    after = [
        r
        for r in model.requests
        if r.system != SUMMARY_SYSTEM and any("<summary" in m.content for m in r.messages)
    ]
    assert len(after) >= 10
    for request in after:  # every request after a compaction: the goal, then the plan
        contents = [m.content for m in request.messages]
        assert GOAL in contents
        (shown,) = [c for c in contents if c.startswith("<plan")]
        assert "[in_progress] port the ledger calls" in shown
        assert "[pending] run the tests" in shown
        assert "read the old module" not in shown  # done: not carried
    assert first.carried
    assert max(_asked(model)) <= 3_000
    summarizing = [r for r in model.requests if r.system == SUMMARY_SYSTEM]
    assert all("the user's goal first" in r.messages[0].content for r in summarizing)


async def test_a_huge_request_is_carried_cut_to_its_share() -> None:
    huge = "Do this: " + "and this " * 2_000  # ~18,000 characters: more than the window
    model = Provider(3_000, window=3_000, script=[("dump", "{}")] * 8)

    async def dump(args: NoArgs, invocation: Any) -> str:
        return "y" * 2_500

    async with open_runtime(model=model, tools=[Tool("dump", "dump", NoArgs, dump)]) as rt:
        agent = await new_agent(rt)
        await agent.run("hello")
        answer = await agent.run(huge)
        events = list(agent.session.events)
    assert answer.stop_reason == "completed"
    assert model.refusals == 0
    assert max(_asked(model)) <= 3_000
    assert any(c.carried for c in compactions(events))
    (goal,) = [m.content for m in model.requests[-1].messages if m.content.startswith("Do this: ")]
    assert "characters were cut" in goal
    assert len(goal) <= CARRIED_SHARE * 0.3 * 3_000 * 4 + 200  # its share of the verbatim part


# -- instructions are bounded ------------------------------------------------------------------


async def test_instructions_past_the_cap_are_refused_naming_it() -> None:
    model = Provider(100_000, window=100_000)
    async with open_runtime(model=model) as rt:
        agent = await new_agent(rt)
        await agent.run("hello")
        with pytest.raises(ValueError, match=f"past the cap of {MAX_INSTRUCTIONS:,}"):
            agent.compact("x" * 1_000_000)
        await agent.when_idle()
        assert not compactions(agent.session.events)
        agent.compact("y" * MAX_INSTRUCTIONS)  # at the cap: taken
        await agent.when_idle()
        (compacted,) = compactions(agent.session.events)
    assert compacted.instructions == "y" * MAX_INSTRUCTIONS


async def test_compact_over_acp_with_instructions_past_the_cap_is_invalid_params(
    tmp_path: Path,
) -> None:
    from tests.acp_peer import bridge

    async with bridge(tmp_path, Provider(100_000, window=100_000)) as b:
        session = await b.peer.new_session()
        text = "/compact " + "z" * 1_000_000
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
        refused = await b.peer.call("session/prompt", prompt)
        assert refused["error"]["code"] == -32602
        assert f"past the cap of {MAX_INSTRUCTIONS:,}" in refused["error"]["message"]
        answered = await b.peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]}
        )
        assert answered["result"]["stopReason"] == "end_turn"


# -- visible: the start and the end, to every client ------------------------------------------


async def test_a_client_not_declaring_compaction_is_told_it_started_and_how_it_ended(
    tmp_path: Path,
) -> None:
    from tests.acp_peer import bridge

    def prompt(session: str, text: str) -> dict[str, Any]:
        return {"sessionId": session, "prompt": [{"type": "text", "text": text}]}

    async with bridge(tmp_path, Provider(100_000, window=100_000, summary="fail")) as b:
        session = await b.peer.new_session()
        for n in range(3):
            await b.peer.call("session/prompt", prompt(session, f"question {n}"))
        await b.peer.call("session/prompt", prompt(session, "/compact"))
        live = b.peer.updates(session)
    async with bridge(tmp_path, Provider(100_000, window=100_000)) as b:
        load = {"sessionId": session, "cwd": "/tmp", "mcpServers": []}
        assert "result" in await b.peer.call("session/load", load)
        replayed = b.peer.updates(session)
    for updates in (live, replayed):
        texts = [
            (u.get("messageId"), u["content"]["text"])
            for u in updates
            if u["sessionUpdate"] == "agent_message_chunk"
        ]
        (started,) = [t for t in texts if t[1].startswith("Compacting the conversation")]
        (ended,) = [t for t in texts if t[1].startswith("Compacted ")]
        assert "as asked" in started[1]
        assert "without a summary" in ended[1]
        assert "summarizer is down" in ended[1]
        assert started[0] == ended[0]  # one message: the start, then how it ended
        assert texts.index(started) < texts.index(ended)


# -- SIGKILL during each kind of compaction ---------------------------------------------------


async def _killed_in_compaction(root: Path, kind: str, delay: float) -> None:
    child = TESTS / "compaction_child.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await trio.lowlevel.open_process(
        [sys.executable, str(child), str(root), kind], stdout=subprocess.PIPE, env=env
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


def _nothing_lost(events: list[SessionEvent]) -> list[str]:
    """Every prompt is there, in order; every compaction's end names its start, and a
    start without an end is the crash's: the last one, nothing after it but its turn's
    closers. The prompts."""
    asked = [e.content for e in events if isinstance(e, UserMessage)]
    assert asked == [f"question {n}" for n in range(len(asked))]
    ended = {c.started for c in compactions(events)}
    for compacted in compactions(events):
        assert isinstance(events[compacted.started], CompactionStart)
    dangling = [s for s in starts(events) if s.seq not in ended]
    assert len(dangling) <= 1
    return asked


@pytest.mark.real_clock
@pytest.mark.parametrize("kind", ["ok", "huge", "fail", "hang", "overflow"])
async def test_sigkill_during_each_kind_of_compaction_loses_nothing(
    tmp_path: Path, kind: str
) -> None:
    from tests.compaction_child import Model

    with trio.fail_after(60):
        await _killed_in_compaction(tmp_path, kind, 0.01)
    persistence = JsonlPersistence(tmp_path)
    header, events = await persistence.load("s")
    asked = _nothing_lost(events)
    history = list(Session(header, events).messages())
    assert history
    if kind == "hang":  # the start was written ahead of the call the kill cut
        (dangling,) = [
            s for s in starts(events) if s.seq not in {c.started for c in compactions(events)}
        ]
        assert isinstance(events[-1], TurnEnd)  # repaired in memory: interrupted
        assert dangling.cause == "threshold"
    # Carried on where the log stops: the cut turn compacts again and is answered.
    with trio.fail_after(60):
        async with open_runtime(model=Model("ok", delay=0), persistence=persistence) as rt:
            handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
            if handle.resumed is not None:
                resumed = await handle.resumed
                assert resumed.stop_reason == "completed"
            after = await handle.agent.run("one more")
            assert after.stop_reason == "completed"
            events = list(handle.agent.session.events)
            await handle.dispose()
    assert_enclosed(events)
    assert [e.content for e in events if isinstance(e, UserMessage)] == [*asked, "one more"]
    resumed_at = next((e.seq for e in events if isinstance(e, TurnResumed)), len(events))
    finished = {c.started for c in compactions(events)}
    assert all(s.seq in finished for s in starts(events) if s.seq > resumed_at)


@pytest.mark.real_clock
async def test_a_compaction_a_crash_cut_is_replayed_as_failed(tmp_path: Path) -> None:
    from tests.acp_peer import bridge
    from tests.compaction_child import Model

    with trio.fail_after(60):
        await _killed_in_compaction(tmp_path, "hang", 0.01)
    header, _ = await JsonlPersistence(tmp_path).load("s")
    load = {"sessionId": "s", "cwd": header.cwd, "mcpServers": []}
    declaring = {"protocolVersion": 1, "clientCapabilities": {"session": {"compaction": {}}}}
    with trio.fail_after(60):
        async with bridge(tmp_path, Model("ok", delay=0)) as b:
            assert "result" in await b.peer.call("initialize", declaring)
            assert "result" in await b.peer.call("session/load", load)
            replayed = b.peer.updates("s")
    failed = [u for u in replayed if u.get("status") == "failed"]
    (update,) = failed
    assert update["sessionUpdate"] == "compaction_update"
    assert update["error"] == INTERRUPTED_COMPACTION
    assert all(
        u.get("status") == "completed"
        for u in replayed
        if u["sessionUpdate"] == "compaction_update" and u is not update
    )
