"""The slot gate: one request per slot, FIFO, bounded queue, released on every outcome.

Callers are threads that wait through `SlotQueue` on the system clock, as the client's call does
(`hold` below takes the slot as `app._async.call` does: a `Queued` each time it moves up).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import pytest

from adapters.system import SystemClock
from app.slot_queue import SlotQueue
from domain.cancel import CancelToken
from domain.errors import Busy, Cancelled
from domain.events import ChatEvent, Queued
from domain.gate import SlotGate
from ports.transport import TimedOut

JOIN_S = 5.0


@contextmanager
def hold(
    gate: SlotGate,
    slot: int,
    on_event: Callable[[ChatEvent], None],
    cancel: CancelToken | None = None,
) -> Iterator[None]:
    """Hold `slot` for the `with` block, a `Queued` on entering the queue and each time the
    waiter moves up; `Busy` at once if the queue is full; the ticket given back on every way out."""
    queue = SlotQueue(gate, SystemClock())
    ticket = queue.enter(slot)
    try:
        ahead = ticket.ahead
        deadline = queue.clock.now() + 60.0
        while ahead:
            on_event(Queued(ahead))
            moved = queue.wait(ticket, cancel or CancelToken(), deadline)
            assert not isinstance(moved, TimedOut)
            ahead = moved
        yield
    finally:
        queue.leave(ticket)


def until(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    """Spin (with tiny sleeps) until `predicate` holds; fail the test otherwise."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.0005)


class Caller:
    """A thread that holds a slot until told to let go, recording its events."""

    def __init__(self, gate: SlotGate, slot: int, name: str, on_event: Callable[[ChatEvent], None] | None = None):
        self.gate, self.slot, self.name = gate, slot, name
        self.events: list[ChatEvent] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None
        self._on_event = on_event
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _event(self, event: ChatEvent) -> None:
        self.events.append(event)
        if self._on_event is not None:
            self._on_event(event)

    def _run(self) -> None:
        try:
            with hold(self.gate, self.slot, self._event):
                self.entered.set()
                assert self.release.wait(JOIN_S)
        except BaseException as exc:
            self.error = exc

    def start(self) -> Caller:
        self.thread.start()
        return self

    def finish(self) -> None:
        self.release.set()
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive()


@contextmanager
def callers() -> Iterator[list[Caller]]:
    started: list[Caller] = []
    try:
        yield started
    finally:
        for c in started:
            c.finish()


def holding(gate: SlotGate, running: list[Caller]) -> Caller:
    """A caller that takes slot 0 and keeps it until finished; returned once it holds the slot."""
    holder = Caller(gate, 0, "holder").start()
    running.append(holder)
    assert holder.entered.wait(JOIN_S)
    return holder


def test_free_slot_is_held_at_once_without_events() -> None:
    gate = SlotGate(8)
    events: list[ChatEvent] = []
    with hold(gate, 0, events.append):
        assert gate.held(0)
    assert events == []
    assert not gate.held(0)


def test_slot_is_released_when_the_block_raises() -> None:
    gate = SlotGate(8)
    with pytest.raises(RuntimeError), hold(gate, 0, lambda e: None):
        raise RuntimeError("the request failed")
    assert not gate.held(0)
    with hold(gate, 0, lambda e: None):
        pass


def test_zero_queue_refuses_any_second_caller_at_once() -> None:
    gate = SlotGate(0)
    with (
        hold(gate, 0, lambda e: None),
        pytest.raises(Busy, match="slot 0 is busy: 0 requests already queued"),
        hold(gate, 0, lambda e: None),
    ):
        pass


def test_full_queue_refuses_at_once_and_one_less_queues() -> None:
    gate = SlotGate(2)
    with callers() as running:
        running.append(Caller(gate, 0, "holder").start())
        assert running[0].entered.wait(JOIN_S)
        running.append(Caller(gate, 0, "q1").start())
        until(lambda: gate.waiting(0) == 1)
        running.append(Caller(gate, 0, "q2").start())  # one under the limit: queues
        until(lambda: gate.waiting(0) == 2)
        with pytest.raises(Busy) as info, hold(gate, 0, lambda e: None):
            pass
        assert (info.value.slot, info.value.queued) == (0, 2)
    assert all(c.error is None for c in running)


