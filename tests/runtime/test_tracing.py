"""`greenroom.tracing`: the spans of turns, model calls and tool calls, read back from the SDK's
in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from greenroom import open_runtime, tool
from greenroom.models import CallTool, Fail, Hang, Say, ScriptedModel
from greenroom.models.anthropic import AnthropicModel
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta, Usage
from greenroom.tools.subagents import task_plugin
from greenroom.tracing import tracing
from tests.models.test_adapters import KEY, LIMIT, STREAMS
from tests.sse_server import Served, sse_server


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.shutdown()


def provider_of(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


class Acme:
    """A model that reports its tokens, and names its provider and model as the HTTP adapters do."""

    provider = "acme"
    model_name = "acme-1"

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply()

    async def _reply(self) -> AsyncIterator[StreamChunk]:
        await trio.lowlevel.checkpoint()
        yield TextDelta("hello")
        yield Usage(9, 2)
        yield Finish("stop")


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text


async def test_a_turn_its_model_calls_and_its_tool_call_are_spans(
    exporter: InMemorySpanExporter,
) -> None:
    model = ScriptedModel([[CallTool("echo", {"text": "hi"})], [Say("done")]])
    async with open_runtime(model=model, tools=[echo]) as rt:
        await rt.plug("tracing", tracing(rt.models, tracer_provider=provider_of(exporter)))
        handle = await rt.agents.create(agent_id="ada", session_id="s-ada")
        answer = await handle.agent.run("go")
    assert answer.stop_reason == "completed"
    spans = exporter.get_finished_spans()
    (turn,) = named(spans, "invoke_agent ")
    chats = named(spans, "chat ")
    (call,) = named(spans, "execute_tool ")
    assert turn.name == "invoke_agent ada"
    assert turn.parent is None
    assert dict(turn.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "ada",
        "gen_ai.agent.id": "ada",
        "gen_ai.conversation.id": "s-ada",
        "greenroom.turn": 1,
        "greenroom.turn.end": "completed",
    }
    assert [c.attributes["greenroom.step"] for c in chats if c.attributes] == [1, 2]
    assert {parent_of(s) for s in [*chats, call]} == {span_id(turn)}
    assert all(c.kind is SpanKind.CLIENT for c in chats)
    assert chats[0].attributes is not None
    assert chats[0].attributes["gen_ai.provider.name"] == "ScriptedModel"
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool-calls",)
    assert call.name == "execute_tool echo"
    assert call.attributes is not None
    assert call.attributes["gen_ai.tool.call.id"] == "call-1"
    assert call.attributes["gen_ai.conversation.id"] == "s-ada"
    assert call.status.status_code is StatusCode.UNSET
    # each span lies within its parent, and the model's first call ends before its tool runs
    for child in [*chats, call]:
        assert turn.start_time is not None
        assert child.start_time is not None
        assert turn.start_time <= child.start_time
        assert child.end_time is not None
        assert turn.end_time is not None
        assert child.end_time <= turn.end_time
    assert chats[0].end_time is not None
    assert call.start_time is not None
    assert chats[0].end_time <= call.start_time


async def test_a_model_call_carries_the_gen_ai_attributes(exporter: InMemorySpanExporter) -> None:
    async with open_runtime(model=Acme()) as rt:
        await rt.plug("tracing", tracing(rt.models, tracer_provider=provider_of(exporter)))
        handle = await rt.agents.create(agent_id="ada", session_id="s-ada")
        await handle.agent.run("go")
    (chat,) = named(exporter.get_finished_spans(), "chat ")
    assert chat.name == "chat acme-1"
    assert dict(chat.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "acme",
        "gen_ai.system": "acme",
        "gen_ai.request.model": "acme-1",
        "gen_ai.agent.id": "ada",
        "gen_ai.conversation.id": "s-ada",
        "greenroom.turn": 1,
        "greenroom.step": 1,
        "gen_ai.usage.input_tokens": 9,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.response.finish_reasons": ("stop",),
    }


@pytest.mark.real_clock  # a loopback server speaking the Messages API
async def test_the_anthropic_adapter_names_its_provider_and_model(
    exporter: InMemorySpanExporter,
) -> None:
    with trio.fail_after(LIMIT):
        async with sse_server([Served(pieces=STREAMS["anthropic"]["text"])]) as server:
            model = AnthropicModel(server.url, KEY, "claude-sonnet-4-5")
            async with open_runtime(model=model) as rt:
                await rt.plug("tracing", tracing(rt.models, tracer_provider=provider_of(exporter)))
                handle = await rt.agents.create(agent_id="ada", session_id="s-ada")
                assert (await handle.agent.run("hi")).stop_reason == "completed"
    (chat,) = named(exporter.get_finished_spans(), "chat ")
    attributes = dict(chat.attributes or {})
    assert chat.name == "chat claude-sonnet-4-5"
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.request.model"] == "claude-sonnet-4-5"
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        9,
        2,
    )


async def test_a_failed_turn_and_its_model_call_are_errors(
    exporter: InMemorySpanExporter,
) -> None:
    model = ScriptedModel([[Fail("the endpoint is down")]])
    async with open_runtime(model=model) as rt:
        await rt.plug("tracing", tracing(rt.models, tracer_provider=provider_of(exporter)))
        handle = await rt.agents.create(agent_id="ada", session_id="s-ada")
        assert (await handle.agent.run("go")).stop_reason == "error"
    spans = exporter.get_finished_spans()
    (turn,) = named(spans, "invoke_agent ")
    (chat,) = named(spans, "chat ")
    for span in (turn, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description is not None
        assert "the endpoint is down" in span.status.description
    assert turn.attributes is not None
    assert turn.attributes["greenroom.turn.end"] == "error"


async def test_a_sub_agent_nests_under_its_parents_tool_call(
    exporter: InMemorySpanExporter,
) -> None:
    model = ScriptedModel(
        [[CallTool("task", {"prompt": "count the files", "description": "count"})], [], []]
    )
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-task", task_plugin)
        await rt.plug("tracing", tracing(rt.models, tracer_provider=provider_of(exporter)))
        handle = await rt.agents.create(agent_id="lead", session_id="s-lead")
        assert (await handle.agent.run("delegate")).stop_reason == "completed"
    spans = exporter.get_finished_spans()
    turns = named(spans, "invoke_agent ")
    (lead,) = [t for t in turns if t.name == "invoke_agent lead"]
    (child,) = [t for t in turns if t is not lead]
    (task,) = named(spans, "execute_tool task")
    assert parent_of(task) == span_id(lead)
    assert parent_of(child) == span_id(task)
    assert child.context is not None
    assert lead.context is not None
    assert child.context.trace_id == lead.context.trace_id
    assert child.attributes is not None
    assert child.attributes["gen_ai.conversation.id"] != "s-lead"
    child_chats = [s for s in named(spans, "chat ") if parent_of(s) == span_id(child)]
    assert len(child_chats) == 1


async def test_a_cancelled_tool_call_ends_its_span_as_an_error(
    exporter: InMemorySpanExporter,
) -> None:
    entered = trio.Event()

    @tool
    async def wait() -> str:
        """Waits."""
        entered.set()
        await trio.sleep_forever()
        return "never"

    async with open_runtime(model=ScriptedModel([[CallTool("wait")]]), tools=[wait]) as rt:
        await rt.plug("tracing", tracing(rt.models, tracer_provider=provider_of(exporter)))
        handle = await rt.agents.create(agent_id="ada", session_id="s-ada")
        prompt = handle.agent.send("go")
        await entered.wait()
        handle.agent.cancel("stop")
        assert (await prompt).stop_reason == "aborted"
    spans = exporter.get_finished_spans()
    (call,) = named(spans, "execute_tool ")
    (turn,) = named(spans, "invoke_agent ")
    assert call.status.status_code is StatusCode.ERROR
    assert turn.attributes is not None
    assert turn.attributes["greenroom.turn.end"] == "aborted"
    assert turn.status.status_code is StatusCode.UNSET


async def test_stopping_the_plugin_ends_open_spans_and_traces_no_more(
    exporter: InMemorySpanExporter,
) -> None:
    async with open_runtime(model=ScriptedModel([[Hang()]])) as rt:
        await rt.plug("tracing", tracing(rt.models, tracer_provider=provider_of(exporter)))
        handle = await rt.agents.create(agent_id="ada", session_id="s-ada")
        handle.agent.send("go")
        await trio.testing.wait_all_tasks_blocked()
        assert exporter.get_finished_spans() == ()
        await rt.plugins.stop_child("tracing")
        assert sorted(s.name for s in exporter.get_finished_spans()) == [
            "chat unknown",
            "invoke_agent ada",
        ]
        handle.agent.cancel("stop")
        await handle.agent.when_idle()
        assert (await handle.agent.run("again")).stop_reason == "completed"
    assert len(exporter.get_finished_spans()) == 2


def test_without_opentelemetry_making_the_plugin_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match="pip install opentelemetry-api"):
        tracing({})


def test_the_turn_path_does_not_import_opentelemetry() -> None:
    """Importing greenroom (tracing included) loads no OpenTelemetry: only `tracing()` does."""
    code = (
        "import sys, greenroom, greenroom.tracing;"
        " print(any(m.split('.')[0] == 'opentelemetry' for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert done.stdout.decode().strip() == "False"
