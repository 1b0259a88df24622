"""CancelToken from a signal handler, and `cancel_all`.

A signal handler runs in the main thread between two bytecodes of whatever that thread was
doing, possibly inside the very token it cancels. These tests land such a cancel inside the
token's own critical sections three ways: through a lock that cancels as soon as it is taken,
at every bytecode of a method (a trace hook), and from a real `SIGALRM`. Each run is bounded:
a cancel that deadlocks shows as a thread that does not finish, or a loop that stops moving.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest

import domain.cancel
from domain.cancel import CancelToken, cancel_all
from domain.errors import Cancelled, ClientClosed

JOIN_S = 2.0


def run_bounded(
    action: Callable[[], object], timeout: float = JOIN_S, what: str = "a cancel nested in the token"
) -> object:
    """Run `action` in a daemon thread; fail if it has not returned within `timeout`."""
    outcome: list[object] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"still running after {timeout} s: {what} deadlocked"
    if errors:
        raise errors[0]
    return outcome[0]


class Counter:
    """Wake-ups that record each run (an append cannot lose a run the way `n += 1` could)."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def wake(self, name: str) -> Callable[[], None]:
        return lambda: self.runs.append(name)

    def count(self, name: str) -> int:
        return self.runs.count(name)


# -- (a) a lock that cancels the token as soon as it is taken ----------------------------------------


class CancellingLock:
    """Stands for the token's lock. The first acquire, once it holds the lock, cancels the token:
    what a signal handler does when the signal lands just as the lock was taken."""

    def __init__(self, token: CancelToken, inner: Any) -> None:
        self.token = token
        self.inner = inner
        self.fired = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self.inner.acquire(blocking, timeout))
        if got and not self.fired:
            self.fired = True
            self.token.cancel()
        return got

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def arm(token: CancelToken) -> CancellingLock:
    lock = CancellingLock(token, token._lock)
    token._lock = lock  # type: ignore[assignment]
    return lock


def test_a_cancel_landing_while_on_cancel_holds_the_lock_runs_the_new_wake_up_once() -> None:
    token = CancelToken()
    counter = Counter()
    lock = arm(token)
    unlink = run_bounded(lambda: token.on_cancel(counter.wake("w")))
    assert lock.fired
    assert token.cancelled
    assert counter.runs == ["w"]
    assert callable(unlink)
    unlink()
    token.cancel()
    assert counter.runs == ["w"]


def test_a_cancel_landing_while_the_unlink_holds_the_lock_runs_the_wake_up_once() -> None:
    token = CancelToken()
    counter = Counter()
    unlink = token.on_cancel(counter.wake("w"))
    lock = arm(token)
    run_bounded(unlink)
    assert lock.fired
    assert token.cancelled
    # The nested cancel started before the unlink took the wake-up out, so it ran it.
    assert counter.runs == ["w"]
    token.cancel()
    assert counter.runs == ["w"]


def test_a_cancel_landing_while_cancel_holds_the_lock_runs_each_wake_up_once() -> None:
    token = CancelToken()
    counter = Counter()
    token.on_cancel(counter.wake("a"))
    token.on_cancel(counter.wake("b"))
    lock = arm(token)
    run_bounded(lambda: token.cancel(Cancelled("outer")))
    assert lock.fired
    assert sorted(counter.runs) == ["a", "b"]
    # The nested cancel marked the token first: its error (the default) is the one kept.
    assert str(token.error()) == "the call was cancelled"


def test_a_cancel_landing_while_cancel_all_holds_a_lock_runs_each_wake_up_once() -> None:
    tokens = [CancelToken() for _ in range(3)]
    counter = Counter()
    for i, token in enumerate(tokens):
        token.on_cancel(counter.wake(f"w{i}"))
    lock = arm(tokens[1])
    run_bounded(lambda: cancel_all(tokens))
    assert lock.fired
    assert sorted(counter.runs) == ["w0", "w1", "w2"]
    assert all(token.cancelled for token in tokens)


# -- a cancel landing at every bytecode of the token's own code --------------------------------------


TRACED_FILES = {domain.cancel.__file__, threading.__file__}


