"""A call's events as an iterator, in either flavour: the thin facade over the one call source.

A call is a generator of steps, its `ChatEvent`s and then its `Completion` (`app._async.call`
and its generated blocking twin). `EventStream` iterates it in the caller's thread and starts no
thread; `AsyncEventStream` awaits it and ties the call's `CancelToken` to the task (`TaskLink`)
while the task waits inside the call. Both:

- are iterated once: the events, then `.completion`; a finished stream iterated again yields
  nothing and keeps its `.completion`;
- end the call when left early (a `break`, an exception, `close()`/`aclose()`, leaving the `with`
  block): its connection is closed, its generation stopped and its slot given back; at once in the
  blocking flavour, on the loop's next turn for an asyncio loop left early (which nothing can
  await; `aclose()` and the `async with` wait for it), and the stream yields nothing more;
- end a loop that another thread or task closes the stream under (or its own body does) with
  `Cancelled` (`CLOSED_WHILE_READ`): a loop never ends as if the answer had come whole;
- raise the call's `InferError` from the loop; a cancel of the call's token (the caller's
  `CancelToken`, the client's close) that comes while the consumer runs its own code ends the
  call then (its generation stopped, its connections closed, its slot given back: in the
  canceller's thread here, in a task of its own on the call's loop on asyncio), and the next step
  raises the token's `Cancelled` (or `ClientClosed`);
- are read by one loop: a second thread or task stepping the stream while another is inside a
  step is a `RuntimeError` (`ONE_READER`), and the first reads on.

The asyncio flavour is `app.async_event_stream`'s; what both share, `app.stream_facade`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from types import TracebackType

from app.async_event_stream import AsyncEventStream
from app.stream_facade import CLOSED_WHILE_READ, ONE_READER, Facade, Step, check_sink, emit
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.events import ChatEvent

__all__ = ["CLOSED_WHILE_READ", "ONE_READER", "AsyncEventStream", "EventStream", "Step", "check_sink", "emit"]


class EventStream(Facade):
    """`with client.stream(req) as s: for event in s: ...`, then `s.completion`. `close()` may
    come from any thread: a loop it cuts short raises `Cancelled`."""

    __slots__ = ("_lock", "_reader", "_stepping", "_steps")

    def __init__(self, steps: Callable[[CancelToken], Generator[Step, None, None]]) -> None:
        super().__init__()
        self._steps = steps(self._token)
        # Held by a step, and by an end that comes from elsewhere (a cancel, `close()`): the
        # call's generator runs in one of them at a time.
        self._lock = threading.Lock()
        self._stepping = False  # a step holds it
        self._reader: int | None = None  # the thread of the last step
        self._token.on_cancel(self._on_cancel)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[ChatEvent]:
        """The events; leaving the loop early (`break`) closes the call at once."""
        self._looping += 1
        try:
            while True:
                try:
                    event = self.__next__()
                except StopIteration:
                    return
                yield event
        finally:
            self._looping -= 1
            self._end_unless_stepping()

    def run(self, on_event: Callable[[ChatEvent], None]) -> Completion:
        """Every event to `on_event`, then the completion: `chat`'s loop, with no generator of
        its own on the way to each event. Left by an exception, it closes the call at once."""
        self._looping += 1
        try:
            while True:
                try:
                    event = self.__next__()
                except StopIteration:
                    return self.completion
                emit(on_event, event)
        finally:
            self._looping -= 1
            self._end_unless_stepping()

    def __next__(self) -> ChatEvent:
        lock = self._lock
        if not lock.acquire(blocking=False):
            if self._stepping:
                raise RuntimeError(ONE_READER)
            lock.acquire()  # the call is being ended from elsewhere: its end is awaited
        self._stepping = True
        self._reader = threading.get_ident()
        try:
            if self._token.cancelled and not self._over:  # in this thread, since the last step
                self._end()
            if self._over:
                self._raise_if_cut()
                raise StopIteration
            try:
                step = next(self._steps)
            except StopIteration:  # pragma: no cover - the steps end with their Completion
                self._end()
                raise RuntimeError("the call ended without a completion") from None
            except BaseException:
                self._end()
                raise
            if isinstance(step, Completion):
                self._completion = step
                self._end()
                raise StopIteration
            return step
        finally:
            self._stepping = False
            lock.release()

    def close(self) -> None:
        """End the call now if it has not ended (idempotent); from another thread while the
        loop waits inside the call, by cancelling it (the loop raises `Cancelled`)."""
        if not self._lock.acquire(blocking=False):  # a step runs in another thread
            self._closed_from_elsewhere(True)
            return
        try:
            if not self._closed_from_elsewhere(False):
                self._end()
        finally:
            self._lock.release()

    def _on_cancel(self) -> None:
        """The call's token fired. From another thread, a call between two steps (its consumer
        in its own code) is ended there and then: its generation stopped, its connections
        closed, its slot given back; the next step raises the token's error. In the consumer's
        own thread (its own code, or a signal handler on top of it, which may have cut into a
        lock the end takes) the next step ends it. A step under way meets the cancel in its own
        waits."""
        if threading.get_ident() != self._reader:
            self._end_unless_stepping()

    def _end_unless_stepping(self) -> None:
        """End the call unless a step runs (in another thread: its loop ends it, or reads on
        past a second loop refused), or an end does."""
        if self._lock.acquire(blocking=False):
            try:
                if not self._over:
                    self._end()
            finally:
                self._lock.release()

    def _end(self) -> None:
        self._over = True
        self._steps.close()
