"""The requests on a live session, acted on in the reader, in arrival order.

``session/prompt`` queues its content on the agent's inbox and keeps the
`Prompt` that ``send`` returned in the session's record (`table.InFlight`);
its `Answer` is the answer (`params.prompt_result`), queued by its settle
callback (`Prompt.on_settled`) in the agent's task, with no task per prompt:
before the agent can start the next turn, so ahead of any of that turn's
updates. A prompt that begins with a slash command runs it instead
(`commands.SessionCommands.parse`). ``_session/steering`` steers,
``session/set_mode`` and ``session/set_config_option`` configure; the
notifications ``session/cancel`` and ``$/cancel_request`` cancel
(`table.SessionTable.cancel`, `cancel_request`). Each handler answers
itself or raises `RpcError` for the dispatch to answer, and never
checkpoints: what waits (a ``/compact``'s end, a server's prompt) runs in a
task of its own.
"""

from __future__ import annotations

from typing import Any

import trio

from greenroom.acp.commands import COMPACT, MODE, MODEL, Command, arguments
from greenroom.acp.outbox import Outbox
from greenroom.acp.params import RpcError, prompt_result, prompt_text
from greenroom.acp.presenter import TITLES_OPTION, Presenter
from greenroom.acp.prompts import prompt_content
from greenroom.acp.table import InFlight, SessionRecord, SessionTable
from greenroom.actors.prompt import Answer, Prompt
from greenroom.actors.types import Agent, AgentDisposed
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    CancelRequestParams,
    Empty,
    PromptParams,
    PromptResult,
    RequestId,
    SessionParams,
    SetConfigOptionParams,
    SetConfigOptionResult,
    SetModeParams,
    SteeringResult,
)
from greenroom.protocol.events import Completed, TurnEnd, TurnStart
from greenroom.session import Session
from greenroom.tools.mcp import McpServerError

__all__ = ["Prompting"]


