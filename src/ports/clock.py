"""Time as a port: policy code never reads the system clock itself."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ports.transport import CancelSignal


@runtime_checkable
class Clock(Protocol):
    """A monotonic clock in seconds.

    `now()` never goes backwards. `sleep(seconds, cancel)` returns after at least `seconds` have
    passed on this clock (a fake clock advances itself instantly), or as soon as `cancel` fires
    (at once if it already has); `sleep(0)` returns at once and a negative duration raises
    `ValueError`.
    """

    def now(self) -> float: ...

    def sleep(self, seconds: float, cancel: CancelSignal | None = None) -> None: ...


@runtime_checkable
class AsyncClock(Protocol):
    """`Clock` for asyncio, with the same signature awaited: `await sleep(seconds, cancel)` does
    not block the event loop; cancelling the awaiting task ends it (`asyncio.CancelledError`),
    and so does `cancel` firing."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float, cancel: CancelSignal | None = None) -> None: ...
