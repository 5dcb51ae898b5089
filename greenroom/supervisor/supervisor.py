"""`Supervisor`: OTP supervision over a Trio nursery.

Each child runs in its own task, inside its own shielded `CancelScope`, in the
supervisor's nursery. The shield is what makes shutdown ordered under any
cancellation: a cancel of whatever encloses the supervisor cannot reach the
children directly; it reaches the ``async with`` body, whose exit then stops
the children one by one, last started first, each cancelled with a reason
and given its grace. A child that stops when asked (`ChildSpec.stop`: an
agent's life) has no scope of its own: it runs in a second nursery, shielded
once for all such children, and is asked instead of cancelled.

Unsolicited exits (a child returning or raising on its own) travel to one
supervising task over a channel; that task alone applies the restart
strategy, so strategies, intensity and backoff never interleave with each
other or with `start_child`/`stop_child`/`restart_child` (they share one lock).

`supervisor_child` is a `ChildSpec` that runs a nested supervisor; `cleanup_scope` is the
shielded scope a child's cleanup runs in, cut when its grace runs out.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Final

import trio

from greenroom.backoff import Backoff
from greenroom.errors import alone
from greenroom.hooks import Listeners
from greenroom.supervisor.spec import (
    STRATEGIES,
    ChildNode,
    ChildSpec,
    ChildState,
    ExitRecord,
    Outcome,
    Restart,
    Shutdown,
    Strategy,
    SupervisorEscalation,
    SupervisorTree,
)

ExitListener = Callable[[ExitRecord], object]

logger = logging.getLogger("greenroom.supervisor")

#: How many exit records a supervisor keeps in `Supervisor.exits`.
EXIT_HISTORY: Final = 256

_current_child: ContextVar[_Child] = ContextVar("greenroom_current_child")


class _Child:
    """One incarnation of a child: a restart makes a new one under the same name."""

    __slots__ = (
        "awaiting_restart",
        "cleanup_scopes",
        "cutoff",
        "finished",
        "restarts",
        "scope",
        "spec",
        "state",
        "stop_outcome",
        "value",
        "waiter",
    )

    def __init__(self, spec: ChildSpec, restarts: int) -> None:
        self.spec = spec
        self.restarts = restarts
        self.state: ChildState = "starting"
        # Shielded once started (its supervisor alone stops it then); until then its
        # starter's cancel reaches it, so a cancelled start ends at once. A child that
        # stops when asked holds it only while it starts (around its start, in the
        # starter), and None once up: it is asked, never cancelled, from then on.
        self.scope: trio.CancelScope | None = trio.CancelScope()
        self.finished = False
        self.waiter: trio.Event | None = None  # made only when someone waits
        self.value: object = None
        self.stop_outcome: Outcome | None = None
        self.cutoff: float | None = None  # when its cleanup scopes are cut off
        self.cleanup_scopes: set[trio.CancelScope] | None = None
        self.awaiting_restart = False  # its strategy will start it again after the backoff

    def finish(self) -> None:
        self.finished = True
        if self.waiter is not None:
            self.waiter.set()

    async def wait(self) -> None:
        """Wait until this incarnation has finished (checkpoints)."""
        if self.finished:
            await trio.lowlevel.checkpoint()
            return
        if self.waiter is None:
            self.waiter = trio.Event()
        await self.waiter.wait()


class _Serial:
    """The lock that serialises strategies and the public verbs.

    Uncontended, entering it does not checkpoint: every verb it guards
    checkpoints in what it then does.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()


