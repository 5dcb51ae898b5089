"""OpenTelemetry spans of a runtime's turns, model calls and tool calls (an optional plugin).

``await rt.plug("tracing", tracing(rt.models))`` makes, for every agent:

* a span per turn, ``invoke_agent <agent id>`` (``gen_ai.operation.name``
  ``invoke_agent``), from ``agent/turn-start`` to ``agent/turn-end`` (after
  the turn's flush), its status an error with the message when the turn
  ended ``error``, and ``greenroom.turn.end`` its end reason;
* a span per model call, ``chat <model>`` (``gen_ai.operation.name`` ``chat``,
  kind CLIENT), a child of its turn's, from the step's start to its
  ``assistant/message``, with the GenAI semantic conventions'
  ``gen_ai.provider.name`` (and the older ``gen_ai.system``),
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` /
  ``output_tokens`` and ``gen_ai.response.finish_reasons``;
* a span per tool call, ``execute_tool <tool>`` (``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``), a child of its turn's, from ``tool/call`` to
  ``tool/result``, an error when the result is one.

A model call that fails is an error with the failure's message; one cut by
a cancel just ends.

Every span carries ``gen_ai.agent.id`` and ``gen_ai.conversation.id`` (the
session id). A sub-agent's turns (the ``task`` tool's) are children of the
parent's tool-call span. Spans are made with explicit parents from the
hooks: the current OpenTelemetry context is never changed, so a tool's own
spans are not nested under its call. A root turn's parent is whatever
context the agent's task was started in.

The plugin is optional in both senses: nothing of it runs unless it is
plugged (no listener, so the turn path pays nothing), and it needs
``opentelemetry-api`` only when it is made (`tracing` raises `ImportError`
saying so). Spans go to `tracer_provider`, default the global one. A span
still open when the plugin stops (an agent disposed mid-turn with the
runtime) is ended then.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from greenroom.actors.events import (
    AGENT_DISPOSED,
    AGENT_ERROR,
    AGENT_STEP_END,
    AGENT_STEP_START,
    AGENT_TURN_END,
    AGENT_TURN_START,
    SUBAGENT_STARTED,
)
from greenroom.actors.types import Agent
from greenroom.models.base import ModelAdapter
from greenroom.protocol.events import (
    AssistantChunk,
    AssistantMessage,
    Errored,
    SessionEvent,
    ToolCall,
    ToolResult,
    TurnEndReason,
)
from greenroom.protocol.model import Finish
from greenroom.session import SESSION_EVENT, Session
from greenroom.tools.plugins import Plugin, PluginContext

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider


def tracing(
    models: Mapping[str, ModelAdapter], *, tracer_provider: TracerProvider | None = None
) -> Plugin:
    """The tracing plugin for a runtime whose model adapters are `models` (``rt.models``).

    Raises `ImportError` naming the package when ``opentelemetry-api`` is
    not installed.
    """
    try:
        from opentelemetry import trace
    except ImportError:
        raise ImportError(
            "greenroom.tracing needs the OpenTelemetry API: pip install opentelemetry-api"
            " (and an SDK, such as opentelemetry-sdk, to export the spans)"
        ) from None
    from greenroom import __version__

    def plugin(ctx: PluginContext) -> None:
        tracer = trace.get_tracer("greenroom", __version__, tracer_provider=tracer_provider)
        spans = _Spans(tracer, models, trace)
        ctx.on(AGENT_TURN_START, spans.turn_started)
        ctx.on(AGENT_STEP_START, spans.step_started)
        ctx.on(AGENT_ERROR, spans.failed)
        ctx.on(AGENT_STEP_END, spans.step_ended)
        ctx.on(AGENT_TURN_END, spans.turn_ended)
        ctx.on(SESSION_EVENT, spans.logged)
        ctx.on(SUBAGENT_STARTED, spans.child_started)
        ctx.on(AGENT_DISPOSED, spans.disposed)
        ctx.scope.add(spans.close)

    return plugin


class _Open:
    """The open spans of one session: its turn's, its model call's, its tool calls'."""

    __slots__ = ("agent_id", "chat", "finish", "tools", "turn")

    def __init__(self, agent_id: str, turn: Span) -> None:
        self.agent_id = agent_id
        self.turn = turn
        self.chat: Span | None = None
        self.finish: str | None = None
        self.tools: dict[str, Span] = {}


