"""`Scope`: an ordered LIFO chain of disposers.

A scope is where a resource's owner records how to undo what it set up, in
the order it set it up; `close()` undoes it in reverse. It is the shape the
seeds call load-bearing: what was entered last is left first.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TypeAlias

import trio

Disposer: TypeAlias = Callable[[], Awaitable[object] | object]


class Scope:
    """An ordered LIFO chain of sync and async disposers.

    Guarantees:

    * `close()` runs every disposer once, last added first, each awaited
      before the next starts.
    * A disposer that raises does not skip the ones after it; once the chain
      has finished, the errors are raised together as one `ExceptionGroup`
      (in the order they happened).
    * `close()` is memoised: a second caller, concurrent or later, does not
      run the chain again; it waits for the first teardown and raises the same
      errors.
    * The chain runs shielded from cancellation of its callers, so a caller
      that is cancelled mid-close cannot leave half the chain undone. A
      disposer that may hang must bound itself (``trio.move_on_after``).

    Not guaranteed: a disposer added after `close()` started is not run by that
    close; `add()` raises instead, naming the scope.
    """

    __slots__ = ("_closed", "_disposers", "_done", "_errors", "name")

    def __init__(self, name: str = "scope") -> None:
        self.name = name
        self._disposers: list[Disposer] = []
        self._closed = False
        self._done: trio.Event | None = None
        self._errors: list[Exception] = []

    @property
    def closed(self) -> bool:
        """True once `close()` has started."""
        return self._closed

    def add(self, disposer: Disposer) -> Disposer:
        """Push `disposer` on the chain; it runs before everything added earlier.

        Returns `disposer`, so the call can wrap a definition.
        """
        if self._closed:
            raise RuntimeError(f"{self.name} is closed; cannot add a disposer")
        self._disposers.append(disposer)
        return disposer

    async def close(self) -> None:
        """Run the chain (once) and wait for it to finish.

        Checkpoints: always, at least once.
        """
        if self._done is not None:
            await self._done.wait()
        else:
            self._closed = True
            self._done = trio.Event()
            try:
                with trio.CancelScope(shield=True):
                    await self._run_chain()
            finally:
                self._done.set()
        if self._errors:
            raise ExceptionGroup(f"errors while closing {self.name}", self._errors)

    async def _run_chain(self) -> None:
        while self._disposers:
            disposer = self._disposers.pop()
            try:
                result = disposer()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self._errors.append(exc)

    async def __aenter__(self) -> Scope:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
