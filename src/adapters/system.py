"""The real clock: `time.monotonic`, `time.sleep` and `asyncio.sleep` behind the `AsyncClock` port."""

from __future__ import annotations

import asyncio
import threading
import time


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep for a negative time ({seconds} s)")
        if wake is not None:
            wake.wait(seconds)
        elif seconds:
            time.sleep(seconds)

    async def sleep_async(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep for a negative time ({seconds} s)")
        await asyncio.sleep(seconds)
