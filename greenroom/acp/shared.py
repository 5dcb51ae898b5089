"""Sessions shared by the connections of one server: several clients on one session.

Over stdio a session is its one connection's. ``greenroom serve`` keeps one
`Attachments` for all its connections: a session live in it is held by the
connections *attached* to it, each through an `Attachment` (what the
connection's `SessionTable` keeps as the record's handle), and its agent is
owned by the server's supervisor, not by the connection that made it.

* **Attach.** A ``session/new`` makes the session and attaches its
  connection; a ``session/load`` or ``session/resume`` of a session live here
  attaches one more (the load replays its log to that client as any load
  does) instead of being refused. Each attached connection shows the
  session's updates to its client and answers its own prompts (its record is
  its own); a cancel from any cancels the session's turn.
* **Asking.** The agent asks through one `SessionClient` made for the
  session (`_SharedClient`): a permission or a question goes to every
  attached client that can be asked it, at once, and to each client that
  attaches before it is answered; the first answer wins and the others'
  requests are withdrawn (``$/cancel_request``, as a cancelled request always
  is). A client that cannot answer (its connection closing) drops out; with
  nobody left to ask, the question waits for a client to attach (or for
  ``decide``). The log's ``decision/made`` names the client that answered.
  File requests (``fs/*``) go to one client: the first attached whose prompt
  the running turn took, else (a turn carried on, or its client gone) the
  first attached.
* **Detach.** `Attachment.dispose` (a close, a delete, a connection's end)
  lets go of the session. When the last lets go, its background bash tasks
  are killed and its agent disposed; but a turn still running, or waiting on
  a decision, goes on with no client attached (a client that reconnects
  attaches again), and the session ends once the agent is idle with still no
  one attached.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import trio

from greenroom.acp.client import ClientGone
from greenroom.acp.params import RpcError
from greenroom.acp.routes import SessionRoutes
from greenroom.actors.life import AgentHandle, Owner
from greenroom.actors.prompt import Prompt
from greenroom.actors.types import (
    Agent,
    AskerGone,
    NamedAnswer,
    PermissionRequest,
    Question,
    SessionClient,
)
from greenroom.protocol.acp import INTERNAL_ERROR
from greenroom.tools.bash import BashExecutor
from greenroom.tools.bash.tools import kill_owned

__all__ = ["Attachment", "Attachments"]

T = TypeVar("T")


class Attachment:
    """One connection's hold on a shared session: its ``agent`` and ``resumed`` are the
    session's handle's; `dispose` lets go (the last to let go disposes the agent)."""

    __slots__ = ("_prompts", "_shared", "client", "key", "principal")

    def __init__(
        self,
        shared: _Shared,
        key: int,
        client: SessionClient,
        prompts: Callable[[], Iterable[Prompt[Any]]],
        principal: str | None,
    ) -> None:
        self._shared = shared
        self.key = key
        self.client = client
        self.principal = principal  # whose connection holds it
        self._prompts = prompts  # its connection's prompts of the session in flight

    @property
    def agent(self) -> Agent:
        return self._shared.handle.agent

    @property
    def resumed(self) -> Prompt[None] | None:
        return self._shared.handle.resumed if self._shared.first is self else None

    def runs(self, turn: int | None) -> bool:
        """Whether `turn` took one of its connection's prompts (False for None)."""
        return turn is not None and any(prompt.turn == turn for prompt in self._prompts())

    @property
    def shared(self) -> bool:
        """Another connection is attached to the session too."""
        return any(other is not self for other in self._shared.attached)

    async def dispose(self) -> None:
        """Let go of the session; the last attachment's dispose disposes its agent
        (checkpoints while it goes). Idempotent."""
        await self._shared.detach(self)