class _ChildStatus:
    """Forwards ``started()`` to the nursery and notes that the child is up."""

    __slots__ = ("_child", "_home", "_inner")

    def __init__(self, inner: trio.TaskStatus[object], child: _Child, home: trio.Nursery) -> None:
        self._inner: trio.TaskStatus[object] | None = inner
        self._child = child
        self._home = home

    def started(self, value: object = None) -> None:
        # Trio's status holds the start's temporary nursery: let it go once used,
        # since a child's frames keep this object for the child's whole life.
        inner, self._inner = self._inner, None
        if inner is None:
            raise RuntimeError(f"child {self._child.spec.name!r} called started() twice")
        child = self._child
        child.value = value
        asked = child.spec.stop is not None
        if not asked:
            assert child.scope is not None
            child.scope.shield = True
        inner.started(value)
        if trio.lowlevel.current_task().parent_nursery is not self._home:
            # Trio leaves a child where it is when its starter was cancelled, and the
            # start waits for it to exit: a shielded child never would. End it, so
            # the start fails and nothing half-started stays behind. (A child that is
            # asked is not shielded: the cancel reaches it at its next checkpoint.)
            if not asked:
                assert child.scope is not None
                child.scope.cancel(reason="its start was cancelled")
            return
        if asked:
            child.scope = None
        if child.state == "starting":
            child.state = "running"


@contextmanager
def cleanup_scope() -> Iterator[trio.CancelScope]:
    """A shielded scope for a child's cleanup, cut off when its shutdown grace runs out.

    Use it around the cleanup a child does after its supervisor cancelled it
    (a final flush, a goodbye frame): the shield keeps the cancel out, and the
    supervisor cancels the scope at the end of the child's grace (at once for
    ``"brutal"``, never for ``"infinity"``). Outside a supervised child it is a
    plain shielded scope.
    """
    scope = trio.CancelScope(shield=True)
    child = _current_child.get(None)
    if child is None:
        with scope:
            yield scope
        return
    if child.cutoff is not None:
        scope.deadline = child.cutoff
    if child.cleanup_scopes is None:
        child.cleanup_scopes = set()
    child.cleanup_scopes.add(scope)
    try:
        with scope:
            yield scope
    finally:
        child.cleanup_scopes.discard(scope)