class Prompting:
    """The requests on the live sessions of one connection's `SessionTable` (see the module
    docstring); what waits (a ``/compact``'s end, a server's prompt) runs in `nursery`."""

    __slots__ = ("_nursery", "_outbox", "_presenter", "_table")

    def __init__(
        self, table: SessionTable, outbox: Outbox, nursery: trio.Nursery, presenter: Presenter
    ) -> None:
        self._table = table
        self._outbox = outbox
        self._nursery = nursery
        self._presenter = presenter

    def prompt(self, request_id: RequestId, params: PromptParams) -> None:
        """``session/prompt``: queued on the agent's inbox, answered as it settles; a slash
        command runs instead."""
        record = self._table.live(params.session_id)
        if request_id in record.prompts:  # its answer would be the other's, sent once
            raise RpcError(
                INVALID_REQUEST, f"request id {request_id!r} is already a prompt's in flight"
            )
        agent = record.handle.agent  # type: ignore[union-attr]
        content = prompt_content(params.prompt, agent.session.header)
        command = None
        if isinstance(content, str):
            command = self._table.commands_of(record.session_id).parse(content.strip())
        if command is not None:
            self._run(request_id, record, agent, command)
            return
        self._answer_when_settled(record, request_id, agent.send(content))

    def _run(
        self, request_id: RequestId, record: SessionRecord, agent: Agent, command: Command
    ) -> None:
        """Run a slash command: ``/compact`` compacts, ``/mode`` and ``/model`` change the
        setting (answered at once), a server's prompt is got and sent as the prompt."""
        if command.name == COMPACT:
            last_turn = agent.session.last_turn
            try:
                agent.compact(command.rest or None)
            except ValueError as exc:  # instructions past the cap: nothing is asked
                raise RpcError(INVALID_PARAMS, f"invalid params: /compact: {exc}") from None
            self._nursery.start_soon(self._compacted, request_id, agent, last_turn)
        elif command.name in (MODE, MODEL):
            self._configure(record.session_id, command.name, command.rest)
            self._outbox.respond(request_id, PromptResult("end_turn"))
        else:
            self._nursery.start_soon(self._prompted, request_id, record, agent, command)

    async def _prompted(
        self, request_id: RequestId, record: SessionRecord, agent: Agent, command: Command
    ) -> None:
        """Get a server's prompt and send its messages' text as the prompt; a prompt the
        server cannot give is an error answer naming why (nothing is sent)."""
        table, outbox = self._table, self._outbox
        offered, prompt = table.commands_of(record.session_id).prompt(command.name)
        scope = table.fetching[request_id] = (record.session_id, trio.CancelScope())
        try:
            with scope[1]:  # a cancel of the session or the request withdraws it
                texts = await offered.get(prompt.name, arguments(prompt, command.rest))
        except ValueError as exc:
            outbox.fail(request_id, INVALID_PARAMS, f"invalid params: /{command.name}: {exc}")
            return
        except McpServerError as exc:
            outbox.fail(request_id, INTERNAL_ERROR, f"/{command.name}: {exc}")
            return
        finally:
            del table.fetching[request_id]
        if scope[1].cancelled_caught:
            outbox.respond(request_id, PromptResult("cancelled"))
            return
        text = "\n\n".join(t for t in texts if t.strip())
        if not text:
            outbox.fail(request_id, INTERNAL_ERROR, f"/{command.name}: the prompt is empty")
            return
        if table.records.get(record.session_id) is not record:  # closed meanwhile
            outbox.respond(request_id, PromptResult("cancelled"))
            return
        try:
            sent = agent.send(text)
        except AgentDisposed:
            outbox.respond(request_id, PromptResult("cancelled"))
            return
        self._answer_when_settled(record, request_id, sent)

    def _answer_when_settled(
        self, record: SessionRecord, request_id: RequestId, prompt: Prompt[Any]
    ) -> None:
        """Answer `request_id` from `prompt` the moment it settles (in the agent's task, so
        before its next turn can start and show anything), unless its session went first."""
        entry = record.prompts[request_id] = InFlight(request_id, prompt)
        outbox = self._outbox

        def answer(answer: Answer[Any]) -> None:
            if record.prompts.pop(request_id, None) is None:
                return  # answered ``cancelled`` when its session was closed
            try:
                outbox.respond(request_id, prompt_result(answer, entry.cancelled))
            except RpcError as exc:
                outbox.fail(request_id, exc.code, exc.message)

        prompt.on_settled(answer)

    async def _compacted(self, request_id: RequestId, agent: Agent, last_turn: int) -> None:
        """Answer a ``/compact`` once the agent is idle again: by its compaction turn's end
        (``end_turn`` when nothing needed one)."""
        await agent.when_idle()
        for event in reversed(agent.session.events):
            if isinstance(event, TurnEnd) and event.turn > last_turn:
                completed = isinstance(event.reason, Completed)
                self._outbox.respond(
                    request_id, PromptResult("end_turn" if completed else "cancelled")
                )
                return
            if isinstance(event, TurnStart) and event.turn <= last_turn:
                break
        self._outbox.respond(request_id, PromptResult("end_turn"))

    def steer(self, request_id: RequestId, params: PromptParams) -> None:
        """``_session/steering``: into the running turn, or a new turn when none runs."""
        agent = self._table.agent(params.session_id)
        running = agent.status == "running"
        agent.steer(prompt_text(params.prompt))
        self._outbox.respond(
            request_id, SteeringResult("injected" if running else "startedNewTurn")
        )

    def set_mode(self, request_id: RequestId, params: SetModeParams) -> None:
        self._configure(params.session_id, "mode", params.mode_id)
        self._outbox.respond(request_id, Empty())

    def set_config_option(self, request_id: RequestId, params: SetConfigOptionParams) -> None:
        """A config option the client was offered set: a select option's value is the id
        of one of its choices (a ``type`` other than ``"boolean"`` is passed over, as the
        schema says), the boolean one's (`TITLES_OPTION`) a boolean with ``type:
        "boolean"``; anything else is -32602 naming what was wrong, and nothing changes."""
        config_id, value, kind = params.config_id, params.value, params.type
        offered = self._presenter.offered()
        if config_id not in offered:
            raise RpcError(
                INVALID_PARAMS,
                f"invalid params: configId: unknown config option {config_id[:100]!r}"
                f" (offered: {', '.join(offered)})",
            )
        if config_id == TITLES_OPTION:  # the schema's boolean request: both required
            if type(value) is not bool or kind != "boolean":
                raise RpcError(
                    INVALID_PARAMS,
                    f"invalid params: value: {config_id!r} is a boolean option: its value is"
                    f' true or false, with type "boolean", got {_shown(value, kind)}',
                )
            setting = "model" if value else "prompt"
        elif type(value) is not str or kind == "boolean":  # another type: a value id, as said
            raise RpcError(
                INVALID_PARAMS,
                f"invalid params: value: {config_id!r} is a select option: its value is the"
                f" id of one of its choices, got {_shown(value, kind)}",
            )
        else:
            setting = value
        session = self._configure(params.session_id, config_id, setting)
        self._outbox.respond(
            request_id, SetConfigOptionResult(self._presenter.config_options(session))
        )

    def _configure(self, session_id: str, key: str, value: str) -> Session:
        agent = self._table.agent(session_id)
        try:
            agent.configure(key, value)
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, f"invalid params: {exc}") from None
        return agent.session

    def cancel(self, params: SessionParams) -> None:
        """``session/cancel`` (a notification: an unknown session is no error)."""
        record = self._table.records.get(params.session_id)
        if record is None or record.handle is None:
            return  # a notification: nothing to answer
        self._table.cancel(record)

    def cancel_request(self, params: CancelRequestParams) -> None:
        """``$/cancel_request``: the request, if it is still in flight."""
        self._table.cancel_request(params.request_id)


def _shown(value: str | bool, kind: str | None) -> str:
    """A set_config_option's value (and its type, when it gave one), as an error names it."""
    shown = "true" if value is True else "false" if value is False else repr(value[:100])
    return shown if kind is None else f"{shown} of type {kind[:40]!r}"