class _Shared:
    """One session live in the server, and the connections attached to it."""

    def __init__(self, registry: Attachments, session_id: str, first: SessionClient) -> None:
        self.registry = registry
        self.session_id = session_id
        self.attached: list[Attachment] = []
        self.first: Attachment | None = None  # the attachment that started it
        #: The principal whose client left it last while its turn went on (none before):
        #: with no client attached, the session counts as that principal's until it ends.
        self.left_by: tuple[str | None, ...] = ()
        self.started = trio.Event()  # its start is over (live, or failed)
        self.ending = False  # its agent is being disposed
        self.ended = trio.Event()  # and is gone: a load may take the session again
        self.joined = trio.Event()  # set, and replaced, as each client attaches
        self.handle: AgentHandle  # set once started
        self.client = _shared_client(self, first)

    def live(self) -> bool:
        return self.started.is_set() and not self.ending and self.handle.agent.status != "disposed"

    async def detach(self, attachment: Attachment) -> None:
        if attachment not in self.attached:
            return
        self.attached.remove(attachment)
        if self.first is attachment:  # else it keeps its connection while the session lives
            self.first = None
        if self.attached:
            return
        if self.handle.agent.status in ("running", "waiting"):
            self.left_by = (attachment.principal,)
            self.registry.nursery.start_soon(self._outlive)
            return
        await self._end()

    async def _outlive(self) -> None:
        """The turn goes on with no client: end the session once the agent is idle, if
        no one attached meanwhile."""
        await self.handle.agent.when_idle()
        if not self.attached:
            await self._end()

    async def _end(self) -> None:
        self.ending = True
        try:
            kill_owned(self.registry.bash, self.session_id)
            await self.handle.dispose()
        finally:
            if self.registry.shared.get(self.session_id) is self:
                del self.registry.shared[self.session_id]
            self.ended.set()


class Attachments:
    """The sessions of one server and who is attached to each (see the module docstring).
    Their agents are owned by `owner`; their tasks run in `bash`; a session whose turn
    outlives its clients is watched from `nursery`; what the runtime tells of a session
    reaches the connections that hold it through `routes`. A principal (None: every client of a
    server without tokens) holds at most `most` sessions at once."""

    def __init__(
        self,
        owner: Owner,
        bash: BashExecutor,
        nursery: trio.Nursery,
        routes: SessionRoutes,
        most: float = math.inf,
    ) -> None:
        self.owner = owner
        self.bash = bash
        self.nursery = nursery
        #: What the runtime tells, routed to the connections holding each session.
        self.routes = routes
        self.most = most
        self.shared: dict[str, _Shared] = {}
        self._keys = itertools.count(1)

    async def attach(
        self,
        session_id: str,
        start: Callable[[Owner, SessionClient], Awaitable[AgentHandle]],
        client: SessionClient,
        prompts: Callable[[], Iterable[Prompt[Any]]],
        principal: str | None = None,
    ) -> Attachment:
        """Attach `principal`'s connection to `session_id` if it is live here (waiting for a
        start under way); else start it with `start` (given the owner and the session's
        shared client) and attach first. Checkpoints while a start runs; a cancelled or
        failed start leaves nothing. `RpcError` if the principal holds `most` other
        sessions already."""
        held = {
            shared.session_id
            for shared in self.shared.values()
            if any(a.principal == principal for a in shared.attached)
            or (not shared.attached and principal in shared.left_by)
        }
        if session_id not in held and len(held) >= self.most:
            who = "this client" if principal is None else f"principal {principal!r}"
            raise RpcError(
                INTERNAL_ERROR,
                f"{who} has {len(held)} sessions open, the most it may: close one first",
            )
        while (shared := self.shared.get(session_id)) is not None:
            if not shared.started.is_set():
                await shared.started.wait()
                continue
            if shared.ending:  # its agent is going: take the session anew once it is gone
                await shared.ended.wait()
                continue
            if shared.live():
                return self._join(shared, client, prompts, principal)
            del self.shared[session_id]  # disposed under its clients (a hand-off)
        shared = self.shared[session_id] = _Shared(self, session_id, client)
        try:
            shared.handle = await start(self.owner, shared.client)
        except BaseException:
            del self.shared[session_id]
            raise
        finally:
            shared.started.set()
        attachment = shared.first = self._join(shared, client, prompts, principal)
        return attachment

    def _join(
        self,
        shared: _Shared,
        client: SessionClient,
        prompts: Callable[[], Iterable[Prompt[Any]]],
        principal: str | None,
    ) -> Attachment:
        attachment = Attachment(shared, next(self._keys), client, prompts, principal)
        shared.attached.append(attachment)
        shared.joined.set()  # a question waiting for clients asks this one too
        shared.joined = trio.Event()
        return attachment


