"""An error comes out as itself: what Trio's nurseries wrap in groups of one, unwrapped.

`alone` gives the one exception a group of one holds; `open_runtime` and `Supervisor` let
their body's error out through it as itself.
"""

from __future__ import annotations


def alone(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception `group` holds, through any groups of one nested in it; None when
    it holds two or more (two things failed at once: the group is the truth)."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        if len(error.exceptions) != 1:
            return None
        error = error.exceptions[0]
    return error
