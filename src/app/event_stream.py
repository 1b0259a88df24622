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
- end a loop that another thread or task closes the stream under (or its own body does), and a
  step after such a close, with `Cancelled` (`CLOSED_WHILE_READ`): never as if the answer had
  come whole;
- raise the call's `InferError` from the loop; a cancel of the call's token (the caller's
  `CancelToken`, the client's close) that comes while the consumer runs its own code ends the
  call then (its generation stopped, its connections closed, its slot given back: in the
  canceller's thread here, unless that is the consumer's or the main one, where a signal handler
  may have cut into a lock the end takes, and the next step ends it; in a task of its own on the
  call's loop on asyncio, which a close or a step meanwhile awaits), and the next step raises
  the token's `Cancelled` (or `ClientClosed`);
- raise a `Cancelled` that carries the answer as far as their events showed it (its `content`
  and `reasoning`: the text of the `Content` and `Reasoning` events handed out since the call
  began or its last re-send), made once for both flavours by the facade they share;
- are read by one loop: a second loop, or a step while another thread or task is inside one, is
  refused (`OneReader`, a `RuntimeError`), touches nothing, and the first reads on;
- are never kept alive by their call's token (its wake-ups hold them weakly): one dropped
  unclosed is collected, and its call's generator, finalised, ends the call.

The asyncio flavour is `app.async_event_stream`'s; what both share, `app.stream_facade`'s.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator
from types import TracebackType

from app.async_event_stream import AsyncEventStream
from app.calls import CLOSING
from app.stream_facade import (
    CLOSED_WHILE_READ,
    ONE_READER,
    Facade,
    OneReader,
    Step,
    check_sink,
    emit,
    weakly,
)
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import Cancelled
from domain.events import ChatEvent

__all__ = [
    "CLOSED_WHILE_READ",
    "ONE_READER",
    "AsyncEventStream",
    "EventStream",
    "OneReader",
    "Step",
    "check_sink",
    "emit",
]


class EventStream(Facade):
    """`with client.stream(req) as s: for event in s: ...`, then `s.completion`. `close()` may
    come from any thread: a loop it cuts short raises `Cancelled`."""

    __slots__ = ("_ending", "_lock", "_reader", "_steps")

    def __init__(self, steps: Callable[[CancelToken], Generator[Step, None, None]]) -> None:
        super().__init__()
        self._steps = steps(self._token)
        # Held while the generator runs: by a step, or by an end from elsewhere, which counts
        # itself in `_ending` before it tries the lock (so that a step finding the lock taken
        # knows to wait for the end, not to refuse a second reader): a list, as its `append`
        # and `pop` are atomic.
        self._lock = threading.Lock()
        self._ending: list[None] = []
        self._reader: int | None = None  # the thread of the last step
        self._token.on_cancel(weakly(self._on_cancel))

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> Generator[ChatEvent, None, None]:
        """The events; leaving the loop early (`break`) closes the call at once."""
        with self._one_loop():
            while True:
                try:
                    event = self._next(threading.get_ident())  # a generator may change threads
                except StopIteration:
                    return
                yield event

    def run(self, on_event: Callable[[ChatEvent], None]) -> Completion:
        """Every event to `on_event`, then the completion: `chat`'s loop, with no generator of
        its own on the way to each event. Left by an exception, it closes the call at once."""
        with self._one_loop():
            reader = threading.get_ident()  # one thread runs it through
            while True:
                try:
                    event = self._next(reader)
                except StopIteration:
                    return self.completion
                emit(on_event, event)

    @contextlib.contextmanager
    def _one_loop(self) -> Iterator[None]:
        """A loop over the stream, the only one (`OneReader`); however it ends, the call is
        ended, unless the loop was refused a step (another reads on)."""
        if self._looping:
            raise OneReader()
        self._looping += 1
        refused = False
        try:
            yield
        except OneReader:
            refused = True
            raise
        finally:
            self._looping -= 1
            if not refused:
                self._end_here()

    def __next__(self) -> ChatEvent:
        return self._next(threading.get_ident())

    def _next(self, reader: int) -> ChatEvent:
        """The next event, read in the thread `reader`."""
        lock = self._lock
        if not lock.acquire(blocking=False):
            if not self._ending:
                raise OneReader()
            lock.acquire()  # the call is being ended from elsewhere: its end is awaited
        self._reader = reader
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
            self._saw(step)
            return step
        except Cancelled as error:
            self._raise_carrying(error)
        finally:
            lock.release()

    def close(self) -> None:
        """End the call now if it has not ended (idempotent), an end under way elsewhere
        awaited; from another thread while a loop waits inside the call, by cancelling it (the
        loop raises `Cancelled`)."""
        self._closed_from_elsewhere(False)
        self._end_here(cut=Cancelled(CLOSED_WHILE_READ))

    def _on_cancel(self) -> None:
        """The call's token fired. From a thread that is neither the consumer's nor the main
        one, a call between two steps (its consumer in its own code) is ended there and then:
        its generation stopped, its connections closed, its slot given back (by a close, once
        it has woken every call: their ends, one after another here, share one stop wait); the
        next step raises the token's error. In the consumer's own thread (its own code, or a signal
        handler on top of it), and in the main thread, where a signal handler may have cut into
        a lock the end takes, the next step ends it. A step under way meets the cancel in its
        own waits."""
        me = threading.get_ident()
        if me != self._reader and me != threading.main_thread().ident:
            closing = CLOSING.get()
            if closing is not None:  # a close, cancelling every call: ended once all are woken
                closing.later.append(self._end_now)
            else:
                self._end_here(wait=False)

    def _end_now(self) -> None:
        self._end_here(wait=False)

    def _end_here(self, *, wait: bool = True, cut: Cancelled | None = None) -> None:
        """End the call in this thread, unless it ended, or another thread runs a step (`cut`,
        if given, cancels that step, whose loop raises it) or an end (awaited if `wait`)."""
        lock, ending = self._lock, self._ending
        ending.append(None)
        try:
            if not lock.acquire(blocking=False):
                if len(ending) > 1 and wait:  # another end: awaited
                    with lock:
                        return
                if cut is not None:
                    # A step in another thread (or an end): cancelled, its loop raises it.
                    self._token.cancel(cut)
                return
            try:
                if not self._over:
                    self._end()
            finally:
                lock.release()
        finally:
            ending.pop()

    def _end(self) -> None:
        self._over = True
        self._steps.close()
