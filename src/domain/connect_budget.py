"""The proxy's accept limit, kept on the client's side: every connect of a container's clients
(both flavours; chats, probes, predictions, stops, re-attaches, info calls) takes its turn here,
so that inferproxy's token bucket (burst 10, 2 a second by default) never refuses one of ours.

A connect that would exceed the budget waits locally for its turn instead of being refused
there and retried seconds later. Turns are handed out in the order they are asked for (a
reservation each: the budget is the generic cell rate algorithm, a token bucket that gives each
caller the time its token will be there), so no caller starves, and callers in several threads
and event loops share it safely.

The client's budget sits a little inside the proxy's own (`of_proxy`): one token less and 5 %
slower. Two buckets that start at different moments and read different clocks drift apart; a
budget equal to the proxy's met a refusal now and then where this one met none.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["ConnectBudget"]

# How far inside the proxy's limits the client's budget stays (see the module docstring).
_RATE_MARGIN = 0.95
_BURST_MARGIN = 1


@dataclass(frozen=True, slots=True)
class _Limits:
    burst: int
    rate: float


class ConnectBudget:
    """At most `burst` connects at once, then `rate` a second. `reserve(now, latest)` books the
    next turn and says when it is (`now` if it is free), or books nothing and answers None when
    that turn would come after `latest`. Times are seconds on the caller's clock, which must be
    the same monotonic clock for every caller (the system's)."""

    __slots__ = ("_interval", "_lock", "_next", "_tolerance", "limits")

    def __init__(self, burst: int, rate: float) -> None:
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be a positive integer, not {burst!r}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise ValueError(f"rate must be a number above 0, not {rate!r}")
        self.limits = _Limits(burst, float(rate))
        self._interval = 1.0 / rate
        self._tolerance = (burst - 1) * self._interval
        self._next: float | None = None  # when the bucket is next empty of every booked token
        self._lock = threading.Lock()

    @classmethod
    def of_proxy(cls, burst: int, rate: float) -> ConnectBudget:
        """The client's budget for a proxy started with `--burst burst --rate rate`: a little
        inside it."""
        return cls(max(1, burst - _BURST_MARGIN), rate * _RATE_MARGIN)

    def __repr__(self) -> str:
        return f"ConnectBudget(burst={self.limits.burst}, rate={self.limits.rate:g}/s)"

    def emptied(self, now: float) -> None:
        """The proxy refused a connect at `now`: its bucket is empty (another process sharing it
        spent it), so every turn from now on comes at the proxy's rate, none from a burst."""
        with self._lock:
            empty = now + self._interval + self._tolerance  # the next turn: one interval on
            self._next = empty if self._next is None else max(self._next, empty)

    def reserve(self, now: float, latest: float) -> float | None:
        """Book a turn to connect: the time it comes (at least `now`), or None, booking nothing,
        if it would come after `latest`."""
        with self._lock:
            due = now if self._next is None else max(self._next, now)
            turn = max(due - self._tolerance, now)
            if turn > latest:
                return None
            self._next = due + self._interval
            return turn
