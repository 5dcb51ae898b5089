"""greenroom from synchronous code: `run_sync` for one turn, `blocking_runtime` to keep agents.

A blocking runtime is a Trio run on a thread of its own (``greenroom:<name>``) holding one
`open_runtime`. The caller's thread makes plain calls, each crossing to that thread through
its `_Portal` (`trio.lowlevel.TrioToken.run_sync_soon` in, a reply queue out) and waiting for
the outcome; the handles mirror the Trio ones (`AgentHandle`, `Agent`, `Prompt`) verb for
verb. Agents' tools, models and hooks run on the Trio thread, as they do under ``trio.run``.

Cancellation keeps the rule every host keeps: an interrupted caller (a ``KeyboardInterrupt``,
a ``timeout=``) stops waiting, and that is all; the work is stopped by ``agent.cancel()`` or
``prompt.cancel()``. As in Trio, `BlockingRuntime.start` is the exception: interrupted, it is
cancelled and waited out, so nothing it started is left.

No blocking call may be made from inside a Trio run (the runtime's own thread, say from a
tool, or an asyncio loop hosting `greenroom.aio`): the run would wait on itself. Each refuses
with a `RuntimeError` saying what to await instead.

The names: `BlockingRuntime`, `BlockingHandle`, `BlockingAgent`, `BlockingPrompt`; an
async call is a job of the runtime's job nursery with its own cancel scope; a prompt's
answer is a `concurrent.futures.Future` its `on_settled` completes. Open runtimes are
closed at the interpreter's exit (``atexit``: the threads are daemons).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import suppress
from functools import partial
from queue import Empty, SimpleQueue
from types import TracebackType
from typing import Any, Generic, TypeAlias, TypeVar, Unpack, overload

import trio

from greenroom.actors.launch import TakeOver
from greenroom.actors.life import AgentHandle
from greenroom.actors.limits import Limits
from greenroom.actors.prompt import Answer, Prompt, PromptEvent, PromptEvents, PromptText
from greenroom.actors.spec import AgentSpec
from greenroom.actors.types import Agent
from greenroom.protocol.content import Content
from greenroom.protocol.events import MessageSource, StatusName
from greenroom.runtime import Runtime, RuntimeOptions, open_runtime
from greenroom.session.history import HistoryEntry
from greenroom.session.persistence import Interruption, Persistence, StoredSession

T = TypeVar("T")

#: A call's outcome as it crosses back: (True, its value) or (False, what it raised).
_Reply: TypeAlias = tuple[bool, Any]


def _unwrap(reply: _Reply) -> Any:
    ok, value = reply
    if ok:
        return value
    raise value


class _Portal:
    """Calls from other threads into one Trio run (see the module docstring).

    `call` runs a synchronous function there (an agent's verbs: none checkpoints); `submit`
    runs an async one in a task of the run's job nursery, under a cancel scope of its own.
    Both refuse, naming the runtime, once it is closed, and from inside any Trio run.
    """

    __slots__ = ("_jobs", "_name", "_token", "closed")

    def __init__(self, name: str, token: trio.lowlevel.TrioToken, jobs: trio.Nursery) -> None:
        self._name = name
        self._token = token
        self._jobs = jobs
        #: Set by `BlockingRuntime.close`: no call crosses from then on.
        self.closed = False

    def closed_error(self) -> RuntimeError:
        return RuntimeError(f"blocking runtime {self._name!r} is closed")

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the Trio thread: what it returns, or raises."""
        reply: SimpleQueue[_Reply] = SimpleQueue()
        self.enter(partial(_call_into, reply, fn, args))
        return _unwrap(reply.get())  # type: ignore[no-any-return]

    def submit(self, fn: Callable[..., Awaitable[T]], *args: object) -> _Job[T]:
        """``await fn(*args)`` in a task on the Trio thread; its `_Job`."""
        job: _Job[T] = _Job(self)
        self.queue(job, fn, *args)
        return job

    def queue(self, job: _Job[T], fn: Callable[..., Awaitable[T]], *args: object) -> None:
        """Have `job` run ``await fn(*args)`` in a task on the Trio thread. A job queued
        again (its caller could not tell whether an interrupt cut the last try short)
        starts once."""
        self.enter(partial(self._start, job, fn, args))

    def run(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: object,
        timeout: float | None = None,
        undo: Callable[[T], None] | None = None,
    ) -> T:
        """``await fn(*args)`` on the Trio thread, waited for. A caller interrupted anywhere
        in here (or past `timeout` seconds, `TimeoutError`) leaves nothing running: a job
        not started yet never starts, one started is cancelled and waited out, and what it
        finished anyway is undone by `undo` (given its value) before the interrupt is
        raised: an interrupt that lands while the job is being queued too."""
        job: _Job[T] = _Job(self)
        try:
            self.queue(job, fn, *args)
            return job.wait(timeout)
        except BaseException:
            job.cancel(undo)
            raise

    def enter(self, callback: Callable[[], object]) -> None:
        """Queue `callback` for the Trio thread (it must not raise)."""
        self._outside_trio()
        if self.closed:
            raise self.closed_error()
        try:
            self._token.run_sync_soon(callback)
        except trio.RunFinishedError:
            raise self.closed_error() from None

    def close(self, closing: Callable[[], None]) -> None:
        """Refuse every call from now on, and queue `closing` for the Trio thread (unless the
        run already ended by itself). Idempotent."""
        self._outside_trio()
        if not self.closed:
            self.closed = True
            with suppress(trio.RunFinishedError):
                self._token.run_sync_soon(closing)

    def _outside_trio(self) -> None:
        if trio.lowlevel.in_trio_run():
            raise RuntimeError(
                f"a call of blocking runtime {self._name!r} from inside a Trio run (a tool, or"
                " an asyncio loop hosting greenroom.aio) would wait on itself: await the"
                " agent's Trio (or greenroom.aio) API there instead"
            )

    def _start(
        self, job: _Job[Any], fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> None:
        if not job.take():  # its caller gave it up before it started, or it started
            return
        try:
            self._jobs.start_soon(job.run, fn, args)
        except RuntimeError:  # the job nursery closed: the runtime is closing
            job.reply.put((False, self.closed_error()))


def _call_into(reply: SimpleQueue[_Reply], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        reply.put((True, fn(*args)))
    except BaseException as exc:  # crossed back to the caller, raised there
        reply.put((False, exc))


class _Job(Generic[T]):
    """One async call running on the Trio thread, and its outcome once it has one."""

    __slots__ = ("_given_up", "_outcome", "_portal", "_scope", "_started", "_state", "reply")

    def __init__(self, portal: _Portal) -> None:
        self._portal = portal
        self._scope = trio.CancelScope()
        self._outcome: _Reply | None = None
        self.reply: SimpleQueue[_Reply] = SimpleQueue()
        # Whether it started, or its caller gave it up first: decided once, under the lock,
        # by whichever of the Trio thread (`take`) and the caller (`cancel`) comes first.
        self._state = threading.Lock()
        self._started = False
        self._given_up = False

    def take(self) -> bool:
        """On the Trio thread, as it starts: False if its caller gave it up already, or it
        started already (queued twice)."""
        with self._state:
            if self._started or self._given_up:
                return False
            self._started = True
            return True

    async def run(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> None:
        """The job's task (on the Trio thread): its outcome goes back, whatever it is."""
        reply: _Reply = (False, self._portal.closed_error())  # what a cancel leaves
        try:
            with self._scope:
                reply = (True, await fn(*args))
        except Exception as exc:
            reply = (False, exc)
        finally:
            self.reply.put(reply)

    @property
    def done(self) -> bool:
        """Whether a `wait` took its outcome."""
        return self._outcome is not None

    def wait(self, timeout: float | None = None) -> T:
        """Its value, or what it raised, once it has ended. Past `timeout` seconds a
        `TimeoutError`, the job left running (a later `wait` picks it up)."""
        if self._outcome is None:
            try:
                self._outcome = self.reply.get(timeout=timeout)
            except Empty:
                raise TimeoutError(f"no outcome within {timeout} s") from None
        return _unwrap(self._outcome)  # type: ignore[no-any-return]

    def cancel(self, undo: Callable[[T], None] | None = None) -> None:
        """Its caller gives it up: not started, it never starts; started and not waited
        out, it is cancelled and waited out, and what it finished anyway is undone."""
        with self._state:
            if not self._started:
                self._given_up = True
                return
        if self._outcome is None:
            with suppress(RuntimeError):  # closed: the close cancelled the job
                self._portal.enter(self._scope.cancel)
            self._outcome = ok, value = self.reply.get()
            if ok and undo is not None:
                undo(value)


class BlockingRuntime:
    """An open runtime on a Trio thread of its own, used by plain calls (`blocking_runtime`).

    `close` (or leaving its ``with`` block) disposes every agent, as `open_runtime`'s close
    does (a turn in flight ends ``disposed``, its ``turn/end`` stored), then ends the thread.
    A runtime still open when the interpreter exits is closed then. Any call once it is
    closed raises `RuntimeError` naming it.
    """

    __slots__ = ("_closing", "_portal", "_runtime", "_thread", "failure", "name")

    def __init__(
        self,
        name: str,
        portal: _Portal,
        runtime: Runtime,
        thread: threading.Thread,
        closing: Callable[[], None],
    ) -> None:
        self.name = name
        self._portal = portal
        self._runtime = runtime
        self._thread = thread
        self._closing = closing  # on the Trio thread: the runtime's close begins
        #: What the Trio run raised as it closed, until `close` raises it.
        self.failure: BaseException | None = None

    def __repr__(self) -> str:
        return f"<BlockingRuntime {self.name!r}{' closed' if self.closed else ''}>"

    def __enter__(self) -> BlockingRuntime:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._portal.closed

    def start(
        self,
        spec: AgentSpec,
        session: str | None = None,
        *,
        cwd: str | None = None,
        additional_directories: Sequence[str] | None = None,
        interrupted: Interruption = "close",
        take_over: TakeOver = "refuse",
        wait: float = 0.0,
    ) -> BlockingHandle:
        """`Runtime.start`, waited for: the agent `spec` says, live on `session` (created, or
        resumed when stored), and its handle. Raises what `Runtime.start` raises;
        interrupted, nothing is left started."""
        start = partial(
            self._runtime.start,
            spec,
            session,
            cwd=cwd,
            additional_directories=additional_directories,
            interrupted=interrupted,
            take_over=take_over,
            wait=wait,
        )
        portal = self._portal
        handle = portal.run(start, undo=lambda h: portal.submit(h.dispose).wait())
        return BlockingHandle(portal, handle)

    def history(self, session_id: str) -> list[HistoryEntry]:
        """`Runtime.history`: a session's conversation as typed values."""
        return self._portal.run(self._runtime.history, session_id)

    def list_sessions(self) -> list[StoredSession]:
        """`Runtime.list_sessions`: the stored sessions."""
        return self._portal.run(self._runtime.list_sessions)

    def close(self) -> None:
        """Dispose every agent, close the runtime, end its thread; raises what the close
        raised (once). Idempotent. Interrupted, the close goes on in its thread."""
        self._portal.close(self._closing)
        _open.discard(self)
        self._thread.join()
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure


class BlockingHandle:
    """`AgentHandle` for plain calls: ``agent``, its ids and spec, and `dispose`."""

    __slots__ = ("_handle", "_portal", "agent")

    def __init__(self, portal: _Portal, handle: AgentHandle) -> None:
        self._portal = portal
        self._handle = handle
        self.agent = BlockingAgent(portal, handle.agent)

    def __repr__(self) -> str:
        return f"<BlockingHandle {self.id!r} session {self.session_id!r}>"

    @property
    def id(self) -> str:
        return self.agent.id

    @property
    def session_id(self) -> str:
        return self.agent.session_id

    @property
    def spec(self) -> object:
        """The `AgentSpec` it was started from."""
        return self._handle.spec

    def dispose(self, timeout: float | None = None) -> None:
        """`AgentHandle.dispose`, waited for (the running turn ends ``disposed``, its
        ``turn/end`` stored; its processes, servers and session released). An interrupted
        caller, or one past `timeout` seconds (`TimeoutError`), stops waiting; the dispose
        goes on."""
        self._portal.submit(self._handle.dispose).wait(timeout)


class BlockingAgent:
    """`Agent` for plain calls: each verb runs on the runtime's Trio thread and returns what
    it returns there; `run` and `when_idle` wait."""

    __slots__ = ("_agent", "_portal", "id", "session_id")

    def __init__(self, portal: _Portal, agent: Agent) -> None:
        self._portal = portal
        self._agent = agent
        self.id = agent.id
        self.session_id = agent.session.id

    def __repr__(self) -> str:
        return f"<BlockingAgent {self.id!r}>"

    @property
    def status(self) -> StatusName:
        return self._portal.call(getattr, self._agent, "status")

    @overload
    def send(
        self, content: Content, *, source: MessageSource | None = None, limits: Limits | None = None
    ) -> BlockingPrompt[Any]: ...

    @overload
    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[T],
        limits: Limits | None = None,
    ) -> BlockingPrompt[T]: ...

    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> BlockingPrompt[Any]:
        """`Agent.send`: the prompt, queued (its bad input raised here, nothing queued)."""
        return self._send(content, source, output, limits)

    def steer(self, content: str, *, source: MessageSource | None = None) -> BlockingPrompt[None]:
        """`Agent.steer`: join the running turn before its next step (idle: `send`)."""
        steer = partial(self._agent.steer, content, source=source)
        return BlockingPrompt(self._portal, *self._portal.call(_watched, steer))

    @overload
    def run(
        self, content: Content, *, source: MessageSource | None = None, limits: Limits | None = None
    ) -> Answer[Any]: ...

    @overload
    def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[T],
        limits: Limits | None = None,
    ) -> Answer[T]: ...

    def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> Answer[Any]:
        """`send`, then wait for the `Answer`. An interrupted caller stops waiting and
        nothing else: the prompt stays queued or running (`cancel` stops it)."""
        return self._run(content, source, output, limits)

    def _send(
        self,
        content: Content,
        source: MessageSource | None,
        output: type[Any] | None,
        limits: Limits | None,
    ) -> BlockingPrompt[Any]:
        send = partial(self._agent.send, content, source=source, output=output, limits=limits)
        return BlockingPrompt(self._portal, *self._portal.call(_watched, send))

    def _run(
        self,
        content: Content,
        source: MessageSource | None,
        output: type[Any] | None,
        limits: Limits | None,
    ) -> Answer[Any]:
        # One crossing, not two: the send's bad input comes back through the same future.
        send = partial(self._agent.send, content, source=source, output=output, limits=limits)
        settled: Future[Answer[Any]] = Future()
        self._portal.enter(partial(_settling, send, settled))
        return settled.result()

    def inject(self, content: str, *, source: MessageSource | None = None) -> str:
        """`Agent.inject`: context added without running the model; its message id."""
        return self._portal.call(partial(self._agent.inject, content, source=source))

    def withdraw(self, message_id: str) -> bool:
        """`Agent.withdraw`: take back a prompt no turn took yet."""
        return self._portal.call(self._agent.withdraw, message_id)

    def cancel(self, reason: str | None = None) -> None:
        """`Agent.cancel`: stop the running turn and drop what is queued."""
        self._portal.call(self._agent.cancel, reason)

    def compact(self, instructions: str | None = None) -> None:
        """`Agent.compact`: summarise the older history."""
        self._portal.call(self._agent.compact, instructions)

    def configure(self, key: str, value: str) -> None:
        """`Agent.configure`: change a setting of the session (logged)."""
        self._portal.call(self._agent.configure, key, value)

    def when_idle(self, timeout: float | None = None) -> None:
        """Wait until the agent is idle with nothing queued (`Agent.when_idle`); past
        `timeout` seconds a `TimeoutError`."""
        self._portal.run(_until_idle, self._agent, timeout=timeout)

    def history(self) -> list[HistoryEntry]:
        """`Agent.history`: the session's conversation as typed values."""
        return self._portal.call(self._agent.history)


async def _until_idle(agent: Agent) -> None:
    await agent.when_idle()


def _settling(send: Callable[[], Prompt[T]], settled: Future[Answer[T]]) -> None:
    """On the Trio thread: `send`, its settling completing `settled` (or what it raised)."""
    try:
        prompt = send()
    except Exception as exc:
        settled.set_exception(exc)
    else:
        prompt.on_settled(settled.set_result)


def _watched(
    send: Callable[[], Prompt[T]],
) -> tuple[Prompt[T], Future[Answer[T]], PromptEvents]:
    """On the Trio thread: `send`'s prompt, a future its settling completes, and a reader of
    its turn from the send on."""
    prompt = send()
    settled: Future[Answer[T]] = Future()
    prompt.on_settled(settled.set_result)
    return prompt, settled, prompt.events()


class BlockingPrompt(Generic[T]):
    """`Prompt` for plain calls: `answer` waits for its `Answer`; `events` and `text` are
    plain iterators over its turn; `cancel` stops it."""

    __slots__ = ("_from_send", "_portal", "_prompt", "_settled", "id")

    def __init__(
        self,
        portal: _Portal,
        prompt: Prompt[T],
        settled: Future[Answer[T]],
        from_send: PromptEvents,
    ) -> None:
        self._portal = portal
        self._prompt = prompt
        self._settled = settled
        self._from_send: PromptEvents | None = from_send  # for the first reader
        self.id = prompt.id

    def __repr__(self) -> str:
        return f"<BlockingPrompt {self.id!r} {'settled' if self.settled else 'pending'}>"

    @property
    def settled(self) -> bool:
        return self._settled.done()

    def answer(self, timeout: float | None = None) -> Answer[T]:
        """The `Answer`, once the prompt is settled (at once if it is). An interrupted
        caller, or one past `timeout` seconds (`TimeoutError`), stops waiting, and that is
        all: the prompt stays the agent's."""
        return self._settled.result(timeout)

    def cancel(self, reason: str | None = None) -> None:
        """`Prompt.cancel`: withdrawn if no turn took it yet, else its turn cancelled."""
        self._portal.call(self._prompt.cancel, reason)

    def events(self) -> Iterator[PromptEvent]:
        """`Prompt.events` as a plain iterator, until its turn's ``turn/end``: the first
        reader (of `events` or `text`) follows the turn from the `send` on (the turn may
        have begun before this call crossed), each later one from its call. An interrupted
        reader loses nothing: its next `next` goes on."""
        return _Following(self._portal, self._reader())

    def text(self) -> Iterator[str]:
        """`Prompt.text` as a plain iterator: the text deltas of `events`."""
        return _Following(self._portal, PromptText(self._reader()))

    def _reader(self) -> PromptEvents:
        reader, self._from_send = self._from_send, None
        if reader is None:
            reader = self._portal.call(self._prompt.events)
        return reader


class _Following(Generic[T]):
    """A plain iterator over an async iterator of the Trio thread. A read an interrupt left
    waiting is picked up by the next `__next__`, so nothing is lost or read twice."""

    __slots__ = ("_iterator", "_pending", "_portal", "_queued")

    def __init__(self, portal: _Portal, iterator: AsyncIterator[T]) -> None:
        self._portal = portal
        self._iterator = iterator
        self._pending: _Job[T] | None = None
        self._queued = False  # whether the pending read is surely queued

    def __iter__(self) -> _Following[T]:
        return self

    def __next__(self) -> T:
        job = self._pending
        if job is None:
            job = self._pending = _Job(self._portal)
            self._queued = False
        if not self._queued:  # again after an interrupt that cut queueing short: it runs once
            self._portal.queue(job, _next_of, self._iterator)
            self._queued = True
        try:
            value = job.wait()
        except StopAsyncIteration:
            raise StopIteration from None
        finally:
            if job.done:
                self._pending = None
        return value


async def _next_of(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()


#: The runtimes still open, closed at the interpreter's exit.
_open: set[BlockingRuntime] = set()


def blocking_runtime(**options: Unpack[RuntimeOptions]) -> BlockingRuntime:
    """Open a runtime (`open_runtime` with these `options`) on a Trio thread of its own and
    return it, open: use it in a ``with`` block, or `close` it (a notebook keeps one across
    cells). What opening raises is raised here, nothing left running."""
    name = options.get("name", "greenroom")
    ready: SimpleQueue[_Reply] = SimpleQueue()
    box: list[BlockingRuntime] = []
    closing = trio.Event()

    async def host() -> None:
        async with open_runtime(**options) as runtime, trio.open_nursery() as jobs:
            thread = threading.current_thread()
            portal = _Portal(name, trio.lowlevel.current_trio_token(), jobs)
            ready.put((True, BlockingRuntime(name, portal, runtime, thread, closing.set)))
            await closing.wait()
            jobs.cancel_scope.cancel()  # calls still waiting end first; then the agents

    def serve() -> None:
        try:
            trio.run(host)
        except BaseException as exc:
            if box:
                box[0].failure = exc
            else:
                ready.put((False, exc))

    thread = threading.Thread(target=serve, name=f"greenroom:{name}", daemon=True)
    thread.start()
    runtime: BlockingRuntime = _unwrap(ready.get())
    box.append(runtime)
    _open.add(runtime)
    return runtime


def run_sync(
    spec: AgentSpec,
    content: Content,
    *,
    output: type[Any] | None = None,
    limits: Limits | None = None,
    session: str | None = None,
    persistence: Persistence | None = None,
    store: str | None = None,
) -> Answer[Any]:
    """One turn of `spec` from synchronous code: a runtime for the call (`blocking_runtime`,
    with `persistence`, or `store` by URL), `spec` started on `session` (a fresh one when
    None; a stored one goes on where it stopped), `content` sent, the `Answer` returned, the
    runtime closed.

    Raises `RuntimeError` inside a Trio run (await ``agent.run`` there instead), and what
    `Runtime.start` raises. Interrupted, the runtime is closed first (its turn ends
    ``disposed``, stored)."""
    if trio.lowlevel.in_trio_run():
        raise RuntimeError(
            "run_sync() inside a Trio run (or an asyncio loop hosting greenroom.aio) would"
            " block it: await agent.run(...) there instead"
        )
    with blocking_runtime(persistence=persistence, store=store) as rt:
        agent = rt.start(spec, session).agent
        return agent._run(content, None, output, limits)


@atexit.register
def _close_all() -> None:
    """At the interpreter's exit, close what is still open (its agents disposed, their turn
    ends stored): the threads are daemons, which exit would otherwise cut."""
    for runtime in list(_open):
        try:
            runtime.close()
        except Exception:  # one that fails to close must not keep the others open
            continue
