"""greenroom from asyncio: `open_runtime`, and handles whose waits are asyncio awaitables.

Trio runs as a guest of the asyncio loop (`trio.lowlevel.start_guest_run`): on the loop's
own thread, Trio's guarantees intact. A thread holds one Trio run at a time, so the runtimes
opened on one loop share one run (`_Guest`): the first to open starts it, the last to close
ends it. `open_runtime` is an async generator, so a block never left is closed by the loop's
shutdown of its async generators (`asyncio.run` does it before it closes the loop): the run
always ends before the loop closes, the agents disposed and each turn's end stored.

Guest mode keeps Trio's run state on the loop's thread, and a Trio task woken from host code
wakes the run, so the agents' synchronous verbs (``send``, ``steer``, ``cancel``,
``prompt.cancel`` ...) are called directly and stay synchronous, crossing nothing; each wait
is an asyncio future the Trio side completes (a prompt's through `Prompt.on_settled`, the
others through a task of the runtime's job nursery). Tools, models and hooks run in Trio
tasks on the loop's thread: a tool that blocks blocks the loop, as any asyncio code would.

Cancellation keeps the rule every host keeps: a cancelled awaiter stops waiting, and that is
all; the work is stopped by ``agent.cancel()`` or ``prompt.cancel()``. As in Trio, a
cancelled `AioRuntime.start` (or `open_runtime`) leaves nothing started, and leaving
`open_runtime`'s block is not cut short by a cancel: the close runs to its end, then the
cancel is raised.

The names: `AioRuntime`, `AioHandle`, `AioAgent`, `AioPrompt` (``run``, ``when_idle``,
``dispose``, a prompt's await, ``events`` and ``text`` are asyncio awaitables); each
runtime is held by a Trio task of the shared run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Sequence,
)
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Generic, TypeVar, Unpack, overload

import trio

from greenroom.actors.launch import TakeOver
from greenroom.actors.life import AgentHandle
from greenroom.actors.limits import Limits
from greenroom.actors.prompt import Answer, Prompt, PromptEvent
from greenroom.actors.spec import AgentSpec
from greenroom.actors.types import Agent
from greenroom.protocol.content import Content
from greenroom.protocol.events import MessageSource, StatusName
from greenroom.runtime import Runtime, RuntimeOptions
from greenroom.runtime import open_runtime as open_trio_runtime
from greenroom.session.history import HistoryEntry
from greenroom.session.persistence import Interruption, StoredSession

T = TypeVar("T")

__all__ = ["AioAgent", "AioHandle", "AioPrompt", "AioRuntime", "open_runtime"]


async def _outlast(future: asyncio.Future[Any]) -> bool:
    """Wait until `future` is done, whatever cancels the waiting task meanwhile; whether
    anything did (the caller raises that cancel once it is done)."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # its outcome is the caller's to read
            break
    return cancelled


