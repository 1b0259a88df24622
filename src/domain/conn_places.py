"""The proxy's concurrency limit, kept on the client's side: the places of a container's open
connections, and who gets the next one free.

inferproxy holds at most `--max-conns` connections at once (8 by default) and closes a client
over it at once. One of its places goes to its spare connection, made ahead to the upstream, so
the client keeps one fewer open (`of_proxy`): every connection of the container's clients, in
both flavours, of every kind, holds a place from its connect until it is closed.

This is the decision alone, sans-IO and single-threaded: the adapter
(`adapters.uds_http.places`) holds the lock, waits, wakes and gives places back. Invariants:
- At most `limit` places are held at once.
- Places go in the order they were asked for: a place given back goes to the longest waiter,
  never to a newcomer (`take_now` takes none while anyone waits), so no caller starves.
- A waiter is either queued or handed a place, never both: `withdraw` says which it was, so a
  waiter that gives up at the moment it is handed a place gives that place back.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

__all__ = ["ConnPlaces"]

W = TypeVar("W")


class ConnPlaces(Generic[W]):
    """At most `limit` connections open at once; the waiters in a queue, served first come
    first served. `W` is whatever the adapter wakes a waiter with."""

    __slots__ = ("_queue", "held", "limit")

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, not {limit!r}")
        self.limit = limit
        self.held = 0
        self._queue: deque[W] = deque()

    @staticmethod
    def proxy_limit(max_conns: int) -> int:
        """The places for a proxy started with `--max-conns max_conns`: one fewer, as its spare
        connection to the upstream takes one (but never none)."""
        return max(1, max_conns - 1)

    def __repr__(self) -> str:
        return f"ConnPlaces({self.held} of {self.limit} held, {len(self._queue)} waiting)"

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def take_now(self) -> bool:
        """Take a place if one is free and nobody waits for one; whether it was taken."""
        if self._queue or self.held >= self.limit:
            return False
        self.held += 1
        return True

    def ask(self, waiter: W) -> bool:
        """Take a place now (True), or queue `waiter` for the next one given back (False)."""
        if self.take_now():
            return True
        self._queue.append(waiter)
        return False

    def give_back(self) -> W | None:
        """A held place given back: the waiter it is handed to (to be woken), or None when
        nobody waits and the place is free."""
        if self._queue:
            return self._queue.popleft()
        if self.held <= 0:
            raise RuntimeError("a place given back that was never taken")
        self.held -= 1
        return None

    def withdraw(self, waiter: W) -> bool:
        """`waiter` gives up: True if it was still queued (it holds nothing), False if it was
        handed a place already (its to give back)."""
        try:
            self._queue.remove(waiter)
        except ValueError:
            return False
        return True
