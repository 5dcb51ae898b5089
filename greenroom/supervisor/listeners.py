"""`Listeners`: the callbacks of one kind of notice, each removable, each contained."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from greenroom.supervisor.scope import Scope

T = TypeVar("T")

logger = logging.getLogger("greenroom.listeners")


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
        self, listener: Callable[[T], object], *, scope: Scope | None = None
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
