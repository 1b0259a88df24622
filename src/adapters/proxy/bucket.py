"""A token bucket that rations `accept`.

Invariants: the bucket starts full; tokens refill continuously at `rate` per second and never
exceed `burst`; a clock that steps backwards mints nothing. The clock is a plain callable returning
seconds, so tests drive it by hand. A token counts as whole within `_EPSILON`, so refills summed
from float steps (0.1 s five times at 2/s) give the token they add up to.
"""

import time
from collections.abc import Callable

_EPSILON = 1e-9


class TokenBucket:
    def __init__(
        self, burst: int, rate: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        if rate <= 0:
            raise ValueError(f"rate must be above 0, got {rate}")
        self._burst = float(burst)
        self._rate = rate
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def take(self) -> bool:
        """Take one token if there is one; return whether it was taken."""
        now = self._clock()
        elapsed = max(0.0, now - self._stamp)
        self._stamp = max(self._stamp, now)
        self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
        if self._tokens >= 1.0 - _EPSILON:
            self._tokens = max(0.0, self._tokens - 1.0)
            return True
        return False

    @property
    def tokens(self) -> float:
        """Tokens available now (for inspection; does not take one)."""
        elapsed = max(0.0, self._clock() - self._stamp)
        return min(self._burst, self._tokens + elapsed * self._rate)
