"""Cancelling a call from another thread, or from a signal handler.

`CancelToken()` goes to a call (`client.chat(req, on_event, cancel=token)`); `token.cancel()`, from
any thread, ends it in any phase: queued at the slot gate, waiting for the head, streaming, posting
`reasoning_end`, or waiting to retry. `cancel_all(tokens)` cancels many in two phases.

Invariants:
- `cancel()` is idempotent, safe from any thread or signal handler, never raises because of what it
  wakes, and returns only once every registered wake-up has run (but see below): by then every
  connection of the call is shut, so a blocked read returns at once and the server stops generating.
- A wake-up registered after the cancel runs at once, in the registering thread, so a call that
  starts a phase after the cancel sees it without waiting.
- The token only says "stop"; the call decides what it means in each phase and raises `Cancelled`
  (`ClientClosed` if the client was closed).
- A cancel marks the token first (`cancelled`, `raise_if_cancelled`, `event`) and runs its wake-ups
  after, so a wake-up always finds its token cancelled. `cancel_all` marks every token before it
  runs any wake-up: a wake-up that lets another call go on (releasing a slot hands it to the next
  call in the queue) cannot let a call being cancelled send its request.

Re-entrancy (a cancel from a signal handler, `signal.signal(SIGINT, lambda *_: token.cancel())`):
Python runs the handler in the main thread between two bytecodes of what it was doing: maybe this
token's own `on_cancel`, unlink function, `cancel`, or a wait on its `event`.
- The locks are re-entrant, held only around a look and one step on a table (one dict, set or list
  operation, atomic in itself), never while a wake-up runs or another lock is taken: a nested cancel
  never waits for its own thread, and another thread's step, which it may wait for, cannot block.
- Every decision is one such step, so a nested cancel lands wholly before or after it: the first
  error recorded stays the token's; a wake-up is run only by whoever takes it out of the table (a
  cancel or its own registration), so exactly once; a registration stores its wake-up before reading
  the mark, a cancel marks before emptying the table, so one always sees the other: none is lost.
- An unlink takes its wake-up out of the table: once it returns the wake-up never runs, unless a
  cancel took it out first (it has started running it). A later cancel finds nothing.
- A cancel that finds another under way (in another thread, or the one it interrupted) does not wait
  for the wake-ups that one took out: it runs the rest and returns. Likewise, a wake-up that a
  registration finding the token cancelled took out runs in the interrupted code as it resumes.
- `event` is a `threading.Event` whose `set()` may interrupt its own `wait()` in the same thread
  without deadlock or a lost wake-up (a waiter registers before it looks at the flag).
- The wake-ups run where the cancel runs: from a signal handler, in the main thread, wherever it was
  interrupted. A wake-up must not wait there for a lock the main thread may hold.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from domain.errors import Cancelled

__all__ = ["CancelToken", "SignalSafeEvent", "cancel_all"]

Wake = Callable[[], None]


class CancelToken:
    __slots__ = ("_errors", "_event", "_keys", "_lock", "_wakes")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # Made by the first wait that needs it: most calls never do.
        self._event: SignalSafeEvent | None = None
        self._wakes: OrderedDict[int, Wake] = OrderedDict()
        # The mark: empty until cancelled. The first error appended is the token's; a cancel
        # nested between another's look and its append may add one more, never a first.
        self._errors: list[Cancelled | None] = []
        self._keys = itertools.count()

    def __repr__(self) -> str:
        return f"CancelToken(cancelled={self.cancelled})"

    @property
    def cancelled(self) -> bool:
        return bool(self._errors)

    @property
    def event(self) -> threading.Event:
        """Set once cancelled: what an interruptible wait waits on. Made here, under the lock
        `_mark` looks at it under: made before a cancel's mark, the cancel sets it; made after,
        it is made set."""
        flag = self._event
        if flag is None:
            with self._lock:
                flag = self._event
                if flag is None:
                    flag = SignalSafeEvent()
                    self._event = flag
                    if self._errors:
                        flag.set()
        return flag

    def cancel(self, error: Cancelled | None = None) -> None:
        """Stop the call. `error` is what it raises (by default `Cancelled`)."""
        self._mark(error)
        self._run_wakes()

    def error(self) -> Cancelled:
        """The error a cancelled call raises."""
        errors = self._errors
        first = errors[0] if errors else None
        return first if first is not None else Cancelled("the call was cancelled")

    def raise_if_cancelled(self) -> None:
        if self._errors:
            raise self.error()

    def on_cancel(self, wake: Wake) -> Callable[[], None]:
        """Run `wake` when the token is cancelled (at once if it already is); returns a function
        that unregisters it."""
        key = next(self._keys)
        with self._lock:
            self._wakes[key] = wake
            live = not self._errors
        if live:
            return lambda: self._forget(key)
        # Cancelled before or while registering: whoever takes the wake-up out runs it, a cancel
        # emptying the table or this registration.
        with self._lock:
            mine = self._wakes.pop(key, None)
        if mine is not None:
            mine()
        return _nothing

    def _forget(self, key: int) -> None:
        with self._lock:
            self._wakes.pop(key, None)

    def _mark(self, error: Cancelled | None) -> None:
        """The first phase of a cancel: the token reads as cancelled and its event is set."""
        with self._lock:
            if not self._errors:
                self._errors.append(error)
            flag = self._event
        if flag is not None:
            flag.set()

    def _run_wakes(self) -> None:
        """The second phase: take the wake-ups out one by one, in the order registered, and run
        each taken. Any cancel of the token may do this; each wake-up is taken once."""
        while True:
            with self._lock:
                try:
                    _, wake = self._wakes.popitem(last=False)
                except KeyError:
                    return
            with contextlib.suppress(Exception):
                wake()


def cancel_all(tokens: Iterable[CancelToken], error: Cancelled | None = None) -> None:
    """Cancel every token, as `cancel(error)` each, but in two phases: every token is marked
    cancelled before the first wake-up of any of them runs. Returns once all have run."""
    marked = list(tokens)
    for token in marked:
        token._mark(error)
    for token in marked:
        token._run_wakes()


def _nothing() -> None:
    return None


class SignalSafeEvent(threading.Event):
    """`threading.Event` safe to `set()` from a signal handler that interrupted `wait()`, or
    `set()` itself, in the same thread: its lock is re-entrant and held only around one step on
    the waiter table. A waiter enters the table before it looks at the flag and `set()` raises
    the flag before it empties the table, so one of them sees the other; each waiter is taken
    out, and released, once."""

    def __init__(self) -> None:
        super().__init__()
        self._flag = False
        self._mutex = threading.RLock()
        self._waiters: set[threading.Lock] = set()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        while True:
            with self._mutex:
                try:
                    waiter = self._waiters.pop()
                except KeyError:
                    return
            waiter.release()

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        waiter = threading.Lock()
        waiter.acquire()
        with self._mutex:
            self._waiters.add(waiter)
        try:
            if self._flag:
                return True
            if timeout is None:
                woken = waiter.acquire()
            elif timeout > 0:
                woken = waiter.acquire(True, timeout)
            else:
                woken = waiter.acquire(False)
            return woken or self._flag
        finally:
            with self._mutex:
                self._waiters.discard(waiter)
