"""`Backoff`: exponential delays with jitter, for supervisor restarts and model retries.

Pure arithmetic (no Trio): the caller sleeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter, in seconds.

    The delay before attempt ``n + 1`` is ``min(maximum, initial * multiplier ** n)``,
    stretched by a random factor in ``[1, 1 + jitter]``. A supervisor counts
    ``n`` as the restarts already inside its intensity window (so a quiet
    period resets it); a model adapter counts its failed attempts.
    """

    initial: float = 0.1
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for field in ("initial", "maximum", "multiplier", "jitter"):
            value = getattr(self, field)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Backoff.{field} must be a finite number >= 0, got {value!r}")
        if self.multiplier < 1:
            raise ValueError(f"Backoff.multiplier must be >= 1, got {self.multiplier!r}")

    def delay(self, attempts: int, unit_random: float) -> float:
        """The delay after `attempts` earlier attempts; ``unit_random`` is drawn from [0, 1)."""
        base = min(self.maximum, self.initial * self.multiplier**attempts)
        return base * (1.0 + self.jitter * unit_random)