def test_waiters_get_queued_on_entry_and_as_ahead_shrinks_in_fifo_order() -> None:
    gate = SlotGate(8)
    order: list[str] = []
    with callers() as running:
        holder = holding(gate, running)
        waiters: list[Caller] = []
        for i in range(3):
            c = Caller(gate, 0, f"w{i}").start()
            running.append(c)
            waiters.append(c)
            until(partial(lambda c, n: gate.waiting(0) == n and len(c.events) == 1, c, i + 1))
        assert [c.events for c in waiters] == [[Queued(1)], [Queued(2)], [Queued(3)]]
        holder.finish()
        for k, c in enumerate(waiters):
            assert c.entered.wait(JOIN_S)
            order.append(c.name)
            assert gate.held(0)
            # Let everyone behind see its new place before the slot moves on.
            behind = waiters[k + 1 :]
            until(partial(lambda b: all(w.events[-1] == Queued(j + 1) for j, w in enumerate(b)), behind))
            c.finish()
        assert [c.events for c in waiters] == [
            [Queued(1)],
            [Queued(2), Queued(1)],
            [Queued(3), Queued(2), Queued(1)],
        ]
    assert order == ["w0", "w1", "w2"]
    assert not gate.held(0) and gate.waiting(0) == 0


def test_a_waiter_that_wakes_late_reports_only_where_it_is_now() -> None:
    # Pinned: `Queued` says where a waiter is when it looks. Places it slept through are not
    # replayed, and once the slot is its own it reports nothing more.
    gate = SlotGate(8)
    in_callback = threading.Event()
    go = threading.Event()

    def slow(event: ChatEvent) -> None:
        if event == Queued(2):
            in_callback.set()
            assert go.wait(JOIN_S)

    holder = Caller(gate, 0, "holder").start()
    assert holder.entered.wait(JOIN_S)
    first = Caller(gate, 0, "first").start()
    until(lambda: gate.waiting(0) == 1)
    late = Caller(gate, 0, "late", on_event=slow).start()
    assert in_callback.wait(JOIN_S)  # blocked in its first callback, Queued(2)
    holder.finish()
    assert first.entered.wait(JOIN_S)
    first.finish()  # `late` is handed the slot while still in its callback
    go.set()
    assert late.entered.wait(JOIN_S)
    late.finish()
    assert late.events == [Queued(2)]
    assert late.error is None


def test_slots_are_independent() -> None:
    gate = SlotGate(0)
    with callers() as running:
        running.append(Caller(gate, 0, "a").start())
        running.append(Caller(gate, 1, "b").start())
        assert running[0].entered.wait(JOIN_S) and running[1].entered.wait(JOIN_S)
        assert running[0].events == running[1].events == []


def test_callback_raising_while_queued_removes_the_waiter() -> None:
    gate = SlotGate(8)

    def refuse(event: ChatEvent) -> None:
        raise KeyboardInterrupt("caller gave up")

    with callers() as running:
        holding(gate, running)
        quitter = Caller(gate, 0, "quitter", on_event=refuse).start()
        quitter.thread.join(JOIN_S)
        assert isinstance(quitter.error, KeyboardInterrupt)
        assert gate.waiting(0) == 0
    assert not gate.held(0)


def test_waiter_behind_leaving_changes_nothing_for_those_ahead() -> None:
    gate = SlotGate(8)

    def refuse(event: ChatEvent) -> None:
        raise RuntimeError("gave up")

    with callers() as running:
        holder = holding(gate, running)
        middle = Caller(gate, 0, "middle").start()
        running.append(middle)
        until(lambda: gate.waiting(0) == 1 and len(middle.events) == 1)
        last = Caller(gate, 0, "last").start()
        running.append(last)
        until(lambda: gate.waiting(0) == 2 and len(last.events) == 1)
        quitter = Caller(gate, 0, "quitter", on_event=refuse).start()
        quitter.thread.join(JOIN_S)
        assert isinstance(quitter.error, RuntimeError)
        assert quitter.events == [Queued(3)]
        assert gate.waiting(0) == 2
        holder.finish()  # the first real change: both move up one place
        until(lambda: middle.entered.is_set() and len(last.events) == 2)
        assert (middle.events, last.events) == ([Queued(1)], [Queued(2), Queued(1)])
    assert gate.waiting(0) == 0 and not gate.held(0)


def test_waiter_ahead_leaving_is_announced_to_those_behind() -> None:
    gate = SlotGate(8)
    first_event = threading.Event()
    go = threading.Event()

    def leave_when_told(event: ChatEvent) -> None:
        first_event.set()
        if not go.wait(JOIN_S):
            raise AssertionError("not told")
        raise RuntimeError("gave up")

    with callers() as running:
        holding(gate, running)
        quitter = Caller(gate, 0, "quitter", on_event=leave_when_told).start()
        assert first_event.wait(JOIN_S)
        behind = Caller(gate, 0, "behind").start()
        running.append(behind)
        until(lambda: gate.waiting(0) == 2)
        go.set()
        quitter.thread.join(JOIN_S)
        until(lambda: len(behind.events) == 2)
        assert behind.events == [Queued(2), Queued(1)]
        assert gate.waiting(0) == 1
    assert behind.entered.is_set()


