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
- Callbacks run outside the lock. If one raises while its caller waits (or the wait is
  interrupted), the waiter leaves the queue, or releases the slot if it was handed over
  meanwhile, and the exception propagates: no waiter and no slot is ever leaked.
- The holder releases on every way out of the `with` block.

No thread is started here; callers bring their own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from domain.cancel import CancelToken
from domain.errors import Busy
from domain.events import ChatEvent, Queued


class _Slot:
    __slots__ = ("cond", "holder", "waiters")

    def __init__(self, lock: threading.Lock) -> None:
        self.cond = threading.Condition(lock)
        self.holder: object | None = None
        self.waiters: deque[object] = deque()

    def ahead_of(self, ticket: object) -> int:
        return self.waiters.index(ticket) + 1

    def release(self) -> None:
        self.holder = self.waiters.popleft() if self.waiters else None
        self.cond.notify_all()


class SlotGate:
    """Safe to share between threads. `hold(slot, on_event)` is a context manager."""

    def __init__(self, queue_per_slot: int) -> None:
        if isinstance(queue_per_slot, bool) or not isinstance(queue_per_slot, int) or queue_per_slot < 0:
            raise ValueError(f"queue_per_slot must be a non-negative integer, not {queue_per_slot!r}")
        self._queue_per_slot = queue_per_slot
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

    @contextmanager
    def hold(
        self, slot: int, on_event: Callable[[ChatEvent], None], cancel: CancelToken | None = None
    ) -> Iterator[None]:
        """Hold `slot` for the `with` block; `Busy` at once if its queue is full; the token's
        error (`Cancelled`) if it is cancelled while queued."""
        ticket = self.enter(slot)
        try:
            ahead = ticket.ahead
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

    def wait(self, ticket: Ticket, cancel: CancelToken | None = None) -> int:
        """Block until the ticket holds its slot (0) or moved up the queue (the new `ahead`);
        raises the token's error if it is cancelled first (the caller then `leave`s)."""
        state = ticket.state
        forget = cancel.on_cancel(lambda: self._wake(state)) if cancel is not None else None
        try:
            with self._lock:
                while state.holder is not ticket and state.ahead_of(ticket) >= ticket.ahead:
                    if cancel is not None and cancel.cancelled:
                        raise cancel.error()
                    state.cond.wait()
                ticket.ahead = 0 if state.holder is ticket else state.ahead_of(ticket)
                return ticket.ahead
        finally:
            if forget is not None:
                forget()

    def leave(self, ticket: Ticket) -> None:
        """Give the place back: release the slot if held (handing it to the next waiter), else
        leave the queue. Idempotent."""
        state = ticket.state
        with self._lock:
            if state.holder is ticket:
                state.release()
            elif ticket in state.waiters:
                state.waiters.remove(ticket)
                state.cond.notify_all()

    def _wake(self, state: _Slot) -> None:
        with self._lock:
            state.cond.notify_all()


class Ticket:
    """A caller's place at the gate: `ahead` is how many requests are before it (0: it holds
    the slot)."""

    __slots__ = ("ahead", "state")

    def __init__(self, state: _Slot) -> None:
        self.state = state
        self.ahead = 0
