"""The real clocks: `time.monotonic` with a blocking or an asyncio sleep, behind the `Clock` and
`AsyncClock` ports (the same signatures; see `ports.clock`)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from domain.cancel import SignalSafeEvent
from ports.transport import CancelSignal

__all__ = ["AsyncSystemClock", "SystemClock", "sleep_unless_cancelled"]


def _check(seconds: float) -> None:
    if seconds < 0:
        raise ValueError(f"cannot sleep for a negative time ({seconds} s)")


def sleep_unless_cancelled(seconds: float, cancel: CancelSignal | None) -> bool:
    """Block for `seconds`, or until `cancel` fires (from any thread, or a signal handler that
    interrupted this very wait); whether it fired."""
    if cancel is None:
        if seconds:
            time.sleep(seconds)
        return False
    woken = SignalSafeEvent()
    unlink = cancel.on_cancel(woken.set)
    try:
        return woken.wait(seconds)
    finally:
        unlink()


class SystemClock:
    # `time.monotonic` itself, not a method calling it: the hot loops read the clock twice a
    # chunk, and a Python frame costs more than the reading.
    now = staticmethod(time.monotonic)

    def sleep(self, seconds: float, cancel: CancelSignal | None = None) -> None:
        _check(seconds)
        sleep_unless_cancelled(seconds, cancel)


class AsyncSystemClock:
    now = staticmethod(time.monotonic)  # (as `SystemClock.now`)

    async def sleep(self, seconds: float, cancel: CancelSignal | None = None) -> None:
        _check(seconds)
        if cancel is None:
            await asyncio.sleep(seconds)
            return
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody sleeps any more
                loop.call_soon_threadsafe(woken.set)

        unlink = cancel.on_cancel(wake)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await woken.wait()
        finally:
            unlink()
