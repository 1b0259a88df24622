"""The slot gate for asyncio: the same `SlotGate`, its queue and its rules, waited on without
blocking the event loop and without a thread.

A queued task does not block in the gate: it asks the gate to wake it (`SlotGate.watch`: a
wake-up called under the gate's lock on every change of the slot, here
`loop.call_soon_threadsafe(event.set)`), clears its event, asks where it is (`SlotGate.poll`)
and only then awaits the event, so a release between the two is never lost. Tasks and threads
take their places in one queue: a container's sync and async clients never run two requests on
one slot at once.

Cancelling the waiting task leaves the queue (or gives the slot back if it was handed over
meanwhile): the caller's `finally` calls `leave`, as with the blocking gate.
"""

from __future__ import annotations

import asyncio
import contextlib

from domain.gate import SlotGate, Ticket

__all__ = ["AsyncSlotGate"]


class AsyncSlotGate:
    """`enter` (at once: held, queued or `Busy`), `await wait(ticket)` while `ticket.ahead`,
    `leave` on every way out. Shares `gate` with whoever else holds it."""

    __slots__ = ("gate",)

    def __init__(self, gate: SlotGate) -> None:
        self.gate = gate

    def enter(self, slot: int) -> Ticket:
        return self.gate.enter(slot)

    async def wait(self, ticket: Ticket) -> int:
        """Until the ticket holds its slot (0) or moved up the queue (the new `ahead`)."""
        gate = self.gate
        loop = asyncio.get_running_loop()
        moved = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(moved.set)

        gate.watch(ticket, wake)
        try:
            while True:
                moved.clear()
                ahead = gate.poll(ticket)
                if ahead is not None:
                    return ahead
                await moved.wait()
        finally:
            gate.watch(ticket, None)

    def leave(self, ticket: Ticket) -> None:
        self.gate.leave(ticket)