class _FanOutPermissions:
    __slots__ = ("_shared",)

    def __init__(self, shared: _Shared) -> None:
        self._shared = shared

    async def decide(self, request: PermissionRequest) -> NamedAnswer:
        def ask_of(attachment: Attachment) -> Callable[[], Awaitable[NamedAnswer]] | None:
            permissions = attachment.client.permissions
            if permissions is None:
                return None

            async def ask() -> NamedAnswer:
                return _named(await permissions.decide(request), attachment.client.name)

            return ask

        return await _first_answer(self._shared, ask_of)


class _FanOutQuestions:
    __slots__ = ("_shared",)

    def __init__(self, shared: _Shared) -> None:
        self._shared = shared

    async def ask(self, question: Question) -> NamedAnswer:
        def ask_of(attachment: Attachment) -> Callable[[], Awaitable[NamedAnswer]] | None:
            questions = attachment.client.questions
            if questions is None:
                return None

            async def ask() -> NamedAnswer:
                return _named(await questions.ask(question) or "", attachment.client.name)

            return ask

        return await _first_answer(self._shared, ask_of)


def _named(answer: str | NamedAnswer, by: str) -> NamedAnswer:
    return answer if isinstance(answer, NamedAnswer) else NamedAnswer(answer, by)


class _RoutedFiles:
    __slots__ = ("_shared",)

    def __init__(self, shared: _Shared) -> None:
        self._shared = shared

    def _files(self) -> Any:
        shared = self._shared
        offering = [a for a in shared.attached if a.client.files is not None]
        if not offering:
            raise ClientGone("no attached client offers its files")
        turn = shared.handle.agent.session.open_turn
        chosen = next((a for a in offering if a.runs(turn)), offering[0])
        return chosen.client.files

    async def read_text(self, path: str, line: int | None, limit: int | None) -> str:
        text: str = await self._files().read_text(path, line, limit)
        return text

    async def write_text(self, path: str, content: str) -> None:
        await self._files().write_text(path, content)


def _shared_client(shared: _Shared, first: SessionClient) -> SessionClient:
    """The one client the session's agent asks through, made once per session: what the
    first client offers (its files, its questions) decides what the agent is given."""
    return SessionClient(
        permissions=_FanOutPermissions(shared),
        files=None if first.files is None else _RoutedFiles(shared),
        questions=None if first.questions is None else _FanOutQuestions(shared),
        name=first.name,
    )


async def _first_answer(
    shared: _Shared, ask_of: Callable[[Attachment], Callable[[], Awaitable[T]] | None]
) -> T:
    """The first answer of the session's attached clients, each asked at once (`ask_of`:
    its ask, None if it cannot be asked), and each client that attaches while no answer
    came; the others are cancelled (their requests withdrawn). One that fails drops out.
    When every client asked failed: the last failure is raised if one answered an error;
    if all went away (`AskerGone`), the question waits for a client to attach (the turn
    waits with it, as on a decision nobody can answer yet)."""
    answers: list[T] = []
    failures: list[Exception] = []
    asked: set[int] = set()
    pending = 0
    async with trio.open_nursery() as nursery:

        async def one(ask: Callable[[], Awaitable[T]]) -> None:
            nonlocal pending
            try:
                answer = await ask()
            except Exception as exc:
                failures.append(exc)
                pending -= 1
                if not pending and any(not isinstance(f, AskerGone) for f in failures):
                    nursery.cancel_scope.cancel()  # no one left who could answer
                return
            if not answers:
                answers.append(answer)
                nursery.cancel_scope.cancel()

        while True:
            for attachment in shared.attached:
                if attachment.key not in asked:
                    asked.add(attachment.key)
                    ask = ask_of(attachment)
                    if ask is not None:
                        pending += 1
                        nursery.start_soon(one, ask)
            await shared.joined.wait()
    if answers:
        return answers[0]
    raise failures[-1]
