"""The event bus: typed hooks (emits and waterfalls) and `Listeners`, each removable.

A hook is a small named object typed by what its listeners receive, so a
listener of the wrong shape is a mypy error and an emit with no listeners
costs one dict lookup.

The rule for emitters: an emit made once or more per prompt, turn, step,
chunk or progress notice is guarded, ``if hook in hooks.listened:
hooks.emit(hook, ...)``, which costs that lookup and nothing else while
nobody listens (no call, no arguments packed); a rarer one (an error, a
life's start or end, a carried-on turn) is made bare. `Emitter` is the
guarded emit, bound to one hook. The named hooks themselves live with their vocabulary
(``greenroom.actors.events``, ``greenroom.session.store``); this module
knows no agent or session. Hooks are for observers and for the waterfalls
that shape a turn; nothing that must not be lost (the session log's write
path) goes through them.

The names: `EmitHook` and `WaterfallHook` (a hook of each kind), `Hooks` (one runtime's
listener table; ``listened`` is its live read-only view of the hooks that have
listeners, the one check a hot path makes), `Emitter` and `Listeners` (removable,
contained callbacks of one kind of notice).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

logger = logging.getLogger("greenroom.hooks")


class Disposers(Protocol):
    """Whatever collects removers to run later (a `greenroom.supervisor.Scope`)."""

    def add(self, disposer: Callable[[], object], /) -> object: ...


class EmitHook(Generic[P]):
    """A synchronous notification; listeners are called in registration order."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"EmitHook({self.name!r})"


class WaterfallHook(Generic[T, P]):
    """A value passed through each handler in turn; each returns the (new) value."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"WaterfallHook({self.name!r})"


class Hooks:
    """The listener table of one runtime.

    Guarantees:

    * A listener added with ``scope=`` is removed when that scope closes; the
      returned remover does the same at any time (idempotent).
    * An emit listener that raises is logged and contained: the remaining
      listeners run, and the emitter never sees the error.
    * A waterfall handler that raises propagates to the caller: a waterfall
      shapes what happens next, so its failure is the caller's failure.
    """

    __slots__ = ("_table", "listened")

    def __init__(self) -> None:
        self._table: dict[object, tuple[Callable[..., Any], ...]] = {}
        #: The hooks something listens to now (a live, read-only view): ``hook in
        #: listened`` is the check an emitter on a hot path makes before it emits.
        self.listened: Mapping[object, object] = MappingProxyType(self._table)

    def on(
        self,
        hook: EmitHook[P],
        listener: Callable[P, object],
        *,
        scope: Disposers | None = None,
    ) -> Callable[[], None]:
        """Call ``listener(*args)`` on every ``emit(hook, *args)``."""
        return self._add(hook, listener, scope)

    def intercept(
        self,
        hook: WaterfallHook[T, P],
        handler: Callable[Concatenate[T, P], Awaitable[T]],
        *,
        scope: Disposers | None = None,
    ) -> Callable[[], None]:
        """Pass the value of every ``waterfall(hook, value, *args)`` through ``handler``."""
        return self._add(hook, handler, scope)

    def emit(self, hook: EmitHook[P], *args: P.args, **kwargs: P.kwargs) -> None:
        listeners = self._table.get(hook)
        if listeners is None:
            return
        for listener in listeners:
            try:
                listener(*args, **kwargs)
            except Exception:
                logger.exception("listener %r of %s raised", listener, hook.name)

    async def waterfall(
        self, hook: WaterfallHook[T, P], value: T, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        for handler in self._table.get(hook, ()):
            value = await handler(value, *args, **kwargs)
        return value

    def _add(
        self, hook: object, fn: Callable[..., Any], scope: Disposers | None
    ) -> Callable[[], None]:
        self._table[hook] = (*self._table.get(hook, ()), fn)
        removed = False

        def remove() -> None:
            nonlocal removed
            if removed:
                return
            removed = True
            rest = list(self._table.get(hook, ()))
            rest.remove(fn)
            if rest:
                self._table[hook] = tuple(rest)
            else:
                del self._table[hook]

        if scope is not None:
            scope.add(remove)
        return remove


class Emitter(Generic[P]):
    """One hook of one `Hooks`, bound, for an object that emits it on every step of a hot
    path (a session's appends): ``if emitter.hook in emitter.listened:
    emitter.emit(*args)`` costs one lookup while nothing listens, and one call (the
    emit, with its guarantees) while something does."""

    __slots__ = ("emit", "hook", "listened")

    def __init__(self, hooks: Hooks, hook: EmitHook[P]) -> None:
        self.hook = hook
        self.listened = hooks.listened
        self.emit: Callable[P, None] = partial(hooks.emit, hook)


class Listeners(Generic[T]):
    """Callbacks of one argument, called in the order they were added.

    `add` returns an idempotent remover (and hands it to ``scope`` if given);
    `notify` calls every listener, and one that raises is logged under
    `what` and skipped: the others and the notifier go on.
    """

    __slots__ = ("_listeners", "_what")

    def __init__(self, what: str) -> None:
        self._what = what
        self._listeners: list[Callable[[T], object]] = []

    def add(
        self, listener: Callable[[T], object], *, scope: Disposers | None = None
    ) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        if scope is not None:
            scope.add(remove)
        return remove

    def clear(self) -> None:
        self._listeners.clear()

    def notify(self, value: T) -> None:
        for listener in list(self._listeners):
            try:
                listener(value)
            except Exception:
                logger.exception("a listener of %s raised", self._what)
