"""A caller's place at the slot gate, waited on in either flavour: the paired primitive under the
one call source (`app._async.call` and its generated blocking twin).

Both share one `domain.gate.SlotGate`, its queue and its rules, so a container's sync and async
clients never run two requests on one slot at once. Both wait the same way, on the clock they
are given (`ports.clock`): `clock.sleep(left, signal)`, where the signal (`_Moved`) fires when
the call's `CancelToken` is cancelled or the gate signals a change of the ticket's slot
(`SlotGate.watch`, which also fires at once for a change since the last `poll`, so a release
between the look and the sleep is never lost). After each sleep the waiter looks again. So:

- On the system clocks a release or a cancel wakes the waiter at once; `SlotQueue` blocks its
  thread, `AsyncSlotQueue` only its task (cancelling the task ends the wait).
- On a fake clock the wait is decided without real time passing: a change that came before
  the sleep is seen at once; otherwise the clock jumps to the deadline and the wait times out.

`wait(ticket, cancel, deadline)` (a time on the queue's clock) returns 0 once the ticket holds
its slot, the new `ahead` when it moved up, or `TIMED_OUT` when the deadline passed without
either (a handover at the deadline itself is taken: the gate is asked once more after it); it
raises the token's error if the call is cancelled first. The caller `leave`s on every way out,
which is what keeps a waiter or a slot from being leaked.
"""

from __future__ import annotations

from collections.abc import Callable

from domain.cancel import CancelToken
from domain.gate import SlotGate, Ticket
from ports.clock import AsyncClock, Clock
from ports.transport import TIMED_OUT, TimedOut

__all__ = ["AsyncSlotQueue", "SlotQueue"]


class _Moved:
    """The `CancelSignal` one wait sleeps on: the call's token, or a change of the ticket's slot."""

    __slots__ = ("_cancel", "_gate", "_ticket")

    def __init__(self, gate: SlotGate, ticket: Ticket, cancel: CancelToken) -> None:
        self._gate, self._ticket, self._cancel = gate, ticket, cancel

    def on_cancel(self, wake: Callable[[], None]) -> Callable[[], None]:
        unlink = self._cancel.on_cancel(wake)
        self._gate.watch(self._ticket, wake)

        def forget() -> None:
            self._gate.watch(self._ticket, None)
            unlink()

        return forget


class _Places:
    __slots__ = ("gate",)

    def __init__(self, gate: SlotGate) -> None:
        self.gate = gate

    def busy(self, slot: int) -> bool:
        """Whether `slot` is held or waited for at the gate now (a look, not a place)."""
        return self.gate.held(slot) or self.gate.waiting(slot) > 0

    def enter(self, slot: int) -> Ticket:
        return self.gate.enter(slot)

    def leave(self, ticket: Ticket) -> None:
        self.gate.leave(ticket)

    def _look(self, ticket: Ticket, cancel: CancelToken) -> int | None:
        cancel.raise_if_cancelled()
        return self.gate.poll(ticket)


class SlotQueue(_Places):
    __slots__ = ("clock",)

    def __init__(self, gate: SlotGate, clock: Clock) -> None:
        super().__init__(gate)
        self.clock = clock

    def wait(self, ticket: Ticket, cancel: CancelToken, deadline: float) -> int | TimedOut:
        clock, moved, late = self.clock, _Moved(self.gate, ticket, cancel), False
        while (ahead := self._look(ticket, cancel)) is None:
            if late:
                return TIMED_OUT
            clock.sleep(max(deadline - clock.now(), 0.0), moved)
            late = clock.now() >= deadline
        return ahead


class AsyncSlotQueue(_Places):
    __slots__ = ("clock",)

    def __init__(self, gate: SlotGate, clock: AsyncClock) -> None:
        super().__init__(gate)
        self.clock = clock

    async def wait(self, ticket: Ticket, cancel: CancelToken, deadline: float) -> int | TimedOut:
        clock, moved, late = self.clock, _Moved(self.gate, ticket, cancel), False
        while (ahead := self._look(ticket, cancel)) is None:
            if late:
                return TIMED_OUT
            await clock.sleep(max(deadline - clock.now(), 0.0), moved)
            late = clock.now() >= deadline
        return ahead
