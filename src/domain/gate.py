"""The slot gate: one request in flight per slot, the others waiting in order, a bounded queue.

A value safe to share between threads: it never blocks a caller and reads no clock. Waiting is
the caller's (`app.slot_queue`): it sleeps on its clock until the gate wakes it, then asks where
it is.

Invariants (all under one lock; slots are independent):
- A slot has at most one holder. A release hands the slot straight to the head of its queue, so
  a newcomer never overtakes a waiter (strict FIFO) and a queue is never non-empty while its
  slot is free.
- At most `queue_per_slot` callers wait per slot; one more gets `Busy` at once, and
  `queue_per_slot = 0` means a busy slot refuses every other caller.
- `ahead` counts every request before this one, the one in flight included, so a queued caller
  always sees `ahead >= 1` on entering. `poll` reports a smaller value once, when the waiter
  looks: a place it slept through (its callback was slow, the thread was not scheduled) is not
  replayed, and getting the slot is reported as 0 (the caller's next step, not a `Queued`).
- No waiter and no slot is ever leaked: every ticket `enter` gives out is given back with
  `leave` on every way out (an event callback that raises, a cancel, a timeout, the holder's
  own end), and `leave` is idempotent: it releases the slot if the ticket was handed it
  meanwhile, else takes the ticket out of the queue.
- A waiter is woken, never blocked, here: `watch(ticket, wake)` makes every change of its slot
  (a release, a waiter leaving) call `wake()` under the lock, and calls it at once if the
  ticket already moved since it last asked; the waiter then asks `poll(ticket)`. So a change
  between a `poll` and the `watch` that follows it is never lost. `wake` must only signal (set
  an event, `loop.call_soon_threadsafe`), never block or call back into the gate; what it
  raises is ignored. Threads and asyncio tasks share one queue and one order this way, so they
  never hold one slot at once.

No thread is started here; callers bring their own.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable

from domain.errors import Busy

Wake = Callable[[], None]


class _Slot:
    __slots__ = ("holder", "waiters")

    def __init__(self) -> None:
        self.holder: Ticket | None = None
        self.waiters: deque[Ticket] = deque()

    def moved(self, ticket: Ticket) -> int | None:
        """The ticket's new place if it got the slot (0) or moved up, else None."""
        if self.holder is ticket:
            return 0
        if ticket not in self.waiters:
            return None  # it left: nothing more to say
        ahead = self.waiters.index(ticket) + 1
        return ahead if ahead < ticket.ahead else None

    def release(self) -> None:
        self.holder = self.waiters.popleft() if self.waiters else None
        self.changed()

    def changed(self) -> None:
        holder = self.holder
        if holder is not None and holder.wake is not None:
            _signal(holder.wake)
        for ticket in self.waiters:
            if ticket.wake is not None:
                _signal(ticket.wake)


def _signal(wake: Wake) -> None:
    with contextlib.suppress(Exception):
        wake()


class SlotGate:
    """Safe to share between threads: `enter`, then `poll` and `watch` while queued, `leave`."""

    def __init__(self, queue_per_slot: int) -> None:
        if (
            isinstance(queue_per_slot, bool)
            or not isinstance(queue_per_slot, int)
            or queue_per_slot < 0
        ):
            raise ValueError(
                f"queue_per_slot must be a non-negative integer, not {queue_per_slot!r}"
            )
        self._queue_per_slot = queue_per_slot
        # Plain: held only around a step on the tables and the wakes' signals, and nothing that
        # runs in a signal handler (a cancel's wake-up) takes it.
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}

    def waiting(self, slot: int) -> int:
        """How many callers wait for `slot` now (for tests and status)."""
        with self._lock:
            state = self._slots.get(slot)
            return len(state.waiters) if state else 0

    def held(self, slot: int) -> bool:
        with self._lock:
            state = self._slots.get(slot)
            return state is not None and state.holder is not None

    def enter(self, slot: int) -> Ticket:
        """Take a place for `slot`: held at once (`ahead == 0`) or queued; `Busy` if full. Every
        ticket must be given back with `leave`, whatever happens."""
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"slot must be a non-negative integer, not {slot!r}")
        with self._lock:
            state = self._slots.get(slot)
            if state is None:
                state = self._slots[slot] = _Slot()
            ticket = Ticket(state)
            if state.holder is None:
                state.holder = ticket
            elif len(state.waiters) >= self._queue_per_slot:
                raise Busy(slot, len(state.waiters))
            else:
                state.waiters.append(ticket)
                ticket.ahead = len(state.waiters)
        return ticket

    def poll(self, ticket: Ticket) -> int | None:
        """Without blocking: 0 if the ticket now holds its slot, its new `ahead` if it moved up
        the queue, None if nothing changed for it since it last asked."""
        with self._lock:
            ahead = ticket.state.moved(ticket)
            if ahead is not None:
                ticket.ahead = ahead
            return ahead

    def watch(self, ticket: Ticket, wake: Wake | None) -> None:
        """Call `wake()` (under the gate's lock) on every change of the ticket's slot until the
        ticket leaves or `watch(ticket, None)`, and at once if the ticket has moved since it last
        asked (`poll`); see the module for what `wake` may do."""
        with self._lock:
            ticket.wake = wake
            if wake is not None and ticket.state.moved(ticket) is not None:
                _signal(wake)

    def leave(self, ticket: Ticket) -> None:
        """Give the place back: release the slot if held (handing it to the next waiter), else
        leave the queue. Idempotent."""
        state = ticket.state
        with self._lock:
            ticket.wake = None
            if state.holder is ticket:
                state.release()
            elif ticket in state.waiters:
                state.waiters.remove(ticket)
                state.changed()


class Ticket:
    """A caller's place at the gate: `ahead` is how many requests are before it (0: it holds
    the slot)."""

    __slots__ = ("ahead", "state", "wake")

    def __init__(self, state: _Slot) -> None:
        self.state = state
        self.ahead = 0
        self.wake: Wake | None = None