class _Spans:
    """The spans of every traced session, by session id, and where sub-agents nest."""

    __slots__ = ("_models", "_open", "_parents", "_trace", "_tracer")

    def __init__(self, tracer: Tracer, models: Mapping[str, ModelAdapter], api: ModuleType) -> None:
        self._tracer = tracer
        self._models = models
        self._trace = api  # opentelemetry.trace, imported only once the plugin is made
        self._open: dict[str, _Open] = {}
        #: a sub-agent's id -> the parent's tool-call span its turns nest under
        self._parents: dict[str, Span] = {}

    def turn_started(self, agent: Agent, turn: int) -> None:
        parent = self._parents.get(agent.id)
        span = self._tracer.start_span(
            f"invoke_agent {agent.id}",
            context=None if parent is None else self._trace.set_span_in_context(parent),
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent.id,
                **_ids(agent.id, agent.session.id),
                "greenroom.turn": turn,
            },
        )
        self._open[agent.session.id] = _Open(agent.id, span)

    def step_started(self, agent: Agent, turn: int, step: int) -> None:
        found = self._open.get(agent.session.id)
        if found is None:
            return
        provider, model = self._model_of(agent)
        found.finish = None
        found.chat = self._tracer.start_span(
            f"chat {model}",
            context=self._trace.set_span_in_context(found.turn),
            kind=self._trace.SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.system": provider,
                "gen_ai.request.model": model,
                **_ids(agent.id, agent.session.id),
                "greenroom.turn": turn,
                "greenroom.step": step,
            },
        )

    def failed(self, agent: Agent, turn: int, step: int, error: Exception) -> None:
        found = self._open.get(agent.session.id)
        if step and found is not None and found.chat is not None:  # the model call failed
            self._fail(found.chat, str(error) or type(error).__name__)
            found.chat.end()
            found.chat = None

    def step_ended(self, agent: Agent, turn: int, step: int) -> None:
        found = self._open.get(agent.session.id)
        if found is not None and found.chat is not None:  # the model call was cut
            found.chat.end()
            found.chat = None

    def logged(self, session: Session, event: SessionEvent) -> None:
        found = self._open.get(session.id)
        if found is None:
            return
        if type(event) is AssistantChunk:
            if type(event.chunk) is Finish:
                found.finish = event.chunk.reason
        elif type(event) is AssistantMessage:
            self._end_chat(found, event)
        elif type(event) is ToolCall:
            self._start_tool(found, session.id, event)
        elif type(event) is ToolResult:
            span = found.tools.pop(event.call_id, None)
            if span is not None:
                if event.is_error:
                    self._fail(span, event.content)
                span.end()

    def turn_ended(self, agent: Agent, turn: int, reason: TurnEndReason) -> None:
        found = self._open.pop(agent.session.id, None)
        if found is None:
            return
        message = reason.message if isinstance(reason, Errored) else None
        for span in [*found.tools.values(), *([found.chat] if found.chat else [])]:
            if message is not None:
                self._fail(span, message)
            span.end()
        found.turn.set_attribute("greenroom.turn.end", str(type(reason).__struct_config__.tag))
        if message is not None:
            self._fail(found.turn, message)
        found.turn.end()

    def child_started(self, parent: Agent, call_id: str, child: Agent) -> None:
        found = self._open.get(parent.session.id)
        span = None if found is None else found.tools.get(call_id)
        if span is not None:
            self._parents[child.id] = span

    def disposed(self, agent: Agent) -> None:
        self._parents.pop(agent.id, None)

    def close(self) -> None:
        """End every span still open (the plugin stops)."""
        for found in self._open.values():
            for span in [*found.tools.values(), *([found.chat] if found.chat else [])]:
                span.end()
            found.turn.end()
        self._open.clear()
        self._parents.clear()

    def _fail(self, span: Span, message: str) -> None:
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))

    def _model_of(self, agent: Agent) -> tuple[str, str]:
        """The provider and model a step of `agent` asks: the adapter its session's ``model``
        setting picks (else the first), the model its options name (else the adapter's)."""
        chosen = agent.session.config.get("model")
        adapter = self._models.get(chosen) if chosen is not None else None
        if adapter is None:
            adapter = next(iter(self._models.values()))
        provider = getattr(adapter, "provider", None) or type(adapter).__name__
        model = agent.options.model or getattr(adapter, "model_name", None) or "unknown"
        return str(provider), str(model)

    def _end_chat(self, found: _Open, message: AssistantMessage) -> None:
        span, found.chat = found.chat, None
        if span is None:
            return
        if message.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", message.usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", message.usage.output_tokens)
        if found.finish is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [found.finish])
        span.end()

    def _start_tool(self, found: _Open, session_id: str, call: ToolCall) -> None:
        found.tools[call.call_id] = self._tracer.start_span(
            f"execute_tool {call.name}",
            context=self._trace.set_span_in_context(found.turn),
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
                "gen_ai.tool.type": "function",
                **_ids(found.agent_id, session_id),
                "greenroom.turn": call.turn,
                "greenroom.step": call.step,
                "greenroom.tool.kind": call.kind,
            },
        )


def _ids(agent_id: str, session_id: str) -> dict[str, Any]:
    return {"gen_ai.agent.id": agent_id, "gen_ai.conversation.id": session_id}