class _Job(Generic[T]):
    """One async call in a Trio task of a runtime's job nursery, and the asyncio future its
    outcome completes."""

    __slots__ = ("_closed", "_scope", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop, closed: Callable[[], Exception]) -> None:
        self.future: asyncio.Future[T] = loop.create_future()
        self._scope = trio.CancelScope()
        self._closed = closed

    async def run(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> None:
        """The job's task: its outcome goes to the future, whatever it is."""
        future = self.future
        try:
            with self._scope:
                value = await fn(*args)
                future.set_result(value)
        except Exception as exc:
            future.set_exception(exc)
        finally:
            if not future.done():  # cancelled: by its waiter, or the runtime's close
                future.set_exception(self._closed())

    async def wait(self) -> T:
        """Its value, or what it raised. A cancelled waiter stops waiting; the job goes on."""
        return await asyncio.shield(self.future)

    async def wait_or_cancel(self, undo: Callable[[T], _Job[None]] | None = None) -> T:
        """`wait`; a waiter cancelled meanwhile cancels the job and waits it out (and, given
        `undo`, waits out the job `undo` submits to undo what it finished anyway) before the
        cancel is raised: nothing the job did is left behind."""
        try:
            return await asyncio.shield(self.future)
        except asyncio.CancelledError:
            self._scope.cancel()
            await _outlast(self.future)
            future = self.future
            if undo is not None and not future.exception():
                await _outlast(undo(future.result()).future)
            raise


class _Calls:
    """Where one runtime's waits run: its Trio job nursery, and the checks every call makes
    (the runtime open, the caller on the loop's thread)."""

    __slots__ = ("_jobs", "_loop", "_thread", "closed", "name")

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, jobs: trio.Nursery) -> None:
        self.name = name
        self._loop = loop
        self._jobs = jobs
        self._thread = threading.get_ident()
        self.closed = False

    def closed_error(self) -> RuntimeError:
        return RuntimeError(f"greenroom.aio runtime {self.name!r} is closed")

    def check(self) -> None:
        """Raise `RuntimeError` unless the runtime is open and this is the loop's thread."""
        if self.closed:
            raise self.closed_error()
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                f"greenroom.aio runtime {self.name!r} is used from another thread than its"
                " event loop's: call it from the loop (asyncio.run_coroutine_threadsafe)"
            )

    def submit(self, fn: Callable[..., Awaitable[T]], *args: object) -> _Job[T]:
        """``await fn(*args)`` in a Trio task, from now on; its `_Job`."""
        self.check()
        job: _Job[T] = _Job(self._loop, self.closed_error)
        try:
            self._jobs.start_soon(job.run, fn, args)
        except RuntimeError:  # the job nursery closed: the runtime is closing
            raise self.closed_error() from None
        return job


class AioRuntime:
    """An open runtime for asyncio code (`open_runtime`): `start` agents; `history` and
    `list_sessions` read the store."""

    __slots__ = ("_calls", "_closing", "_ended", "_runtime")

    def __init__(
        self,
        calls: _Calls,
        runtime: Runtime,
        closing: trio.Event,
        ended: asyncio.Future[None],
    ) -> None:
        self._calls = calls
        self._runtime = runtime
        self._closing = closing
        self._ended = ended

    def __repr__(self) -> str:
        return f"<AioRuntime {self.name!r}{' closed' if self.closed else ''}>"

    @property
    def name(self) -> str:
        return self._calls.name

    @property
    def closed(self) -> bool:
        return self._calls.closed

    async def start(
        self,
        spec: AgentSpec,
        session: str | None = None,
        *,
        cwd: str | None = None,
        additional_directories: Sequence[str] | None = None,
        interrupted: Interruption = "close",
        take_over: TakeOver = "refuse",
        wait: float = 0.0,
    ) -> AioHandle:
        """`Runtime.start`: the agent `spec` says, live on `session` (created, or resumed
        when stored), and its handle. Raises what `Runtime.start` raises; a cancelled
        caller leaves nothing started."""
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
        undo = self._calls.submit  # the handle's dispose, a Trio job as every other
        handle = await self._calls.submit(start).wait_or_cancel(lambda h: undo(h.dispose))
        return AioHandle(self._calls, handle)

    async def history(self, session_id: str) -> list[HistoryEntry]:
        """`Runtime.history`: a session's conversation as typed values."""
        return await self._calls.submit(self._runtime.history, session_id).wait_or_cancel()

    async def list_sessions(self) -> list[StoredSession]:
        """`Runtime.list_sessions`: the stored sessions."""
        return await self._calls.submit(self._runtime.list_sessions).wait_or_cancel()

    def close_soon(self) -> None:
        """Refuse every call from now on, and begin the close (`aclose` waits for it)."""
        self._calls.closed = True
        self._closing.set()

    async def aclose(self) -> None:
        """Dispose every agent (a turn in flight ends ``disposed``, its ``turn/end``
        stored) and close the runtime; raises what the close raised. Not cut short by a
        cancel: that is raised once the close is done. Idempotent."""
        self.close_soon()
        cancelled = await _outlast(self._ended)
        self._ended.result()
        if cancelled:
            raise asyncio.CancelledError


