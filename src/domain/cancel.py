"""Cancelling a call from another thread.

`CancelToken()` is handed to a call (`client.chat(req, on_event, cancel=token)`); `token.cancel()`
from any thread ends that call in whatever phase it is: queued at the slot gate, waiting for
the response head, streaming, posting `reasoning_end`, or waiting to retry.

Invariants:
- `cancel()` is idempotent, safe from any thread, never raises because of what it wakes, and
  returns only after every registered wake-up has run: by then every connection the call had
  open is shut, so a blocked read returns at once and the server stops generating.
- A wake-up registered after the cancel runs at once, in the registering thread, so a call that
  starts a phase after the cancel sees it without waiting.
- The token only says "stop"; the call decides what it means in each phase and raises
  `Cancelled` (or `ClientClosed` when the client was closed).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from domain.errors import Cancelled

__all__ = ["CancelToken"]

Wake = Callable[[], None]


class CancelToken:
    __slots__ = ("_error", "_event", "_lock", "_next", "_wakes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._wakes: dict[int, Wake] = {}
        self._error: Cancelled | None = None
        self._next = 0

    def __repr__(self) -> str:
        return f"CancelToken(cancelled={self.cancelled})"

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def event(self) -> threading.Event:
        """Set once cancelled: what an interruptible wait waits on."""
        return self._event

    def cancel(self, error: Cancelled | None = None) -> None:
        """Stop the call. `error` is what it raises (by default `Cancelled`)."""
        with self._lock:
            if self._event.is_set():
                return
            self._error = error
            self._event.set()
            wakes = list(self._wakes.values())
            self._wakes.clear()
        for wake in wakes:
            with contextlib.suppress(Exception):
                wake()

    def error(self) -> Cancelled:
        """The error a cancelled call raises."""
        return self._error if self._error is not None else Cancelled("the call was cancelled")

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise self.error()

    def on_cancel(self, wake: Wake) -> Callable[[], None]:
        """Run `wake` when the token is cancelled (at once if it already is); returns a function
        that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                key = self._next
                self._next += 1
                self._wakes[key] = wake
                return lambda: self._forget(key)
        wake()
        return _nothing

    def _forget(self, key: int) -> None:
        with self._lock:
            self._wakes.pop(key, None)


def _nothing() -> None:
    return None
