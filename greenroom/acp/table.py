"""The session table of one connection: its sessions, their records, what is in flight.

The one state that the dispatch (`connection`), the requests on a live
session (`prompting`), the starts (`starts`) and the teardown share: each
holds the same `SessionTable`, as both ends of a Trio memory channel hold
one `MemoryChannelState`, and none reaches into another for it. It keeps:

* ``records``: a `SessionRecord` per session, from the request that starts it
  (so a second load of the same id is refused while the first runs) to its
  close (`release`), the teardown (`close`) or its hand-off to another node;
* ``requests``: the cancel scope of each request running in a task of its
  own (a start, a list, a close), what ``$/cancel_request`` cancels;
* ``fetching``: the server prompts being got for a ``/<server>:<prompt>``,
  with their session and their scope;
* ``commands``: each session's slash commands, from its start on;
* ``closed``: the teardown began; no session starts any more.

A record holds, in order of its life:

* while starting: no handle; what its MCP servers do meanwhile is kept
  (``notices``) and told after the answer that names the session
  (`announce`);
* once live: its agent's handle and its prompts in flight (`InFlight`, by
  request id), each answered from its `Prompt` as it settles (`Prompt.on_settled`,
  in the agent's task: before the next turn can start, so a client never sees
  the next turn's updates before the answer of the last one);
* the updates of a turn a crash cut that a load carries on (``held``): they go
  out after the load's answer;
* the latest value of each update that states one (``stated``, `STATES`: the
  usage, the mode, the config options), as the client has it from an update or
  an answer: an update equal to it is not sent again.

Nothing here checkpoints but `go_live` and `release`, which wait on the
session's start and its agent's disposal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol

import trio

from greenroom.acp.commands import SessionCommands
from greenroom.acp.outbox import Outbox
from greenroom.acp.params import RpcError
from greenroom.acp.routes import Watch
from greenroom.acp.shared import Attachment
from greenroom.actors.prompt import Prompt
from greenroom.actors.types import Agent
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    AnyConfigOption,
    ConfigOptionUpdate,
    CurrentModeUpdate,
    PromptResult,
    RequestId,
    SessionUpdate,
    UsageUpdate,
)
from greenroom.tools.bash import BashExecutor
from greenroom.tools.bash.tools import kill_owned

__all__ = ["InFlight", "LiveHandle", "SessionRecord", "SessionTable"]

#: What a prompt whose turn stays parked on a decision is answered when its session goes.
PARKED = (
    "the turn waits on a decision and stays parked in the session's log:"
    " load the session again to be asked, and the turn goes on"
)


class LiveHandle(Protocol):
    """What a record holds of a live session: an `AgentHandle`, or a connection's
    `shared.Attachment` to a session several connections share."""

    @property
    def agent(self) -> Agent: ...

    @property
    def resumed(self) -> Prompt[None] | None: ...

    async def dispose(self) -> None: ...


class InFlight:
    """A ``session/prompt`` not answered yet. ``cancelled``: a ``session/cancel`` came while
    it was unsettled, so it is answered ``cancelled`` however its turn ends."""

    __slots__ = ("cancelled", "prompt", "request_id")

    def __init__(self, request_id: RequestId, prompt: Prompt[Any]) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.cancelled = False


#: The updates that state a value rather than tell of an event: one equal to the latest
#: of its kind the client has is not sent again (`SessionRecord.show`).
STATES: Final = frozenset({UsageUpdate, ConfigOptionUpdate, CurrentModeUpdate})


class SessionRecord:
    """One session of the connection, from the request that starts it to its close (see the
    module docstring)."""

    __slots__ = ("handle", "held", "notices", "prompts", "ready", "session_id", "stated")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        #: Set once the answer that started it is sent: the client is asked nothing before.
        self.ready = trio.Event()
        self.handle: LiveHandle | None = None  # set once it is live
        #: What its servers did before the session was announced; None once told.
        self.notices: list[SessionUpdate] | None = []
        self.prompts: dict[RequestId, InFlight] = {}
        self.held: list[SessionUpdate] | None = None
        self.stated: dict[type[SessionUpdate], SessionUpdate] = {}

    def notice(self, outbox: Outbox, update: SessionUpdate) -> None:
        """Send `update` (a notice) now, or after its answer if that is not sent yet."""
        if self.notices is not None:
            self.notices.append(update)
        else:
            outbox.update(self.session_id, update)

    def announce(self, outbox: Outbox) -> None:
        """Its answer is sent: tell what its servers did meanwhile."""
        notices, self.notices = self.notices, None
        for update in notices or ():
            outbox.update(self.session_id, update)

    def show(self, outbox: Outbox, update: SessionUpdate) -> None:
        """Send a live update, or hold it (see ``held``); one of `STATES` equal to the
        latest of its kind is dropped: the client has it."""
        kind = type(update)
        if kind in STATES:
            if self.stated.get(kind) == update:
                return
            self.stated[kind] = update
        if self.held is not None:
            self.held.append(update)
        else:
            outbox.update(self.session_id, update)

    def settings_told(self, options: list[AnyConfigOption], mode: str | None = None) -> None:
        """An answer told the client the session's config options (and its `mode`, when
        it said it as a mode: a client of the modes API learns it from no option)."""
        self.stated[ConfigOptionUpdate] = ConfigOptionUpdate(options)
        if mode is not None:
            self.stated[CurrentModeUpdate] = CurrentModeUpdate(mode)

    def answered(self, outbox: Outbox) -> None:
        """The answer that starts the session went out: send what was held behind it, and
        let its questions be asked."""
        self.ready.set()
        if self.held is None:
            return
        held, self.held = self.held, None
        for update in held:
            outbox.update(self.session_id, update)

    def abandon(self, outbox: Outbox) -> None:
        """Settle every prompt in flight at once (the session is going), then send what was
        held. Each is answered ``cancelled``; but when the turn waits on a decision it is
        not cancelled: it stays parked in the log for the session's next holder, and each
        prompt is answered an error that says so."""
        prompts = list(self.prompts.values())
        self.prompts.clear()
        parked = self.handle is not None and self.handle.agent.status == "waiting"
        for entry in prompts:
            if parked:
                outbox.fail(entry.request_id, INTERNAL_ERROR, PARKED)
            else:
                outbox.respond(entry.request_id, PromptResult("cancelled"))
        self.answered(outbox)


class SessionTable:
    """The sessions of one connection and what is in flight for them (see the module
    docstring). What it answers goes out through `outbox`; what it kills, through `bash`."""

    __slots__ = (
        "_bash",
        "_models",
        "_outbox",
        "_watch",
        "closed",
        "commands",
        "fetching",
        "records",
        "requests",
    )

    def __init__(
        self, outbox: Outbox, bash: BashExecutor, models: Sequence[str], watch: Watch
    ) -> None:
        self._outbox = outbox
        self._bash = bash
        self._models = list(models)
        self._watch = watch  # held while it has a record: what the runtime tells of it
        #: By session id (read only: a record comes and goes by `go_live` and `drop`).
        self.records: dict[str, SessionRecord] = {}
        self.requests: dict[RequestId, trio.CancelScope] = {}
        self.fetching: dict[RequestId, tuple[str, trio.CancelScope]] = {}
        self.commands: dict[str, SessionCommands] = {}
        self.closed = False

    # -- looking up ------------------------------------------------------------------------

    def live(self, session_id: str) -> SessionRecord:
        """The record of a live session here; -32002 for any other id."""
        record = self.records.get(session_id)
        if record is None or record.handle is None:
            raise RpcError(RESOURCE_NOT_FOUND, f"unknown session {session_id!r}")
        return record

    def agent(self, session_id: str) -> Agent:
        """The agent of a live session here; -32002 for any other id."""
        handle = self.live(session_id).handle
        assert handle is not None
        return handle.agent

    def commands_of(self, session_id: str) -> SessionCommands:
        """The session's slash commands, made at the first ask."""
        commands = self.commands.get(session_id)
        if commands is None:
            commands = self.commands[session_id] = SessionCommands(self._models)
        return commands

    def require_open(self) -> None:
        """Refuse a session start once the teardown began."""
        if self.closed:
            raise RpcError(INTERNAL_ERROR, "the connection is closing")

    # -- a session's life ------------------------------------------------------------------

    async def go_live(
        self, session_id: str, start: Callable[[], Awaitable[LiveHandle]]
    ) -> SessionRecord:
        """Start `session_id` (`start`: a create or a resume) under a record of its own, kept
        once it is live; what its servers do meanwhile is told after the answer. A session
        loaded or loading here is refused; one started while the teardown began is disposed
        here, and the request fails (the teardown leaves it to its request). Checkpoints
        while `start` runs; a cancelled caller leaves no record."""
        if session_id in self.records:
            raise RpcError(INVALID_PARAMS, f"session {session_id!r} is already loaded")
        record = self.records[session_id] = SessionRecord(session_id)
        self._watch.hold(session_id)
        try:
            handle = await start()
        except BaseException:
            self.drop(session_id)
            raise
        if self.closed:  # the teardown left it to this request
            self.drop(session_id)
            await handle.dispose()
            raise RpcError(INTERNAL_ERROR, "the connection closed while the session was starting")
        record.handle = handle
        return record

    async def release(self, record: SessionRecord) -> None:
        """End a live session here: drop its record, answer its prompts ``cancelled``, kill
        its background bash tasks, then dispose its agent (checkpoints while it goes)."""
        self.drop(record.session_id)
        self.commands.pop(record.session_id, None)
        self.abandon(record)
        assert record.handle is not None
        await record.handle.dispose()

    def abandon(self, record: SessionRecord) -> None:
        """Settle its prompts (`SessionRecord.abandon`) and start killing its bash tasks, at
        once; a session held through an `Attachment` keeps them (its last holder's
        `dispose` kills them)."""
        self.stop_fetching(record.session_id)
        record.abandon(self._outbox)
        if not isinstance(record.handle, Attachment):
            kill_owned(self._bash, record.session_id)

    def close(self) -> list[SessionRecord]:
        """The teardown began: no session starts any more. Drops and returns the live
        records; one still starting is left to its request (`go_live`)."""
        self.closed = True
        records = [record for record in self.records.values() if record.handle is not None]
        for record in records:
            self.drop(record.session_id)
        return records

    def drop(self, session_id: str) -> None:
        """Forget the session's record: nothing of it is told to this connection after."""
        del self.records[session_id]
        self._watch.let_go(session_id)

    # -- cancelling ------------------------------------------------------------------------

    def cancel(self, record: SessionRecord) -> None:
        """``session/cancel`` of a live session: its agent's turn and what is queued (settled
        at once), its prompts in flight answered ``cancelled``, its server prompts being got
        withdrawn."""
        assert record.handle is not None
        record.handle.agent.cancel("session/cancel")  # what was queued settles at once
        for entry in record.prompts.values():  # each unsettled: a settled one is answered
            entry.cancelled = True
        self.stop_fetching(record.session_id)

    def stop_fetching(self, session_id: str) -> None:
        """Withdraw the server prompts being got for the session's commands."""
        for fetching, scope in self.fetching.values():
            if fetching == session_id:
                scope.cancel()

    def cancel_request(self, request_id: RequestId) -> None:
        """``$/cancel_request``: whatever `request_id` is, if it is still in flight here."""
        fetching = self.fetching.get(request_id)
        if fetching is not None:
            fetching[1].cancel()
            return
        for record in self.records.values():
            entry = record.prompts.get(request_id)
            if entry is None:
                continue
            # A prompt still queued is withdrawn alone; the running one is the
            # session's cancel (queue-aware: what waits behind it is dropped too).
            assert record.handle is not None
            if not record.handle.agent.withdraw(entry.prompt.id):
                self.cancel(record)
            return
        scope = self.requests.get(request_id)
        if scope is not None:
            scope.cancel(reason="$/cancel_request")