class AioHandle:
    """`AgentHandle` for asyncio: ``agent``, its ids and spec, and `dispose`."""

    __slots__ = ("_calls", "_handle", "agent")

    def __init__(self, calls: _Calls, handle: AgentHandle) -> None:
        self._calls = calls
        self._handle = handle
        self.agent = AioAgent(calls, handle.agent)

    def __repr__(self) -> str:
        return f"<AioHandle {self.id!r} session {self.session_id!r}>"

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

    async def dispose(self) -> None:
        """`AgentHandle.dispose` (the running turn ends ``disposed``, its ``turn/end``
        stored; its processes, servers and session released). A cancelled caller stops
        waiting; the dispose goes on."""
        await self._calls.submit(self._handle.dispose).wait()


class AioAgent:
    """`Agent` for asyncio: the verbs are the Trio agent's own, called directly (guest mode
    shares the thread); `run` and `when_idle` are awaitables."""

    __slots__ = ("_agent", "_calls", "id", "session_id")

    def __init__(self, calls: _Calls, agent: Agent) -> None:
        self._calls = calls
        self._agent = agent
        self.id = agent.id
        self.session_id = agent.session.id

    def __repr__(self) -> str:
        return f"<AioAgent {self.id!r}>"

    @property
    def status(self) -> StatusName:
        self._calls.check()
        return self._agent.status

    @overload
    def send(
        self, content: Content, *, source: MessageSource | None = None, limits: Limits | None = None
    ) -> AioPrompt[Any]: ...

    @overload
    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[T],
        limits: Limits | None = None,
    ) -> AioPrompt[T]: ...

    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> AioPrompt[Any]:
        """`Agent.send`: the prompt, queued (its bad input raised here, nothing queued)."""
        self._calls.check()
        return AioPrompt(self._calls, _sent(self._agent, content, source, output, limits))

    def steer(self, content: str, *, source: MessageSource | None = None) -> AioPrompt[None]:
        """`Agent.steer`: join the running turn before its next step (idle: `send`)."""
        self._calls.check()
        return AioPrompt(self._calls, self._agent.steer(content, source=source))

    @overload
    async def run(
        self, content: Content, *, source: MessageSource | None = None, limits: Limits | None = None
    ) -> Answer[Any]: ...

    @overload
    async def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[T],
        limits: Limits | None = None,
    ) -> Answer[T]: ...

    async def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> Answer[Any]:
        """`send`, then await the `Answer`. A cancelled caller stops waiting and nothing
        else: the prompt stays queued or running (`cancel` stops it)."""
        self._calls.check()
        return await AioPrompt(self._calls, _sent(self._agent, content, source, output, limits))

    def inject(self, content: str, *, source: MessageSource | None = None) -> str:
        """`Agent.inject`: context added without running the model; its message id."""
        self._calls.check()
        return self._agent.inject(content, source=source)

    def withdraw(self, message_id: str) -> bool:
        """`Agent.withdraw`: take back a prompt no turn took yet."""
        self._calls.check()
        return self._agent.withdraw(message_id)

    def cancel(self, reason: str | None = None) -> None:
        """`Agent.cancel`: stop the running turn and drop what is queued."""
        self._calls.check()
        self._agent.cancel(reason)

    def compact(self, instructions: str | None = None) -> None:
        """`Agent.compact`: summarise the older history."""
        self._calls.check()
        self._agent.compact(instructions)

    def configure(self, key: str, value: str) -> None:
        """`Agent.configure`: change a setting of the session (logged)."""
        self._calls.check()
        self._agent.configure(key, value)

    def when_idle(self) -> Awaitable[None]:
        """`Agent.when_idle`: registered now, at the call; awaited, returns once the agent is
        idle with nothing queued. A cancelled awaiter stops waiting."""
        return _Waiting(self._calls.submit(_awaited, self._agent.when_idle()))

    def history(self) -> list[HistoryEntry]:
        """`Agent.history`: the session's conversation as typed values."""
        self._calls.check()
        return self._agent.history()


