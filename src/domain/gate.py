"""The slot gate: one request in flight per slot, the others waiting in order, a bounded queue.

Invariants (all under one lock; slots are independent):
- A slot has at most one holder. A release hands the slot straight to the head of its queue, so
  a newcomer never overtakes a waiter (strict FIFO) and a queue is never non-empty while its
  slot is free.
- At most `queue_per_slot` callers wait per slot; one more gets `Busy` at once, and
  `queue_per_slot = 0` means a busy slot refuses every other caller.
- `ahead` counts every request before this one, the one in flight included, so a queued caller
  always sees `ahead >= 1`. It is emitted on entering the queue and each time the waiter wakes to
  a smaller value. It says where the waiter is when it looks: a place it slept through (its
  callback was slow, the thread was not scheduled) is not replayed, and getting the slot is not
  announced (the caller's next step is).
- Event callbacks (`on_event`) run outside the lock. If one raises while its caller waits (or
  the wait is interrupted), the waiter leaves the queue, or releases the slot if it was handed
  over meanwhile, and the exception propagates: no waiter and no slot is ever leaked.
- The holder releases on every way out of the `with` block.
- A waiter that cannot block a thread (an asyncio task) is woken instead: `watch(ticket, wake)`
  makes every change of its slot (a release, a waiter leaving) call `wake()` under the lock, and
  the waiter then asks `poll(ticket)`. `wake` must only signal (`loop.call_soon_threadsafe`),
  never block or call back into the gate; what it raises is ignored. Clearing its own signal
  before each `poll` is what keeps a wake-up from being lost. Such waiters share one queue and
  one order with the blocking ones, so threads and tasks never hold one slot at once.

No thread is started here; callers bring their own.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from domain.cancel import CancelToken
from domain.errors import Busy
from domain.events import ChatEvent, Queued

# How often a blocking wait at the gate looks at its token again: the bound on a cancel whose
# wake-up a signal handler lost (see `wait`).
_CANCEL_LOOK_S = 0.05


class _Slot:
    __slots__ = ("cond", "holder", "waiters")

    def __init__(self, lock: threading.RLock) -> None:
        self.cond = threading.Condition(lock)
        self.holder: Ticket | None = None
        self.waiters: deque[Ticket] = deque()

    def ahead_of(self, ticket: Ticket) -> int:
        return self.waiters.index(ticket) + 1

    def moved(self, ticket: Ticket) -> int | None:
        """The ticket's new place if it got the slot (0) or moved up, else None."""
        if self.holder is ticket:
            return 0
        ahead = self.ahead_of(ticket)
        return ahead if ahead < ticket.ahead else None

    def release(self) -> None:
        self.holder = self.waiters.popleft() if self.waiters else None
        self.changed()

    def changed(self) -> None:
        self.cond.notify_all()
        holder = self.holder
        if holder is not None and holder.wake is not None:
            _signal(holder.wake)
        for ticket in self.waiters:
            if ticket.wake is not None:
                _signal(ticket.wake)


def _signal(wake: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):
        wake()


class SlotGate:
    """Safe to share between threads. `hold(slot, on_event)` is a context manager."""

    def __init__(self, queue_per_slot: int) -> None:
        if isinstance(queue_per_slot, bool) or not isinstance(queue_per_slot, int) or queue_per_slot < 0:
            raise ValueError(f"queue_per_slot must be a non-negative integer, not {queue_per_slot!r}")
        self._queue_per_slot = queue_per_slot
        # Re-entrant: a cancel's wake-up (`_wake`) may run in a signal handler that interrupted
        # this thread while it held the lock.
        self._lock = threading.RLock()
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

    @contextmanager
    def hold(
        self, slot: int, on_event: Callable[[ChatEvent], None], cancel: CancelToken | None = None
    ) -> Iterator[None]:
        """Hold `slot` for the `with` block; `Busy` at once if its queue is full; the token's
        error (`Cancelled`) if it is cancelled while queued."""
        ticket = self.enter(slot)
        try:
            ahead: int | None = ticket.ahead
            while ahead:
                on_event(Queued(ahead))
                ahead = self.wait(ticket, cancel)
            yield
        finally:
            self.leave(ticket)

    def enter(self, slot: int) -> Ticket:
        """Take a place for `slot`: held at once (`ahead == 0`) or queued; `Busy` if full. Every
        ticket must be given back with `leave`, whatever happens."""
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"slot must be a non-negative integer, not {slot!r}")
        with self._lock:
            state = self._slots.get(slot)
            if state is None:
                state = self._slots[slot] = _Slot(self._lock)
            ticket = Ticket(state)
            if state.holder is None:
                state.holder = ticket
            elif len(state.waiters) >= self._queue_per_slot:
                raise Busy(slot, len(state.waiters))
            else:
                state.waiters.append(ticket)
                ticket.ahead = len(state.waiters)
        return ticket

    def wait(self, ticket: Ticket, cancel: CancelToken | None = None, timeout: float | None = None) -> int | None:
        """Block until the ticket holds its slot (0) or moved up the queue (the new `ahead`); with
        a `timeout`, for one wait of at most that many seconds, then None if it has not moved
        (maybe sooner: a wake-up for another waiter): the caller keeps its deadline on its own
        clock and asks again, so the gate reads no clock. Raises the token's error if it is
        cancelled first (the caller then `leave`s)."""
        state = ticket.state
        forget = cancel.on_cancel(lambda: self._wake(state)) if cancel is not None else None
        try:
            with self._lock:
                while (ahead := state.moved(ticket)) is None:
                    if cancel is not None and cancel.cancelled:
                        raise cancel.error()
                    if timeout is not None and timeout <= 0:
                        return None
                    step = timeout
                    if cancel is not None:
                        # A cancel from a signal handler that lands between the look above and the
                        # wait below wakes nobody (the lock is re-entrant): look again this often.
                        step = _CANCEL_LOOK_S if step is None else min(step, _CANCEL_LOOK_S)
                    state.cond.wait(step)
                    if timeout is not None:  # one wait at most: the caller's clock says how long
                        timeout = 0.0
                ticket.ahead = ahead
                return ahead
        finally:
            if forget is not None:
                forget()

    def poll(self, ticket: Ticket) -> int | None:
        """Without blocking: 0 if the ticket now holds its slot, its new `ahead` if it moved up
        the queue, None if nothing changed for it (see `watch`)."""
        with self._lock:
            ahead = ticket.state.moved(ticket)
            if ahead is not None:
                ticket.ahead = ahead
            return ahead

    def watch(self, ticket: Ticket, wake: Callable[[], None] | None) -> None:
        """Call `wake()` (under the gate's lock) on every change of the ticket's slot until the
        ticket leaves or `watch(ticket, None)`; see the module for what `wake` may do."""
        with self._lock:
            ticket.wake = wake

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

    def _wake(self, state: _Slot) -> None:
        with self._lock:
            state.cond.notify_all()


class Ticket:
    """A caller's place at the gate: `ahead` is how many requests are before it (0: it holds
    the slot)."""

    __slots__ = ("ahead", "state", "wake")

    def __init__(self, state: _Slot) -> None:
        self.state = state
        self.ahead = 0
        self.wake: Callable[[], None] | None = None