@dataclass
class Injector:
    """A trace hook that counts the bytecodes run in the token's module (and in `threading`,
    where a plain `threading.Event` does its work) and, at the `at`-th, runs `nested` there."""

    nested: Callable[[], None]
    at: int = 0
    seen: int = 0
    injected: bool = False
    nesting: bool = False

    def calls(self, frame: FrameType, event: str, arg: object) -> Any:
        if self.nesting or frame.f_code.co_filename not in TRACED_FILES:
            return None
        frame.f_trace_opcodes = True
        return self.opcodes

    def opcodes(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode" and not self.nesting:
            self.seen += 1
            if self.seen == self.at:
                self.nesting = True
                try:
                    self.nested()
                finally:
                    self.nesting = False
                    self.injected = True
        return self.opcodes

    def run(self, action: Callable[[], object]) -> object:
        sys.settrace(self.calls)
        try:
            return action()
        finally:
            sys.settrace(None)


@dataclass
class Scenario:
    """One use of a token, set up fresh for each landing point: `act` is what runs traced (the
    nested cancel lands inside it), `check` what must hold after."""

    token: CancelToken
    act: Callable[[], object]
    check: Callable[[object], None]


def on_cancel_scenario() -> Scenario:
    token = CancelToken()
    counter = Counter()

    def check(unlink: object) -> None:
        assert counter.runs == ["w"]
        assert callable(unlink)
        unlink()
        token.cancel()
        assert counter.runs == ["w"]

    return Scenario(token, lambda: token.on_cancel(counter.wake("w")), check)


def unlink_scenario() -> Scenario:
    token = CancelToken()
    counter = Counter()
    unlink = token.on_cancel(counter.wake("w"))

    def check(_: object) -> None:
        runs = list(counter.runs)
        assert runs in ([], ["w"])
        token.cancel()
        assert counter.runs == runs, "an unlinked wake-up ran after its unlink returned"

    return Scenario(token, unlink, check)


def cancel_scenario() -> Scenario:
    token = CancelToken()
    counter = Counter()
    for name in ("a", "b", "c"):
        token.on_cancel(counter.wake(name))

    def check(_: object) -> None:
        assert sorted(counter.runs) == ["a", "b", "c"]
        assert token.cancelled
        assert token.event.is_set()

    return Scenario(token, lambda: token.cancel(ClientClosed("closed")), check)


def cancel_all_scenario() -> Scenario:
    tokens = [CancelToken() for _ in range(3)]
    counter = Counter()
    for i, token in enumerate(tokens):
        token.on_cancel(counter.wake(f"w{i}"))
        token.on_cancel(counter.wake(f"v{i}"))

    def check(_: object) -> None:
        assert sorted(counter.runs) == sorted(f"{p}{i}" for p in "wv" for i in range(3))
        assert all(token.cancelled and token.event.is_set() for token in tokens)

    return Scenario(tokens[1], lambda: cancel_all(tokens), check)


def wait_scenario() -> Scenario:
    token = CancelToken()

    def check(woken: object) -> None:
        assert woken is True

    return Scenario(token, lambda: token.event.wait(), check)


def landing_points(make: Callable[[], Scenario]) -> int:
    """How many bytecodes `act` runs when no cancel lands in it (a wait: before it blocks)."""
    scenario = make()
    counting = Injector(nested=lambda: None)
    worker = threading.Thread(target=lambda: counting.run(scenario.act), daemon=True)
    worker.start()
    worker.join(0.2)
    if worker.is_alive():  # a wait: it blocks until cancelled
        seen = counting.seen
        scenario.token.cancel()
        worker.join(JOIN_S)
        return seen
    return counting.seen


@pytest.mark.parametrize(
    "make",
    [on_cancel_scenario, unlink_scenario, cancel_scenario, cancel_all_scenario, wait_scenario],
    ids=["on_cancel", "unlink", "cancel", "cancel_all", "event_wait"],
)
def test_a_cancel_landing_at_any_bytecode_of_the_token_loses_no_wake_up_and_runs_none_twice(
    make: Callable[[], Scenario],
) -> None:
    points = landing_points(make)
    assert points > 5
    for at in range(1, points + 1):
        scenario = make()
        injector = Injector(nested=scenario.token.cancel, at=at)
        landing = f"a cancel landing at bytecode {at} of {points}"
        result = run_bounded(functools.partial(injector.run, scenario.act), what=landing)
        assert injector.injected, f"no cancel landed at bytecode {at} of {points}"
        scenario.check(result)


# -- a real signal ------------------------------------------------------------------------------------

needs_alarms = pytest.mark.skipif(
    not hasattr(signal, "setitimer") or not hasattr(signal, "pthread_kill"), reason="needs setitimer and pthread_kill"
)


class Stalled(Exception):
    pass


@contextlib.contextmanager
def alarms_every(interval: float, handler: Callable[[], None]) -> Iterator[None]:
    """Call `handler` from SIGALRM every `interval` seconds; then restore the handler and the
    timer that ran before (pytest-timeout's goes on where it was)."""
    started = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, lambda *_: handler())
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, interval, interval)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            left = max(old_delay - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


@contextlib.contextmanager
def stall_guard(progress: list[int]) -> Iterator[None]:
    """Raise `Stalled` in the main thread if `progress[0]` stops moving for `JOIN_S`: a thread
    (SIGUSR1, which also ends the alarms) checks it; faulthandler ends the run if that fails too."""

    def on_stall(*_: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise Stalled

    def watch() -> None:
        last, still = -1, 0.0
        while not done.wait(0.1):
            last, still = (progress[0], 0.0) if progress[0] != last else (last, still + 0.1)
            if still >= JOIN_S:
                signal.pthread_kill(main, signal.SIGUSR1)
                still = 0.0

    main = threading.get_ident()
    done = threading.Event()
    old_handler = signal.signal(signal.SIGUSR1, on_stall)
    faulthandler.dump_traceback_later(60, exit=True)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGUSR1, old_handler)


@dataclass
class Registered:
    token: CancelToken
    name: str
    unlinked: bool = False
    unlinked_while_live: bool = False


class SignalRound:
    """Tokens made three at a time, each given three wake-ups of which the second is unlinked,
    while SIGALRM cancels the current three (one of them, or all with `cancel_all`)."""

    def __init__(self) -> None:
        self.counter = Counter()
        self.registered: list[Registered] = []
        self.group: list[CancelToken] = []
        self.alarms: list[int] = []
        self.progress = [0]
        self.depth = 0

    def on_alarm(self) -> None:
        # A signal may land inside the handler itself; a few levels are enough, and the cap keeps
        # a deadlocked thread (it still takes every signal) from nesting without end.
        tokens = list(self.group)
        if not tokens or self.depth >= 3:
            return
        self.alarms.append(1)
        self.depth += 1
        try:
            if len(self.alarms) % 4 == 0:
                cancel_all(tokens)
            else:
                tokens[len(self.alarms) % len(tokens)].cancel()
        finally:
            self.depth -= 1

    def step(self) -> None:
        tokens = [CancelToken() for _ in range(3)]
        self.group[:] = tokens
        for token in tokens:
            for k in range(3):
                entry = Registered(token, f"w{len(self.registered)}")
                self.registered.append(entry)
                unlink = token.on_cancel(self.counter.wake(entry.name))
                if k == 1:
                    unlink()
                    entry.unlinked = True
                    entry.unlinked_while_live = not token.cancelled
            token.event.wait(0)
        if self.progress[0] % 5 == 0:
            tokens[0].cancel()  # so that signals land inside a cancel too
        self.progress[0] += 1

    def check(self) -> None:
        assert len(self.alarms) >= 20, "too few signals landed to test anything"
        runs = collections.Counter(self.counter.runs)
        kept = 0
        for entry in self.registered:
            count = runs[entry.name]
            if not entry.token.cancelled:
                assert count == 0, entry
            elif not entry.unlinked:
                kept += 1
                assert count == 1, entry
            elif entry.unlinked_while_live:
                assert count == 0, f"{entry}: ran after its unlink returned"
            else:
                assert count <= 1, entry
        assert kept > 0


@needs_alarms
def test_cancels_from_a_real_signal_handler_never_deadlock_and_run_each_wake_up_once() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")
    rounds = SignalRound()
    try:
        with stall_guard(rounds.progress), alarms_every(0.0003, rounds.on_alarm):
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                rounds.step()
    except Stalled:
        pytest.fail("the loop stopped moving: a cancel from the signal handler deadlocked")
    rounds.check()


def test_a_wake_up_registered_while_another_thread_cancels_runs_exactly_once() -> None:
    for _ in range(300):
        token = CancelToken()
        counter = Counter()
        go = threading.Barrier(2)

        def register(token: CancelToken = token, counter: Counter = counter, go: threading.Barrier = go) -> None:
            go.wait()
            for i in range(20):
                token.on_cancel(counter.wake(str(i)))

        other = threading.Thread(target=register)
        other.start()
        go.wait()
        token.cancel()
        other.join(JOIN_S)
        assert not other.is_alive()
        assert sorted(counter.runs, key=int) == [str(i) for i in range(20)]


# -- cancel_all ---------------------------------------------------------------------------------------


def test_cancel_all_marks_every_token_before_any_wake_up_runs() -> None:
    tokens = [CancelToken() for _ in range(5)]
    seen: list[tuple[int, bool, bool, bool]] = []

    def wake(i: int) -> Callable[[], None]:
        def look() -> None:
            raised = []
            for token in tokens:
                try:
                    token.raise_if_cancelled()
                except ClientClosed:
                    raised.append(token)
            seen.append(
                (
                    i,
                    all(token.cancelled for token in tokens),
                    all(token.event.is_set() for token in tokens),
                    len(raised) == len(tokens),
                )
            )

        return look

    for i, token in enumerate(tokens):
        token.on_cancel(wake(i))
        token.on_cancel(wake(i + 100))
    closed = ClientClosed("closed")
    cancel_all(iter(tokens), closed)
    assert sorted(i for i, *_ in seen) == [*range(5), *range(100, 105)]
    assert all(marked and set_ and raised for _, marked, set_, raised in seen)
    assert all(token.error() is closed for token in tokens)


def test_cancelling_one_by_one_would_let_a_wake_up_see_a_token_not_cancelled_yet() -> None:
    # Why `cancel_all` exists: a wake-up that hands the slot on finds the next call still live.
    tokens = [CancelToken() for _ in range(2)]
    seen: list[bool] = []
    tokens[0].on_cancel(lambda: seen.append(tokens[1].cancelled))
    for token in tokens:
        token.cancel()
    assert seen == [False]
    tokens = [CancelToken() for _ in range(2)]
    seen.clear()
    tokens[0].on_cancel(lambda: seen.append(tokens[1].cancelled))
    cancel_all(tokens)
    assert seen == [True]


def test_cancel_all_keeps_each_token_first_error_and_runs_each_wake_up_once() -> None:
    first = Cancelled("first")
    earlier, fresh = CancelToken(), CancelToken()
    counter = Counter()
    earlier.cancel(first)
    fresh.on_cancel(counter.wake("fresh"))

    def broken() -> None:
        raise OSError("already closed")

    fresh.on_cancel(broken)
    fresh.on_cancel(counter.wake("after"))
    closed = ClientClosed("closed")
    cancel_all([earlier, fresh, fresh], closed)
    cancel_all([fresh], Cancelled("late"))
    assert earlier.error() is first
    assert fresh.error() is closed
    assert counter.runs == ["fresh", "after"]
    cancel_all([])


def test_cancel_all_without_an_error_raises_the_default_cancelled() -> None:
    token = CancelToken()
    cancel_all([token])
    with pytest.raises(Cancelled) as caught:
        token.raise_if_cancelled()
    assert type(caught.value) is Cancelled


def test_a_wake_up_after_the_unlink_never_runs_and_a_wake_up_registered_late_runs_at_once() -> None:
    token = CancelToken()
    counter = Counter()
    unlink = token.on_cancel(counter.wake("gone"))
    unlink()
    cancel_all([token])
    assert counter.runs == []
    token.on_cancel(counter.wake("late"))
    assert counter.runs == ["late"]


def test_the_event_waits_and_times_out_like_a_threading_event() -> None:
    token = CancelToken()
    event = token.event
    assert isinstance(event, threading.Event)
    assert event.wait(0) is False
    assert event.wait(-1) is False
    assert event.wait(0.01) is False
    waiter = threading.Thread(target=event.wait, daemon=True)
    waiter.start()
    time.sleep(0.02)
    token.cancel()
    waiter.join(JOIN_S)
    assert not waiter.is_alive()
    assert event.wait() is True
    assert event.wait(0) is True
    event.clear()
    assert not event.is_set()
    assert token.cancelled  # clearing the event does not undo the cancel