def _sent(
    agent: Agent,
    content: Content,
    source: MessageSource | None,
    output: type[Any] | None,
    limits: Limits | None,
) -> Prompt[Any]:
    if output is None:  # (the `Agent` protocol types an output asked for, or none)
        return agent.send(content, source=source, limits=limits)
    return agent.send(content, source=source, output=output, limits=limits)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class _Waiting(Generic[T]):
    """A job's outcome as an awaitable made at once (never awaiting it is fine, as with
    Trio's `when_idle`); a cancelled awaiter cancels the job."""

    __slots__ = ("_job",)

    def __init__(self, job: _Job[T]) -> None:
        self._job = job

    def __await__(self) -> Generator[Any, None, T]:
        return self._job.wait_or_cancel().__await__()


class AioPrompt(Generic[T]):
    """`Prompt` for asyncio: awaited, its `Answer`; `events` and `text` are async iterators
    over its turn; `cancel` stops it."""

    __slots__ = ("_calls", "_prompt", "_settled")

    def __init__(self, calls: _Calls, prompt: Prompt[T]) -> None:
        self._calls = calls
        self._prompt = prompt
        self._settled: asyncio.Future[Answer[T]] | None = None

    def __repr__(self) -> str:
        return f"<AioPrompt {self.id!r} {'settled' if self.settled else 'pending'}>"

    @property
    def id(self) -> str:
        return self._prompt.id

    @property
    def settled(self) -> bool:
        return self._prompt.settled

    def __await__(self) -> Generator[Any, None, Answer[T]]:
        """Its `Answer`, once settled (at once if it is). A cancelled awaiter stops waiting,
        and that is all: the prompt stays the agent's."""
        settled = self._settled
        if settled is None:
            settled = self._settled = asyncio.get_running_loop().create_future()
            self._prompt.on_settled(settled.set_result)
        return asyncio.shield(settled).__await__()

    def cancel(self, reason: str | None = None) -> None:
        """`Prompt.cancel`: withdrawn if no turn took it yet, else its turn cancelled."""
        self._calls.check()
        self._prompt.cancel(reason)

    def events(self) -> AsyncIterator[PromptEvent]:
        """`Prompt.events`: its turn's events from the call on, until its ``turn/end``. A
        cancelled reader loses nothing: the next ``__anext__`` goes on."""
        self._calls.check()
        return _Following(self._calls, self._prompt.events())

    def text(self) -> AsyncIterator[str]:
        """`Prompt.text`: its turn's text deltas from the call on."""
        self._calls.check()
        return _Following(self._calls, self._prompt.text())


class _Following(Generic[T]):
    """An asyncio async iterator over a Trio one. A read a cancel left waiting is picked up
    by the next `__anext__`, so nothing is lost or read twice."""

    __slots__ = ("_calls", "_iterator", "_pending")

    def __init__(self, calls: _Calls, iterator: AsyncIterator[T]) -> None:
        self._calls = calls
        self._iterator = iterator
        self._pending: _Job[T] | None = None

    def __aiter__(self) -> _Following[T]:
        return self

    async def __anext__(self) -> T:
        job = self._pending
        if job is None:
            job = self._pending = self._calls.submit(_next_of, self._iterator)
        value = await job.wait()  # a cancel here leaves the job pending
        self._pending = None
        return value


