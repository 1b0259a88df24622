"""A caller's place at the slot gate, waited on in either flavour: the paired primitive under the
one call source (`app._async.call` and its generated blocking twin).

Both share one `domain.gate.SlotGate`, its queue and its rules, so a container's sync and async
clients never run two requests on one slot at once; they differ only in how they wait:

- `SlotQueue.wait` blocks the thread on the gate's condition; the call's `CancelToken` wakes it.
- `AsyncSlotQueue.wait` does not block the loop and starts no thread: it asks the gate to wake it
  (`SlotGate.watch`: `loop.call_soon_threadsafe(event.set)` under the gate's lock on every change
  of the slot), clears its event, asks where it is (`SlotGate.poll`) and only then awaits the
  event, so a release between the two is never lost. Cancelling the task ends the wait.

`deadline(seconds)` is a time on the queue's own clock; `wait(ticket, cancel, deadline)` returns
0 once the ticket holds its slot, the new `ahead` when it moved up, or `TIMED_OUT` when the
deadline passed without either; the caller `leave`s on every way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from domain.cancel import CancelToken
from domain.gate import SlotGate, Ticket
from ports.transport import TIMED_OUT, TimedOut

__all__ = ["AsyncSlotQueue", "SlotQueue"]


class SlotQueue:
    __slots__ = ("gate",)

    def __init__(self, gate: SlotGate) -> None:
        self.gate = gate

    def busy(self, slot: int) -> bool:
        """Whether `slot` is held or waited for at the gate now (a look, not a place)."""
        return self.gate.held(slot) or self.gate.waiting(slot) > 0

    def enter(self, slot: int) -> Ticket:
        return self.gate.enter(slot)

    def deadline(self, seconds: float) -> float:
        return time.monotonic() + seconds

    def wait(self, ticket: Ticket, cancel: CancelToken, deadline: float) -> int | TimedOut:
        while True:
            ahead = self.gate.wait(ticket, cancel, max(deadline - time.monotonic(), 0.0))
            if ahead is not None:
                return ahead
            if time.monotonic() >= deadline:
                return TIMED_OUT

    def leave(self, ticket: Ticket) -> None:
        self.gate.leave(ticket)


class AsyncSlotQueue:
    __slots__ = ("gate",)

    def __init__(self, gate: SlotGate) -> None:
        self.gate = gate

    def busy(self, slot: int) -> bool:
        """Whether `slot` is held or waited for at the gate now (a look, not a place)."""
        return self.gate.held(slot) or self.gate.waiting(slot) > 0

    def enter(self, slot: int) -> Ticket:
        return self.gate.enter(slot)

    def deadline(self, seconds: float) -> float:
        return asyncio.get_running_loop().time() + seconds

    async def wait(self, ticket: Ticket, cancel: CancelToken, deadline: float) -> int | TimedOut:
        gate = self.gate
        loop = asyncio.get_running_loop()
        moved = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(moved.set)

        gate.watch(ticket, wake)
        unlink = cancel.on_cancel(wake)
        try:
            while True:
                moved.clear()
                cancel.raise_if_cancelled()
                ahead = gate.poll(ticket)
                if ahead is not None:
                    return ahead
                try:
                    async with asyncio.timeout_at(deadline):
                        await moved.wait()
                except TimeoutError:
                    ahead = gate.poll(ticket)
                    return TIMED_OUT if ahead is None else ahead
        finally:
            unlink()
            gate.watch(ticket, None)

    def leave(self, ticket: Ticket) -> None:
        self.gate.leave(ticket)