def test_slot_handed_over_while_the_callback_raises_is_released() -> None:
    gate = SlotGate(8)
    in_callback = threading.Event()
    go = threading.Event()

    def slow_then_raise(event: ChatEvent) -> None:
        in_callback.set()
        assert go.wait(JOIN_S)
        raise RuntimeError("gave up")

    holder = Caller(gate, 0, "holder").start()
    assert holder.entered.wait(JOIN_S)
    quitter = Caller(gate, 0, "quitter", on_event=slow_then_raise).start()
    assert in_callback.wait(JOIN_S)
    holder.finish()  # the slot is handed to the quitter while its callback still runs
    until(lambda: gate.waiting(0) == 0)
    assert gate.held(0)
    go.set()
    quitter.thread.join(JOIN_S)
    assert isinstance(quitter.error, RuntimeError)
    assert not gate.held(0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        SlotGate(-1)
    with pytest.raises(ValueError), hold(SlotGate(1), -1, lambda e: None):
        pass


def test_sixteen_threads_never_share_a_slot_and_never_lose_a_waiter() -> None:
    gate = SlotGate(16)
    slots = 3
    rounds = 20
    inside = [0] * slots
    peak = [0] * slots
    served = [0] * slots
    lock = threading.Lock()
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []
    busy: list[int] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            barrier.wait(JOIN_S)
            for _ in range(rounds):
                slot = rng.randrange(slots)
                events: list[ChatEvent] = []
                try:
                    with hold(gate, slot, events.append):
                        with lock:
                            inside[slot] += 1
                            peak[slot] = max(peak[slot], inside[slot])
                        # Random hold: mostly a thread switch, sometimes a short sleep.
                        time.sleep(rng.choice((0, 0, 0.0002, 0.001)))
                        with lock:
                            inside[slot] -= 1
                            served[slot] += 1
                except Busy:
                    with lock:
                        busy.append(slot)
                aheads = [e.ahead for e in events if isinstance(e, Queued)]
                assert aheads == sorted(aheads, reverse=True) and len(set(aheads)) == len(aheads)
                assert all(a >= 1 for a in aheads)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,), daemon=True) for seed in range(16)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert busy == []  # 15 others at most can wait: the queue of 16 never fills
    assert peak == [1] * slots
    assert sum(served) == 16 * rounds
    assert all(not gate.held(s) and gate.waiting(s) == 0 for s in range(slots))
    assert time.monotonic() - started < 2.0


def test_sixteen_threads_with_a_small_queue_get_busy_and_leave_nothing_behind() -> None:
    gate = SlotGate(2)
    barrier = threading.Barrier(16)
    outcomes: list[str] = []
    lock = threading.Lock()
    inside = 0
    peak = 0

    def worker(seed: int) -> None:
        nonlocal inside, peak
        rng = random.Random(seed)
        barrier.wait(JOIN_S)
        for _ in range(10):
            try:
                with hold(gate, 0, lambda e: None):
                    with lock:
                        inside += 1
                        peak = max(peak, inside)
                    time.sleep(rng.choice((0, 0.0002)))
                    with lock:
                        inside -= 1
                outcome = "served"
            except Busy:
                outcome = "busy"
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(seed,), daemon=True) for seed in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 160
    assert "served" in outcomes
    assert peak == 1
    assert not gate.held(0) and gate.waiting(0) == 0


# -- pinned details a careless change would slip past ---------------------------------------------


@pytest.mark.parametrize("queue_per_slot", [True, False, 1.0, "8", None])
def test_a_queue_size_that_is_not_an_integer_is_refused(queue_per_slot: object) -> None:
    # `True` is an int to Python; as a queue size it is a mistake, not 1.
    with pytest.raises(ValueError, match="queue_per_slot must be a non-negative integer"):
        SlotGate(queue_per_slot)  # type: ignore[arg-type]


@pytest.mark.parametrize("slot", [True, False, 0.0, 1.5, "0", None])
def test_a_slot_that_is_not_an_integer_is_refused_before_anything_is_held(slot: object) -> None:
    gate = SlotGate(1)
    events: list[ChatEvent] = []
    refused = pytest.raises(ValueError, match="slot must be a non-negative integer")
    with refused, hold(gate, slot, events.append):  # type: ignore[arg-type]
        pass
    assert events == []
    assert not gate.held(0) and not gate.held(1)