async def _next_of(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()


class _Guest:
    """The Trio run hosted on one asyncio loop (guest mode), shared by the runtimes opened on
    it: started by the first, ended by the last to close."""

    __slots__ = ("_done", "_holders", "_loop", "_ready", "_stop", "ending", "users")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ready: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()
        self._stop = trio.Event()
        self._holders: trio.Nursery | None = None
        #: How many `open_runtime` blocks hold the run.
        self.users = 0
        #: Set once `end` began: a runtime opened from then on waits for a run of its own.
        self.ending = False

    async def start(self) -> None:
        """Start the run on this loop; returns once it can take runtimes."""
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=self._loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=self._loop.call_soon,
            done_callback=self._finished,
            host_uses_signal_set_wakeup_fd=True,
        )
        await self._ready

    async def _main(self) -> None:
        async with trio.open_nursery() as holders:
            self._holders = holders
            self._ready.set_result(None)
            await self._stop.wait()

    def _finished(self, outcome: Any) -> None:
        try:
            outcome.unwrap()
        except BaseException as exc:  # the run failed: whoever waits for its end sees why
            self._done.set_exception(exc)
        else:
            self._done.set_result(None)

    async def wait_ended(self) -> None:
        """Wait until the run has ended (a cancel stops the waiting only)."""
        await asyncio.shield(self._done)

    async def open(self, options: RuntimeOptions) -> AioRuntime:
        """A runtime held by a Trio task of this run, open; what opening raised. A cancelled
        caller leaves nothing open."""
        await asyncio.shield(self._ready)
        assert self._holders is not None
        opened: asyncio.Future[AioRuntime] = self._loop.create_future()
        ended: asyncio.Future[None] = self._loop.create_future()
        self._holders.start_soon(self._hold, options, opened, ended)
        try:
            return await asyncio.shield(opened)
        except asyncio.CancelledError:
            if not opened.done():
                opened.cancel()  # the holder closes what it opens
            elif not opened.exception():
                opened.result().close_soon()
            await _outlast(ended)
            raise

    async def _hold(
        self,
        options: RuntimeOptions,
        opened: asyncio.Future[AioRuntime],
        ended: asyncio.Future[None],
    ) -> None:
        name = options.get("name", "greenroom")
        closing = trio.Event()
        try:
            async with open_trio_runtime(**options) as runtime, trio.open_nursery() as jobs:
                if opened.cancelled():  # its opener was cancelled: close it at once
                    return
                calls = _Calls(name, self._loop, jobs)
                opened.set_result(AioRuntime(calls, runtime, closing, ended))
                await closing.wait()
                jobs.cancel_scope.cancel()  # waits still pending end first; then the agents
        except Exception as exc:
            if not opened.done():
                opened.set_exception(exc)
            else:
                ended.set_exception(exc)
        finally:
            if not opened.done():  # cut before it opened (an interrupt)
                opened.set_exception(RuntimeError(f"greenroom.aio runtime {name!r} is closed"))
            if not ended.done():
                ended.set_result(None)

    async def leave(self) -> None:
        """One `open_runtime` block is done; the last ends the run and waits for its end,
        whatever cancels the caller meanwhile (raised once it has ended)."""
        self.users -= 1
        if self.users:
            return
        self.ending = True
        self._stop.set()
        cancelled = await _outlast(self._done)
        del _guests[self._loop]
        self._done.result()
        if cancelled:
            raise asyncio.CancelledError


#: Each loop's guest run, until it has ended.
_guests: dict[asyncio.AbstractEventLoop, _Guest] = {}


async def _joined() -> _Guest:
    """The running loop's guest run (one that is ending waited out first), started if it has
    none; one more user of it."""
    loop = asyncio.get_running_loop()
    while (guest := _guests.get(loop)) is not None and guest.ending:
        await guest.wait_ended()
    if guest is not None:
        guest.users += 1
        return guest
    guest = _guests[loop] = _Guest(loop)
    guest.users += 1
    try:
        await guest.start()
    except BaseException:
        del _guests[loop]
        raise
    return guest


@asynccontextmanager
async def open_runtime(**options: Unpack[RuntimeOptions]) -> AsyncIterator[AioRuntime]:
    """Open a runtime (`greenroom.open_runtime` with these `options`) on the running asyncio
    loop, Trio running as its guest; leaving the block disposes every agent (each turn's end
    stored) and closes it, to its end even if the leaving task is cancelled (the cancel is
    raised after). What opening raises is raised here, nothing left open."""
    guest = await _joined()
    try:
        runtime = await guest.open(options)
        try:
            yield runtime
        finally:
            await runtime.aclose()
    finally:
        await guest.leave()
