"""A session of one connection, from the request that starts it to its close: one record.

A record is made when ``session/new``, ``load``, ``resume`` or ``fork``
begins (so a second load of the same id is refused while the first runs)
and holds, in order of its life:

* while starting: no handle; what its MCP servers do meanwhile is kept
  (``notices``) and told after the answer that names the session
  (`announce`);
* once live: its agent's handle and its prompts in flight (`InFlight`, by
  request id), each answered from its `Prompt` as it settles (`Prompt.on_settled`,
  in the agent's task: before the next turn can start, so a client never sees
  the next turn's updates before the answer of the last one);
* the updates of a turn a crash cut that a load carries on (``held``): they go
  out after the load's answer.
"""

from __future__ import annotations

from typing import Any

from greenroom.acp.outbox import Outbox
from greenroom.actors.life import AgentHandle
from greenroom.actors.prompt import Prompt
from greenroom.protocol.acp import PromptResult, RequestId, SessionUpdate


class InFlight:
    """A ``session/prompt`` not answered yet. ``cancelled``: a ``session/cancel`` came while
    it was unsettled, so it is answered ``cancelled`` however its turn ends."""

    __slots__ = ("cancelled", "prompt", "request_id")

    def __init__(self, request_id: RequestId, prompt: Prompt[Any]) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.cancelled = False


class SessionRecord:
    """One session of the connection (see the module docstring)."""

    __slots__ = ("handle", "held", "notices", "prompts", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.handle: AgentHandle | None = None  # set once it is live
        #: What its servers did before the session was announced; None once told.
        self.notices: list[str] | None = []
        self.prompts: dict[RequestId, InFlight] = {}
        self.held: list[SessionUpdate] | None = None

    def notice(self, outbox: Outbox, text: str) -> None:
        """Tell `text` in the session now, or after its answer if that is not sent yet."""
        if self.notices is not None:
            self.notices.append(text)
        else:
            outbox.tell(self.session_id, text)

    def announce(self, outbox: Outbox) -> None:
        """Its answer is sent: tell what its servers did meanwhile."""
        notices, self.notices = self.notices, None
        for text in notices or ():
            outbox.tell(self.session_id, text)

    def show(self, outbox: Outbox, update: SessionUpdate) -> None:
        """Send a live update, or hold it (see ``held``)."""
        if self.held is not None:
            self.held.append(update)
        else:
            outbox.update(self.session_id, update)

    def answered(self, outbox: Outbox) -> None:
        """The answer that starts the session went out: send what was held behind it."""
        if self.held is None:
            return
        held, self.held = self.held, None
        for update in held:
            outbox.update(self.session_id, update)

    def abandon(self, outbox: Outbox) -> None:
        """Answer every prompt in flight ``cancelled`` at once (the session is going), then
        send what was held."""
        prompts = list(self.prompts.values())
        self.prompts.clear()
        for entry in prompts:
            outbox.respond(entry.request_id, PromptResult("cancelled"))
        self.answered(outbox)
