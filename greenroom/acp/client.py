"""Requests greenroom sends the ACP client, and what a session's tools get from them.

`ClientRequests` numbers each request (``gr-1``, ``gr-2``, ...: never an id
the client uses), writes it through the connection's one writer, and waits
for the client's reply. Each request is settled exactly once: by its reply;
by a reply that could not be read (`frames.Unread`: too large, or nested too
deep, its id found by a scan), which fails it saying why; by its caller's
cancel or its deadline (``fs/*`` only: `FILES_DEADLINE`), either of which
withdraws it with ``$/cancel_request``; or by the connection's end, which
fails every request still waiting at once. A reply that comes later is
dropped. Permission and questions wait for a person: they have no deadline.

`AcpPermissions` asks ``session/request_permission`` with the four options
of the spec; `AcpQuestions` asks ``elicitation/create`` (a form of one
field, ``answer``) when the client offers elicitation; `AcpFiles` reads and
writes through ``fs/read_text_file`` and ``fs/write_text_file``, so unsaved
buffers are read and edits land in the editor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec
import trio

from greenroom.acp.presenter import shown_call
from greenroom.actors.types import AskerGone, PermissionRequest, Question, SessionClient
from greenroom.protocol.acp import (
    CancelRequestParams,
    ElicitationParams,
    ElicitationResult,
    Notification,
    OutgoingRequest,
    PermissionOption,
    PermissionToolCall,
    ReadTextFileParams,
    ReadTextFileResult,
    RequestId,
    RequestPermissionParams,
    RequestPermissionResult,
    SessionNotificationParams,
    ToolCallProgress,
    ToolStatus,
    WriteTextFileParams,
)
from greenroom.protocol.events import PermissionDecision

T = TypeVar("T")

OPTIONS: Final = [
    PermissionOption("allow_once", "Allow once", "allow_once"),
    PermissionOption("allow_always", "Always allow", "allow_always"),
    PermissionOption("reject_once", "Reject", "reject_once"),
    PermissionOption("reject_always", "Always reject", "reject_always"),
]
#: A sub-agent's question: an "always" answer would be remembered in the child's session,
#: which ends with its task, so the client's session would ask again. Not offered.
ONCE: Final = [o for o in OPTIONS if o.kind.endswith("_once")]

#: Seconds the client has to answer a request for a file (``fs/*``): it reads or writes a file,
#: no person is asked; past it the request is withdrawn and its tool call fails.
FILES_DEADLINE: Final = 30.0

_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


class ClientError(Exception):
    """The client answered a request with an error, or the connection ended first."""


class ClientGone(ClientError, AskerGone):
    """The connection closed before the client answered (or before it was asked): a
    decision asked of it waits on (`AskerGone`)."""


class _Waiting:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: msgspec.Raw | None = None
        self.error: str | None = None


_CLOSED: Final = "the connection closed before the client answered"


class ClientRequests:
    """The requests in flight from greenroom to the client (see the module docstring).

    ``send`` queues a frame on the connection's writer (it never blocks).
    """

    __slots__ = ("_closed", "_ids", "_send", "_waiting")

    def __init__(self, send: Callable[[msgspec.Struct], None]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._waiting: dict[str, _Waiting] = {}
        self._closed = False

    async def call(
        self, method: str, params: msgspec.Struct, result: type[T], deadline: float = math.inf
    ) -> T:
        """Send `method` and wait for its reply, decoded as `result`, at most `deadline`
        seconds; raises `ClientError` naming the method and why. Cancelled, the request
        is withdrawn and the cancel goes on."""
        if self._closed:
            raise ClientGone(f"{method}: the connection is closing")
        request_id = f"gr-{next(self._ids)}"
        waiting = self._waiting[request_id] = _Waiting()
        self._send(OutgoingRequest(request_id, method, params))
        try:
            with trio.move_on_after(deadline):
                await waiting.done.wait()
        finally:
            del self._waiting[request_id]
            if not waiting.done.is_set():  # cancelled, or past its deadline
                self._send(Notification("$/cancel_request", CancelRequestParams(request_id)))
        if not waiting.done.is_set():
            raise ClientError(f"{method}: the client did not answer within {deadline:g} s")
        if waiting.error is not None:
            gone = ClientGone if waiting.error is _CLOSED else ClientError
            raise gone(f"{method}: {waiting.error}")
        assert waiting.result is not None
        decoder = _decoders.get(result)
        if decoder is None:
            decoder = _decoders[result] = msgspec.json.Decoder(result)
        try:
            decoded: T = decoder.decode(waiting.result)
        except msgspec.DecodeError as exc:
            raise ClientError(f"{method}: the client's answer does not fit: {exc}") from None
        return decoded

    def notify(self, method: str, params: msgspec.Struct) -> None:
        """Send a notification (it is never answered); nothing once closing."""
        if not self._closed:
            self._send(Notification(method, params))

    def reply(self, request_id: RequestId, result: msgspec.Raw | None, error: str | None) -> None:
        """A reply from the client; one to nothing waiting (withdrawn, unknown) is dropped."""
        waiting = self._waiting.get(request_id) if isinstance(request_id, str) else None
        if waiting is None or waiting.done.is_set():
            return
        waiting.result, waiting.error = result, error
        waiting.done.set()

    def close(self) -> None:
        """Fail every request still waiting, and refuse new ones."""
        self._closed = True
        for waiting in self._waiting.values():
            if not waiting.done.is_set():
                waiting.error = _CLOSED
                waiting.done.set()


class AcpPermissions:
    """A session's permission requests, asked of the client (``session/request_permission``).

    Always on the client's session: a sub-agent's session is not one the
    client knows, so a child's (or grandchild's) request is asked on the
    client's session its family grew from, the call id prefixed with the
    child's session id (a child's call ids are its model's and may repeat the
    parent's), and with the once options only (`ONCE`), as a request that can take
    no "always" answer (`PermissionRequest.once`) is. The client keeps the
    question as a tool call of its session; once answered it is closed there
    (``completed`` when allowed: the child's run shows in its ``task`` call,
    ``failed`` when refused), so it never hangs as pending.
    """

    __slots__ = ("_ready", "_requests", "_session_id")

    def __init__(self, requests: ClientRequests, session_id: str, ready: trio.Event) -> None:
        self._requests = requests
        self._session_id = session_id
        self._ready = ready

    async def decide(self, request: PermissionRequest) -> PermissionDecision:
        await self._ready.wait()  # a carried-on turn asks after the load's answer
        child = request.session_id != self._session_id
        call_id = f"{request.session_id}/{request.call_id}" if child else request.call_id
        options = ONCE if child or request.once else OPTIONS
        title, raw_input = shown_call(request.title or request.tool, request.arguments)
        asked = RequestPermissionParams(
            self._session_id,
            PermissionToolCall(call_id, title, request.kind, "pending", raw_input),
            options,
        )
        answer = await self._requests.call(
            "session/request_permission", asked, RequestPermissionResult
        )
        chosen = answer.outcome.option_id if answer.outcome.outcome == "selected" else None
        # Cancelled, or an option this question did not offer: a refusal.
        refused: PermissionDecision = "reject_once"
        decision = next((o.kind for o in options if o.option_id == chosen), refused)
        if child:
            status: ToolStatus = "completed" if decision == "allow_once" else "failed"
            update = ToolCallProgress(call_id, status)
            self._requests.notify(
                "session/update", SessionNotificationParams(self._session_id, update)
            )
        return decision


class AcpQuestions:
    """A session's ``ask_user`` questions, asked of the client (``elicitation/create``, form
    mode): one string field, ``answer``, whose values are the choices unless any text may
    be the answer. On the client's session, as permissions are: a sub-agent's question
    names no tool call (the client does not know the child's). ``accept`` is the answer;
    ``decline`` and ``cancel`` (the person dismissed it) are no answer. A cancel of the turn
    withdraws the request (`ClientRequests.call`)."""

    __slots__ = ("_ready", "_requests", "_session_id")

    def __init__(self, requests: ClientRequests, session_id: str, ready: trio.Event) -> None:
        self._requests = requests
        self._session_id = session_id
        self._ready = ready

    async def ask(self, question: Question) -> str | None:
        await self._ready.wait()  # a carried-on turn asks after the load's answer
        field: dict[str, object] = {"type": "string", "title": "Answer"}
        if question.choices and not question.free_text:
            field["enum"] = question.choices
        elif question.choices:
            field["description"] = "One of: " + "; ".join(question.choices) + " (or your own)"
        schema = {"type": "object", "properties": {"answer": field}, "required": ["answer"]}
        own = question.session_id == self._session_id
        asked = ElicitationParams(
            self._session_id,
            question.question,
            schema,
            "form",
            tool_call_id=question.call_id if own else None,
        )
        answer = await self._requests.call("elicitation/create", asked, ElicitationResult)
        if answer.action != "accept" or answer.content is None:
            return None
        value = answer.content.get("answer")
        return value if isinstance(value, str) else None


class AcpFiles:
    """A session's files as the editor has them (``fs/read_text_file``, ``fs/write_text_file``),
    each request answered within `FILES_DEADLINE` or failed."""

    __slots__ = ("_requests", "_session_id")

    def __init__(self, requests: ClientRequests, session_id: str) -> None:
        self._requests = requests
        self._session_id = session_id

    async def read_text(self, path: str, line: int | None, limit: int | None) -> str:
        params = ReadTextFileParams(self._session_id, path, line, limit)
        answer = await self._requests.call(
            "fs/read_text_file", params, ReadTextFileResult, FILES_DEADLINE
        )
        return answer.content

    async def write_text(self, path: str, content: str) -> None:
        params = WriteTextFileParams(self._session_id, path, content)
        await self._requests.call("fs/write_text_file", params, msgspec.Raw, FILES_DEADLINE)


def session_client(
    requests: ClientRequests,
    session_id: str,
    *,
    read: bool,
    write: bool,
    ask: bool = False,
    name: str = "client",
    ready: trio.Event,
) -> SessionClient:
    """What a session's tools get from this client (`name`, its ``clientInfo.name``):
    permission always, files if offered, questions (``ask_user``) if it offers
    elicitation in form mode. Nothing is asked of it before `ready` (the answer that
    started the session is sent).

    Files go through the editor only when it offers both reading and writing
    (an edit reads before it writes; half of it on disk would split them).
    """
    files = AcpFiles(requests, session_id) if read and write else None
    questions = AcpQuestions(requests, session_id, ready) if ask else None
    return SessionClient(
        permissions=AcpPermissions(requests, session_id, ready),
        files=files,
        questions=questions,
        name=name,
    )