class Supervisor:
    """Supervise children in a nursery, OTP-style.

    ``async with Supervisor(children, ...) as sup:`` starts the static
    ``children`` in order (each is up only once it called ``started``), runs
    the body, then stops every child in reverse start order. The same ordered
    shutdown runs when the body raises or is cancelled.

    * ``strategy``: ``one_for_one`` restarts only the child that exited;
      ``one_for_all`` stops every other running child (last started first)
      and restarts them all in start order; ``rest_for_one`` does that for the
      children started after the one that exited. A strategy counts as one
      restart against the intensity, however many children it restarts.
    * ``intensity``/``period``: at most ``intensity`` restarts within
      ``period`` seconds. One more stops every child in reverse start order
      and raises `SupervisorEscalation` out of the ``async with``.
    * ``backoff``: an optional `Backoff` slept before each restart; ``rng``
      draws its jitter (pass a seeded ``random.Random`` for repeatable runs).
    * ``stop_together``: for children independent of each other (agents,
      each its own teardown order): shutdown cancels them all at once and
      waits out their graces together, so it takes one grace, not one per
      child (they unwind in no set order). A strategy's stops stay one at a
      time.

    A child whose spec has a ``stop`` is asked to stop (``stop()``) instead of
    being cancelled, and runs without a cancel scope of its own: shielded with
    the other such children in one nursery, cancelled only at the very end of
    the supervisor's shutdown if it is still running then.

    Not guaranteed: a child that shields its own cleanup with a bare
    ``CancelScope(shield=True)`` (instead of `cleanup_scope`) cannot be cut
    off; the supervisor records it ``killed`` and moves on when its grace runs
    out, and the nursery still waits for it before the ``async with`` exits.
    """

    def __init__(
        self,
        children: Sequence[ChildSpec] = (),
        *,
        name: str = "supervisor",
        strategy: Strategy = "one_for_one",
        intensity: int = 3,
        period: float = 5.0,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        stop_together: bool = False,
    ) -> None:
        _check_config(name, children, strategy, intensity, period)
        self.name = name
        self.stop_together = stop_together
        self.strategy: Strategy = strategy
        self.intensity = intensity
        self.period = float(period)
        self.backoff = backoff
        self.exits: deque[ExitRecord] = deque(maxlen=EXIT_HISTORY)
        self._rng = rng or random.Random()
        self._static = tuple(children)
        self._children: dict[str, _Child] = {}  # insertion order is start order
        self._restart_times: deque[float] = deque()
        self._window: deque[ExitRecord] = deque()
        self._listeners: Listeners[ExitRecord] = Listeners(f"supervisor {name!r} exits")
        self._serial = _Serial()
        self._entered = False
        self._closed = False
        self._nursery_manager: AbstractAsyncContextManager[trio.Nursery] = trio.open_nursery()
        self._nursery: trio.Nursery | None = None
        # The nursery of the children that are asked to stop, and its shielded scope:
        # started with the first such child.
        self._asked: trio.Nursery | None = None
        self._asked_scope: trio.CancelScope | None = None
        self._loop_scope = trio.CancelScope()
        self._loop_done = trio.Event()
        self._exits_in, self._exits_out = trio.open_memory_channel[tuple[_Child, ExitRecord]](
            math.inf
        )

    @property
    def closed(self) -> bool:
        """True once shutdown has begun; no child can be started after that."""
        return self._closed

    # -- lifecycle: the nesting here is the teardown order -------------------

    async def __aenter__(self) -> Supervisor:
        if self._entered:
            raise RuntimeError(f"supervisor {self.name!r} can be entered only once")
        self._entered = True
        self._nursery = await self._nursery_manager.__aenter__()
        self._nursery.start_soon(self._supervise, name=f"supervisor:{self.name}")
        try:
            async with self._serial:
                for spec in self._static:
                    await self._start(self._place(spec, restarts=0), forget_on_failure=True)
        except BaseException as exc:
            if not await self.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with trio.CancelScope(shield=True):
            await self._shutdown()
        try:
            return bool(await self._nursery_manager.__aexit__(exc_type, exc, tb))
        except BaseExceptionGroup as group:
            # Children never raise into the nursery (their exits are records), so
            # a group here holds the body's own errors or our escalation: one comes
            # out as itself, so that callers catch the type they expect.
            error = alone(group)
            if error is None:
                raise
            raise error from None

    async def _shutdown(self) -> None:
        """Stop the supervising task, then every child, last started first; then cancel
        what still runs of the children that were asked to stop."""
        self._closed = True
        reason = f"supervisor {self.name!r}: shutdown"
        self._loop_scope.cancel(reason=reason)
        for child in self._children.values():
            if child.state == "starting" and child.scope is not None:  # it holds its starter
                child.scope.cancel(reason=reason)
        await self._loop_done.wait()
        children = list(self._children.values())
        if not self.stop_together:
            await self._stop_all(children, "shutdown")
        else:
            for child in reversed(children):
                self._cancel(child, "shutdown")
            async with trio.open_nursery() as stopping:
                for child in children:
                    stopping.start_soon(self._wait_out, child)
        if self._asked_scope is not None:
            self._asked_scope.cancel(reason=reason)

    # -- the public verbs --------------------------------------------------

    async def start_child(self, spec: ChildSpec) -> object:
        """Start a child after the others; returns the value it passed to ``started``.

        Raises `RuntimeError` if the supervisor is closed or the child fails to
        start (naming the child; nothing is left half-started), and
        `ValueError` for a name already in use.
        """
        self._require_open(spec.name)
        async with self._serial:
            if spec.name in self._children:
                raise ValueError(f"supervisor {self.name!r}: duplicate child name {spec.name!r}")
            child = self._place(spec, restarts=0)
            await self._start(child, forget_on_failure=True)
            return child.value

    async def stop_child(self, name: str) -> None:
        """Stop one child (cancel, grace, cut-off); its spec is kept for `restart_child`.

        A temporary child is forgotten instead. Raises `KeyError` for an unknown name.
        """
        self._require_open(name)
        async with self._serial:
            child = self._child(name)
            await self._stop(child, "shutdown")
            self._settle(child)

    async def restart_child(self, name: str) -> object:
        """Stop the child if it runs, then start it again; returns its new ``started`` value."""
        self._require_open(name)
        async with self._serial:
            child = self._child(name)
            await self._stop(child, "shutdown")
            fresh = self._place(child.spec, restarts=child.restarts + 1)
            await self._start(fresh, forget_on_failure=False)
            return fresh.value

    def add_exit_listener(self, listener: ExitListener) -> Callable[[], None]:
        """Call ``listener(record)`` on every child exit; returns its remover.

        A listener that raises is logged and contained: the other listeners and
        the supervisor go on.
        """
        return self._listeners.add(listener)

    def tree(self) -> SupervisorTree:
        """A snapshot of this supervisor and its children, nested supervisors included."""
        nodes = [
            ChildNode(
                name=child.spec.name,
                state=child.state,
                restart=child.spec.restart,
                restarts=child.restarts,
                supervisor=child.value.tree() if isinstance(child.value, Supervisor) else None,
            )
            for child in self._children.values()
        ]
        return SupervisorTree(
            name=self.name,
            strategy=self.strategy,
            intensity=self.intensity,
            period=self.period,
            closed=self._closed,
            children=nodes,
        )

    # -- one child's life --------------------------------------------------

    def _require_open(self, name: str) -> None:
        if self._closed or not self._entered:
            state = "closed" if self._closed else "not entered"
            raise RuntimeError(f"supervisor {self.name!r} is {state}; cannot act on child {name!r}")

    def _child(self, name: str) -> _Child:
        try:
            return self._children[name]
        except KeyError:
            raise KeyError(f"supervisor {self.name!r} has no child {name!r}") from None

    def _placed(self, child: _Child) -> bool:
        """True while `child` is the incarnation under its name."""
        return self._children.get(child.spec.name) is child

    def _place(self, spec: ChildSpec, restarts: int) -> _Child:
        """A new incarnation, in its predecessor's place in the start order (or last)."""
        child = _Child(spec, restarts)
        self._children[spec.name] = child
        return child

    async def _start(self, child: _Child, *, forget_on_failure: bool) -> None:
        assert self._nursery is not None
        name = child.spec.name
        try:
            if child.spec.stop is None:
                await self._nursery.start(self._run_child, child, self._nursery, name=name)
            else:
                await self._start_asked(child)
        except BaseException:
            if forget_on_failure and self._placed(child):
                del self._children[name]
            await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled starter sees its cancel
            raise

    async def _start_asked(self, child: _Child) -> None:
        """Start a child that is asked to stop: its scope wraps its start here, in the
        starter, and the child leaves it once up (Trio moves it to the nursery of the
        asked), so that it keeps no scope of its own."""
        home = await self._asked_home()
        assert child.scope is not None
        with child.scope as starting:
            await home.start(self._run_child, child, home, name=child.spec.name)
        if starting.cancelled_caught:
            raise RuntimeError(
                f"supervisor {self.name!r}: start of child {child.spec.name!r} was cancelled"
            )

    async def _asked_home(self) -> trio.Nursery:
        """The nursery of the children that are asked to stop (started at the first)."""
        home = self._asked
        if home is None:
            assert self._nursery is not None
            # Shielded: Trio would leave a host whose starter was cancelled in the start's
            # nursery, and the start would wait forever for its shielded sleep to end.
            with trio.CancelScope(shield=True):
                home = await self._nursery.start(self._host_asked, name=f"{self.name}:asked")
            assert home is not None  # a shield catches no cancel: the start returned
            self._asked = home
        return home

    async def _host_asked(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        # One shield for all of them, as each other child has its own: only the end of
        # `_shutdown` cancels it, once each of them was asked and waited out.
        with trio.CancelScope(shield=True) as self._asked_scope:
            async with trio.open_nursery() as asked:
                task_status.started(asked)
                await trio.sleep_forever()

    async def _run_child(
        self, child: _Child, home: trio.Nursery, *, task_status: trio.TaskStatus[object]
    ) -> None:
        asked = child.spec.stop is not None
        if not asked:  # `cleanup_scope` finds its child (an asked child bounds its own)
            _current_child.set(child)
        error: Exception | None = None
        # The child's frames alone hold its status: they can drop it once started (an
        # agent's life does), so a long-lived child does not keep it (~120 B), nor Trio's.
        starting = child.spec.start(task_status=_ChildStatus(task_status, child, home))
        del task_status, home
        try:
            if asked:
                await starting
            else:
                # The scope strips its own Cancelled, also out of a group, before the
                # except sees what is left (an error a nursery in the child wrapped).
                assert child.scope is not None
                with child.scope:
                    await starting
        except Exception as exc:
            error = exc
        except BaseException:
            # An asked child's cancel (its start's, or the supervisor's very last) goes
            # on up to whoever cancelled; its exit is recorded all the same.
            if not asked:
                raise
            if child.state != "starting":
                self._child_exited(child, None)
                raise
            child.state = "exited"
            child.finish()
            raise
        if child.state == "starting":
            raise self._start_failed(child, error) from error
        self._child_exited(child, error)

    def _start_failed(self, child: _Child, error: Exception | None) -> RuntimeError:
        """What a child that ended before it started is raised as (and it is exited).
        A method: `_run_child`'s frame, held for the child's whole life, is kept small."""
        child.state = "exited"
        child.finish()
        name = child.spec.name
        if error is not None:
            return RuntimeError(
                f"supervisor {self.name!r}: child {name!r} failed to start: {error!r}"
            )
        if child.scope is not None and child.scope.cancelled_caught:
            return RuntimeError(f"supervisor {self.name!r}: start of child {name!r} was cancelled")
        return RuntimeError(
            f"supervisor {self.name!r}: child {name!r} returned without calling"
            " task_status.started()"
        )

    def _child_exited(self, child: _Child, error: Exception | None) -> None:
        now = trio.current_time()
        outcome: Outcome
        if error is not None:
            outcome = "error"
        elif child.stop_outcome is None:
            outcome = "normal"
        elif child.cutoff is not None and now >= child.cutoff:
            outcome = "killed"
        else:
            outcome = child.stop_outcome
        record = ExitRecord(
            child=child.spec.name,
            outcome=outcome,
            restarts=child.restarts,
            time=now,
            supervisor=self.name,
            exception=None if error is None else describe_error(error),
        )
        unsolicited = child.stop_outcome is None
        child.state = "exited" if unsolicited else "terminated"
        child.finish()
        self._publish(record)
        if not unsolicited or not self._placed(child):
            return
        if _wants_restart(child.spec, outcome):
            self._exits_in.send_nowait((child, record))
        else:
            # Settled here, not by the supervising task, so that whoever waited for
            # this child to finish finds its name free again.
            self._settle(child)

    def _publish(self, record: ExitRecord) -> None:
        self.exits.append(record)
        self._listeners.notify(record)

    def _settle(self, child: _Child) -> None:
        """A child that will not run again: forgotten if temporary, else kept as terminated."""
        child.awaiting_restart = False
        if not self._placed(child):
            return
        if child.spec.restart == "temporary":
            del self._children[child.spec.name]
        else:
            child.state = "terminated"

    async def _stop_all(self, children: list[_Child], outcome: Outcome, because: str = "") -> None:
        for child in reversed(children):
            await self._stop(child, outcome, because)

    async def _stop(self, child: _Child, outcome: Outcome, because: str = "") -> None:
        """Cancel `child` with a reason, wait out its grace, then cut it off and move on."""
        self._cancel(child, outcome, because)
        await self._wait_out(child)

    def _cancel(self, child: _Child, outcome: Outcome, because: str = "") -> None:
        """The first half of a stop: its grace starts, its scope is cancelled with a reason."""
        if child.finished:
            return
        child.state = "stopping"
        child.stop_outcome = outcome
        grace = child.spec.shutdown
        if grace == "brutal":
            child.cutoff = trio.current_time()
        elif grace != "infinity":
            child.cutoff = trio.current_time() + grace
        if child.scope is None:  # it is up, and stops when asked
            self._ask_to_stop(child)
        elif because:
            child.scope.cancel(
                reason=f"supervisor {self.name!r}: restarting after {because!r} exited"
            )
        else:
            child.scope.cancel(reason=f"supervisor {self.name!r}: {outcome}")

    def _ask_to_stop(self, child: _Child) -> None:
        """Call the child's ``stop``; one that raises is logged, and its grace runs all the same."""
        assert child.spec.stop is not None
        try:
            child.spec.stop()
        except Exception:
            logger.exception("supervisor %r: stop of child %r raised", self.name, child.spec.name)

    async def _wait_out(self, child: _Child) -> None:
        """The second half: wait for `child` within its grace, then cut its cleanup off."""
        if child.finished:
            return
        if child.cutoff is None:
            await child.wait()
            return
        with trio.move_on_at(child.cutoff):
            await child.wait()
        for scope in child.cleanup_scopes or ():
            scope.cancel(reason=f"supervisor {self.name!r}: grace of {child.spec.name!r} ran out")

    # -- the supervising task: strategy, intensity, backoff ------------------

    async def _supervise(self) -> None:
        """Apply the restart strategy to each unsolicited exit, one at a time.

        The stop half of a strategy runs under the serial lock; the backoff
        before the restart does not, so a close, `stop_child` or
        `restart_child` during it waits for nothing (OTP's supervisor retries
        a restart by messaging itself, for the same reason).
        """
        try:
            with self._loop_scope:
                async for child, record in self._exits_out:
                    async with self._serial:
                        if not self._placed(child):
                            continue
                        group = await self._stop_group(child, record)
                    await self._restart(group)
        except SupervisorEscalation:
            self._closed = True
            with trio.CancelScope(shield=True):
                await self._stop_all(list(self._children.values()), "shutdown")
            raise
        finally:
            self._loop_done.set()

    async def _stop_group(self, child: _Child, record: ExitRecord) -> list[_Child]:
        """Stop what the strategy takes down with `child`; count the restart.

        Returns the children to start again, in start order (the temporary
        siblings it stopped are forgotten instead).
        """
        members = list(self._children.values())
        if self.strategy == "one_for_one":
            group = [child]
        elif self.strategy == "one_for_all":
            group = [c for c in members if c is child or c.state == "running"]
        else:
            rest = members[members.index(child) :]
            group = [c for c in rest if c is child or c.state == "running"]
        await self._stop_all(group, "cancelled", because=child.spec.name)
        for sibling in group:
            if sibling is not child and sibling.spec.restart == "temporary":
                self._settle(sibling)
        self._count_restart(record)
        again = [c for c in group if c is child or c.spec.restart != "temporary"]
        for member in again:
            member.awaiting_restart = True
        return again

    async def _restart(self, group: list[_Child]) -> None:
        """Back off (unlocked), then start `group` in order; a failed start backs off again.

        A member that a verb settled or replaced during the backoff is skipped.
        """
        while group:
            await self._backoff()
            async with self._serial:
                group = [c for c in group if c.awaiting_restart and self._placed(c)]
                group = await self._start_each(group)

    async def _start_each(self, group: list[_Child]) -> list[_Child]:
        """Start a new incarnation of each, in order; returns what is left to retry.

        A failed start counts as one more restart: the failure and the members
        after it are returned, to be retried after the next backoff.
        """
        for index, previous in enumerate(group):
            previous.awaiting_restart = False
            fresh = self._place(previous.spec, previous.restarts + 1)
            try:
                await self._start(fresh, forget_on_failure=False)
            except RuntimeError as exc:
                if self._closed:
                    return []
                failure = ExitRecord(
                    child=previous.spec.name,
                    outcome="error",
                    restarts=fresh.restarts,
                    time=trio.current_time(),
                    supervisor=self.name,
                    exception=str(exc),
                )
                self._publish(failure)
                self._count_restart(failure)
                retry = [fresh, *group[index + 1 :]]
                for member in retry:
                    member.awaiting_restart = True
                return retry
        return []

    def _count_restart(self, record: ExitRecord) -> None:
        """Note one restart now; raise `SupervisorEscalation` past the intensity."""
        now = trio.current_time()
        horizon = now - self.period
        while self._restart_times and self._restart_times[0] <= horizon:
            self._restart_times.popleft()
            self._window.popleft()
        self._restart_times.append(now)
        self._window.append(record)
        if len(self._restart_times) > self.intensity:
            raise SupervisorEscalation(self.name, self.intensity, self.period, list(self._window))

    async def _backoff(self) -> None:
        if self.backoff is not None:
            recent = len(self._restart_times) - 1
            await trio.sleep(self.backoff.delay(recent, self._rng.random()))


def describe_error(error: BaseException) -> str:
    """``Type: message``; for a group, its leaves (a nursery wraps what a child raised)."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe_error(inner) for inner in error.exceptions)
    return f"{type(error).__name__}: {error}"


def _check_config(
    name: str, children: Sequence[ChildSpec], strategy: str, intensity: int, period: float
) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(
            f"supervisor {name!r}: unknown strategy {strategy!r}"
            f" (expected one of {sorted(STRATEGIES)})"
        )
    if isinstance(intensity, bool) or not isinstance(intensity, int) or intensity < 0:
        raise ValueError(f"supervisor {name!r}: intensity must be an int >= 0, got {intensity!r}")
    if not isinstance(period, int | float) or not math.isfinite(period) or period <= 0:
        raise ValueError(f"supervisor {name!r}: period must be seconds > 0, got {period!r}")
    seen: set[str] = set()
    for spec in children:
        if not isinstance(spec, ChildSpec):
            raise TypeError(f"supervisor {name!r}: children must be ChildSpecs, got {spec!r}")
        if spec.name in seen:
            raise ValueError(f"supervisor {name!r}: duplicate child name {spec.name!r}")
        seen.add(spec.name)


def _wants_restart(spec: ChildSpec, outcome: Outcome) -> bool:
    if spec.restart == "permanent":
        return True
    if spec.restart == "transient":
        return outcome in ("error", "killed")
    return False


def supervisor_child(
    name: str,
    children: Sequence[ChildSpec] = (),
    *,
    strategy: Strategy = "one_for_one",
    intensity: int = 3,
    period: float = 5.0,
    backoff: Backoff | None = None,
    restart: Restart = "permanent",
    shutdown: Shutdown = "infinity",
) -> ChildSpec:
    """A `ChildSpec` that runs a nested `Supervisor`; its ``started`` value is that supervisor.

    The nested supervisor's `SupervisorEscalation` is an error exit of this
    child, so the parent counts it as one failure and applies its own strategy.
    Its shutdown defaults to ``"infinity"`` (OTP's default for supervisors):
    the parent waits while the nested one stops its own children in order.
    """
    children = tuple(children)
    _check_config(name, children, strategy, intensity, period)

    async def run(*, task_status: trio.TaskStatus[Supervisor]) -> None:
        nested = Supervisor(
            children,
            name=name,
            strategy=strategy,
            intensity=intensity,
            period=period,
            backoff=backoff,
        )
        async with nested:
            task_status.started(nested)
            await trio.sleep_forever()

    return ChildSpec(name, run, restart=restart, shutdown=shutdown)
