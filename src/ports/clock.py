"""Time as a port: policy code never reads the system clock itself."""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A monotonic clock in seconds.

    `now()` never goes backwards. `sleep(seconds, wake)` returns after at least `seconds` have
    passed on this clock (a fake clock advances itself instantly), or as soon as the event `wake`
    is set (at once if it already is); `sleep(0)` returns at once and a negative duration raises
    `ValueError`.
    """

    def now(self) -> float: ...

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None: ...


@runtime_checkable
class AsyncClock(Clock, Protocol):
    """A `Clock` an asyncio caller can wait on: `await sleep_async(seconds)` returns after at
    least `seconds` on this clock (a fake clock advances itself at once) without blocking the
    event loop; cancelling the awaiting task ends it. A negative duration raises `ValueError`."""

    async def sleep_async(self, seconds: float) -> None: ...
