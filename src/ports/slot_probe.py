"""The state of one server slot, asked on a connection of its own."""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

from ports.transport import CancelSignal


class SlotState(enum.Enum):
    BUSY = "busy"  # the slot is processing another request: ours is queued behind it
    IDLE = "idle"  # the slot is free: our request should be running
    UNAVAILABLE = "unavailable"  # no answer we can trust: refused, 503 (loading), a cut, malformed
    UNRESPONSIVE = "unresponsive"  # connected, but answered nothing in time: paused or stuck
    # A llama-server router's answers for the model a request names:
    LOADING = "loading"  # the server is loading the model (a router's child starting, or 503)
    ASLEEP = "asleep"  # the model sleeps (`--sleep-idle-seconds`); a request wakes it
    BEHIND = "behind"  # not loaded: the router holds the request behind another model's work


@runtime_checkable
class SlotProbe(Protocol):
    """`state(slot)` answers within its own short timeout and never raises for a server fault.
    A server that took the connection and sent no whole answer within that timeout (no head, or
    a body that stopped: paused with SIGSTOP, stuck in a decode) is `SlotState.UNRESPONSIVE`;
    a server that says the model is loading (503, a router's child starting) is `LOADING`, and a
    router that has not loaded it `BEHIND` (or `ASLEEP`, from its `/models`); every other failure
    to learn the state (refused, a cut, a malformed or missing slot entry) is
    `SlotState.UNAVAILABLE`. It never makes a router load a model. It raises only for a
    programming error (a negative slot id). A `cancel` signal, when given, aborts the probe's
    connection when the call is cancelled (the answer is then `UNAVAILABLE`, and the caller sees
    the cancellation)."""

    def state(self, slot: int, cancel: CancelSignal | None = None) -> SlotState: ...


@runtime_checkable
class AsyncSlotProbe(Protocol):
    """`SlotProbe` for asyncio: the same signature and answers, awaited; cancelling the awaiting
    task closes the probe's connection and raises `asyncio.CancelledError`."""

    async def state(self, slot: int, cancel: CancelSignal | None = None) -> SlotState: ...
