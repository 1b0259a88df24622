"""The waiting for a place under the proxy's concurrency limit (`domain.conn_places`), in both
flavours, shared by every transport of a container across threads and event loops.

`Places.take` (a thread) and `Places.take_async` (a task) wait first come first served, within
the caller's timeout (a cancel ends the blocking wait, cancelling the task the other); a place
is a `Place`, given back once by `release`, or when it is collected unreleased.

Invariants:
- Every place taken is given back exactly once: by `release`, by the collector (`__del__`), or
  by a waiter that gives up (timeout, cancel) after it was handed one in the same instant.
- A place given back while the lock is held (the collector runs inside any allocation, in any
  thread, the lock's holder's too) is never lost nor deadlocks: it is noted lock-free and
  settled by whoever holds the lock, on its way out.
- A waiter is woken outside the lock: a thread by its event, a task through its loop
  (`call_soon_threadsafe`); a loop already closed hands the place on to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from domain.conn_places import ConnPlaces
from domain.errors import ConnectError
from ports.transport import CancelSignal

__all__ = ["Place", "Places"]


class Place:
    """One place held; `release` gives it back (idempotent), as does collection."""

    __slots__ = ("_places",)

    def __init__(self, places: Places) -> None:
        self._places: Places | None = places

    def release(self) -> None:
        places, self._places = self._places, None
        if places is not None:
            places.give_back()

    __del__ = release


class _Waiter:
    """A thread waiting for a place: `wake` sets its event."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()

    def wake(self) -> bool:
        self.event.set()
        return True


class _TaskWaiter:
    """A task waiting for a place on its loop; `wake` is False if that loop is gone."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> bool:
        try:
            self.loop.call_soon_threadsafe(_settle_future, self.future)
        except RuntimeError:  # the loop is closed: nobody will take this place
            return False
        return True


def _settle_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Places:
    """The places of a container's connections: at most `limit` held at once (see the module)."""

    __slots__ = ("_core", "_lock", "_returned", "max_conns")

    def __init__(self, limit: int, *, max_conns: int | None = None) -> None:
        self._core: ConnPlaces[_Waiter | _TaskWaiter] = ConnPlaces(limit)
        self._lock = threading.Lock()
        self._returned: list[None] = []  # places given back while the lock was held elsewhere
        self.max_conns = max_conns if max_conns is not None else limit + 1

    @classmethod
    def of_proxy(cls, max_conns: int) -> Places:
        """The places for a proxy started with `--max-conns max_conns` (one fewer)."""
        return cls(ConnPlaces.proxy_limit(max_conns), max_conns=max_conns)

    def __repr__(self) -> str:
        return f"Places({self._core.limit} for the proxy's max_conns {self.max_conns})"

    @property
    def held(self) -> int:
        with self._lock:
            held = self._core.held
        self._settle()
        return held

    @property
    def waiting(self) -> int:
        with self._lock:
            waiting = self._core.waiting
        self._settle()
        return waiting

    def take_now(self) -> Place | None:
        """A place if one is free at once and nobody waits for one; else None."""
        with self._lock:
            taken = self._core.take_now()
        self._settle()
        return Place(self) if taken else None

    def take(self, wait: float, cancel: CancelSignal | None, path: str, *, at_once: bool) -> Place:
        """A place, waited for (first come, first served) at most `wait` s; `ConnectError`
        naming `path` when none came by then, or `cancel` fired meanwhile. `at_once`: only a
        place free now, else `ConnectError` (a connection made ahead never waits for one)."""
        if at_once:
            return self._now_or_never(path)
        waiter = _Waiter()
        if self._ask(waiter):
            return Place(self)
        unwatch = cancel.on_cancel(waiter.event.set) if cancel is not None else None
        try:
            waiter.event.wait(max(wait, 0.0))
        except BaseException:
            self._drop(waiter)
            raise
        finally:
            if unwatch is not None:
                unwatch()
        if self._given_up(waiter):
            return Place(self)
        raise self._none(path, wait)

    async def take_async(self, timeout: float, path: str, *, at_once: bool) -> Place:
        """`take` in a task: cancelling it ends the wait."""
        if at_once:
            return self._now_or_never(path)
        waiter = _TaskWaiter(asyncio.get_running_loop())
        if self._ask(waiter):
            return Place(self)
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                await waiter.future
        except TimeoutError:
            pass
        except BaseException:  # cancelled: a place handed over meanwhile goes on to the next
            self._drop(waiter)
            raise
        if self._given_up(waiter):
            return Place(self)
        raise self._none(path, timeout)

    def give_back(self) -> None:
        self._returned.append(None)  # atomic: safe from a collector inside the lock's holder
        self._settle()

    def _ask(self, waiter: _Waiter | _TaskWaiter) -> bool:
        with self._lock:
            taken = self._core.ask(waiter)
        self._settle()
        return taken

    def _given_up(self, waiter: _Waiter | _TaskWaiter) -> bool:
        """Whether `waiter`, done waiting, holds a place (handed one, perhaps at this instant)."""
        with self._lock:
            queued = self._core.withdraw(waiter)
        self._settle()
        return not queued

    def _drop(self, waiter: _Waiter | _TaskWaiter) -> None:
        if self._given_up(waiter):
            self.give_back()

    def _settle(self) -> None:
        """Hand on the places given back: under the lock if it is free; else its holder does,
        as it looks again once it has let go (a place noted before that look is seen by it)."""
        while self._returned:
            if not self._lock.acquire(blocking=False):
                return
            woken: list[_Waiter | _TaskWaiter] = []
            try:
                while self._returned:
                    with contextlib.suppress(IndexError):
                        self._returned.pop()
                        waiter = self._core.give_back()
                        if waiter is not None:
                            woken.append(waiter)
            finally:
                self._lock.release()
            for waiter in woken:
                if not waiter.wake():
                    self.give_back()

    def _now_or_never(self, path: str) -> Place:
        place = self.take_now()
        if place is None:
            raise ConnectError(f"cannot connect to {path} ahead: no connection place free ({self})")
        return place

    def _none(self, path: str, timeout: float) -> ConnectError:
        return ConnectError(
            f"cannot connect to {path}: all {self._core.limit} connection places in use"
            f" for {timeout:g} s (the proxy's max_conns {self.max_conns}, less its spare),"
            " or cancelled meanwhile"
        )