def test_a_slot_never_asked_for_is_free_with_nobody_waiting() -> None:
    gate = SlotGate(8)
    with hold(gate, 0, lambda e: None):
        assert (gate.held(3), gate.waiting(3)) == (False, 0)
    assert (gate.held(7), gate.waiting(7)) == (False, 0)


def test_a_waiter_leaving_moves_up_everyone_behind_it() -> None:
    # Two waiters behind the one that leaves: each is told its new place, not only one of them.
    gate = SlotGate(8)
    first_event = threading.Event()
    go = threading.Event()

    def leave_when_told(event: ChatEvent) -> None:
        first_event.set()
        if not go.wait(JOIN_S):
            raise AssertionError("not told")
        raise RuntimeError("gave up")

    with callers() as running:
        holding(gate, running)
        quitter = Caller(gate, 0, "quitter", on_event=leave_when_told).start()
        assert first_event.wait(JOIN_S)
        second = Caller(gate, 0, "second").start()
        running.append(second)
        until(lambda: gate.waiting(0) == 2 and len(second.events) == 1)
        third = Caller(gate, 0, "third").start()
        running.append(third)
        until(lambda: gate.waiting(0) == 3 and len(third.events) == 1)
        go.set()
        quitter.thread.join(JOIN_S)
        until(lambda: len(second.events) == 2 and len(third.events) == 2)
        assert (second.events, third.events) == ([Queued(2), Queued(1)], [Queued(3), Queued(2)])
        assert gate.waiting(0) == 2


# -- status readers on a slot nobody asked for, a cancel while queued, a ticket's place ------------


def test_a_slot_never_held_has_no_waiters_and_no_holder() -> None:
    gate = SlotGate(queue_per_slot=2)
    assert gate.waiting(5) == 0
    assert not gate.held(5)


def test_a_slot_held_and_released_has_no_waiters_left() -> None:
    gate = SlotGate(queue_per_slot=2)
    with hold(gate, 1, on_event=lambda event: None):
        assert gate.held(1)
        assert gate.waiting(1) == 0
    assert not gate.held(1)
    assert gate.waiting(1) == 0


class ObservedToken(CancelToken):
    """A cancel token that signals when the queue first looks at it: the queue looks right
    before it sleeps, so a cancel after that signal finds the waiter asleep or about to sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_at = threading.Event()

    def raise_if_cancelled(self) -> None:
        self.looked_at.set()
        super().raise_if_cancelled()


def test_a_waiter_asleep_in_the_queue_is_woken_by_a_cancel() -> None:
    gate = SlotGate(queue_per_slot=1)
    queue = SlotQueue(gate, SystemClock())
    holder = gate.enter(0)
    waiter = gate.enter(0)
    token = ObservedToken()
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            queue.wait(waiter, token, queue.clock.now() + 60.0)
        except Cancelled as exc:
            raised.append(exc)
        finally:
            gate.leave(waiter)

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        assert token.looked_at.wait(JOIN_S)
        token.cancel()
        thread.join(JOIN_S)
        # Only the cancel can have woken it: the holder still holds the slot.
        assert not thread.is_alive()
        assert gate.held(0)
    finally:
        gate.leave(holder)  # wakes a waiter the cancel failed to wake
        thread.join(JOIN_S)
    assert [type(e) for e in raised] == [Cancelled]
    assert gate.waiting(0) == 0


def test_a_ticket_that_holds_the_slot_at_once_has_no_one_ahead() -> None:
    gate = SlotGate(queue_per_slot=1)
    holder = gate.enter(0)
    waiter = gate.enter(0)
    assert (holder.ahead, waiter.ahead) == (0, 1)
    gate.leave(waiter)
    gate.leave(holder)


class CancelledRightAfterTheLook(CancelToken):
    """A token that is cancelled the moment the queue has looked at it and found it live, as a
    signal handler cancelling it between that look and the sleep would."""

    def __init__(self) -> None:
        super().__init__()
        self.looked = False

    def raise_if_cancelled(self) -> None:
        live = not self.cancelled
        super().raise_if_cancelled()
        if live and not self.looked:
            self.looked = True
            self.cancel()


def test_a_cancel_between_the_look_and_the_sleep_ends_the_wait_at_once() -> None:
    gate = SlotGate(queue_per_slot=4)
    queue = SlotQueue(gate, SystemClock())
    holder = gate.enter(0)
    queued = gate.enter(0)
    token = CancelledRightAfterTheLook()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        queue.wait(queued, token, queue.clock.now() + 3.0)
    assert token.looked
    # The sleep registers before it looks at the token, so the cancel is seen, not slept through.
    assert time.monotonic() - started < 0.5
    gate.leave(queued)
    gate.leave(holder)
