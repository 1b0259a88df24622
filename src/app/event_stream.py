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
- raise the call's `InferError` from the loop, and a cancelled token's `Cancelled` (or
  `ClientClosed`) at the next step if it was cancelled while the consumer ran its own code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterator
from types import TracebackType
from typing import Any

from app.calls import TaskLink
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import Cancelled, RequestError
from domain.events import ChatEvent

__all__ = ["AsyncEventStream", "EventStream", "Step", "check_sink", "emit"]

Step = ChatEvent | Completion


def check_sink(on_event: object) -> None:
    """A call's `on_event` is called with every event: one that cannot be is a `RequestError`
    before anything is sent."""
    if not callable(on_event):
        raise RequestError(f"on_event must be callable, not {type(on_event).__name__}")


def emit(on_event: Callable[[ChatEvent], None], event: ChatEvent) -> None:
    """Hand `event` to the caller's callback. A `StopIteration` it raises would read as the end
    of the call's steps: it is an error of the callback's."""
    try:
        on_event(event)
    except StopIteration as exc:
        raise RuntimeError(f"on_event raised StopIteration on {type(event).__name__}") from exc


# Said by a loop whose stream was closed from elsewhere while it ran (another thread or task, or
# its own body): it never ends as if the answer had come whole.
CLOSED_WHILE_READ = "the stream was closed while it was being read"
_closing: set[asyncio.Task[None]] = set()  # the closes a dropped loop scheduled, kept till they end


class _Facade:
    __slots__ = ("_completion", "_cut", "_looping", "_over", "_token")

    def __init__(self) -> None:
        self._token = CancelToken()
        self._completion: Completion | None = None
        self._over = False
        self._looping = 0  # loops running over it
        self._cut = False  # closed while a loop ran: that loop (and any later) raises

    @property
    def completion(self) -> Completion:
        """The answer, once the loop has run to its end."""
        if self._completion is None:
            raise RuntimeError("the stream has no completion: iterate it to its end first")
        return self._completion

    def _closed_from_elsewhere(self, running: bool) -> bool:
        """A close while the call runs in another thread or task (`running`): the call is
        cancelled, which ends that read with `Cancelled`, and the reader ends the call (True).
        Otherwise a loop that is running is marked cut, and the caller ends the call (False)."""
        if running:
            self._token.cancel(Cancelled(CLOSED_WHILE_READ))
            return True
        if self._looping and not self._over:
            self._cut = True
        return False

    def _raise_if_cut(self) -> None:
        """A loop over an ended stream meets its end, or `Cancelled` if the stream was cut."""
        if self._cut:
            raise Cancelled(CLOSED_WHILE_READ)


class EventStream(_Facade):
    """`with client.stream(req) as s: for event in s: ...`, then `s.completion`. `close()` may
    come from any thread: a loop it cuts short raises `Cancelled`."""

    __slots__ = ("_steps",)

    def __init__(self, steps: Callable[[CancelToken], Generator[Step, None, None]]) -> None:
        super().__init__()
        self._steps = steps(self._token)

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
            self._end()

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
            self._end()

    def __next__(self) -> ChatEvent:
        if self._over:
            self._raise_if_cut()
            raise StopIteration
        if self._token.cancelled:  # cancelled while the consumer ran its own code
            self._end()
            raise self._token.error()
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

    def close(self) -> None:
        """End the call now if it has not ended (idempotent); from another thread while the
        loop waits inside the call, by cancelling it (the loop raises `Cancelled`)."""
        running: bool = getattr(self._steps, "gi_running", False)  # inside the call, in another thread
        if not self._closed_from_elsewhere(running):
            self._end()

    def _end(self) -> None:
        self._over = True
        self._steps.close()


class AsyncEventStream(_Facade):
    """`async with client.stream(req) as s: async for event in s: ...`, then `s.completion`.
    Cancelling the task that iterates ends the call too (`asyncio.CancelledError`); so does
    leaving the loop early (`break`, an exception): no more events, and the call closed on the
    loop's next turn (awaited by `aclose()` and the `async with`). `aclose()` from another task:
    a loop it cuts short raises `Cancelled`."""

    __slots__ = ("_closer", "_link", "_make", "_steps")

    def __init__(self, steps: Callable[[CancelToken], AsyncGenerator[Step, None]]) -> None:
        super().__init__()
        self._make = steps
        self._steps: AsyncGenerator[Step, None] | None = None
        self._link: TaskLink | None = None
        self._closer: asyncio.Task[None] | None = None  # the close a loop left early scheduled

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> _Loop:
        return _Loop(self)

    async def run(self, on_event: Callable[[ChatEvent], None]) -> Completion:
        """Every event to `on_event`, then the completion: `chat`'s loop, with no loop object
        of its own on the way to each event. Left by an exception, it closes the call."""
        self._looping += 1
        task = asyncio.current_task()  # a coroutine runs in one task: looked up once
        try:
            while True:
                try:
                    event = await self._next(task)
                except StopAsyncIteration:
                    return self.completion
                emit(on_event, event)
        finally:
            self._looping -= 1
            await self._end()

    def __anext__(self) -> Coroutine[Any, Any, ChatEvent]:
        return self._next(None)

    async def _next(self, task: asyncio.Task[Any] | None) -> ChatEvent:
        """The next event, in `task` (None: the one running, looked up)."""
        if self._over:
            self._raise_if_cut()
            raise StopAsyncIteration
        steps, link = self._steps, self._link
        if steps is None or link is None:
            steps = self._steps = self._make(self._token)
            link = self._link = TaskLink(self._token)
        if self._token.cancelled:  # cancelled while the consumer ran its own code
            await self._end()
            raise self._token.error()
        link.enter(task)
        try:
            step = await steps.__anext__()
        except asyncio.CancelledError as cancelled:
            await self._end()
            raise link.error(cancelled) from None
        except BaseException:
            await link.absorb()
            await self._end()
            raise
        if link.poked:  # the cancel came as the step was made: it is not handed out
            await link.absorb()
            await self._end()
            raise self._token.error()
        link.leave()
        if isinstance(step, Completion):
            self._completion = step
            await self._end()
            raise StopAsyncIteration
        return step

    async def aclose(self) -> None:
        """End the call now if it has not ended (idempotent); from another task while a loop
        waits inside the call, by cancelling it (that loop raises `Cancelled`)."""
        if self._closer is not None:
            await asyncio.shield(self._closer)
            return
        running: bool = getattr(self._steps, "ag_running", False)  # inside the call, in another task
        if not self._over and not self._closed_from_elsewhere(running):
            await self._end()

    async def _end(self) -> None:
        if self._over and self._closer is None:
            return
        self._over = True
        if self._link is not None:
            self._link.close()
        if self._steps is not None:
            await self._steps.aclose()  # its `finally` closes, gives the slot back, forgets the call

    def _left(self) -> None:
        """A loop over it was left before the end: no more events, and the call ended on the
        loop's next turn (the blocking flavour's loop ends it at once, which asyncio cannot)."""
        self._looping -= 1
        if self._over:
            return
        self._over = True
        if self._link is None:  # never started: nothing to close
            return
        loop = self._link.loop
        with contextlib.suppress(RuntimeError):  # the loop is closed: the generator's finalizer ends it
            if _running_loop() is loop:
                self._close_later()
            else:  # dropped in another thread (a collected cycle): scheduled on the call's loop
                loop.call_soon_threadsafe(self._close_later)

    def _close_later(self) -> None:
        closer = self._link.loop.create_task(self._end()) if self._link is not None else None
        if closer is not None:
            self._closer = closer
            _closing.add(closer)
            closer.add_done_callback(_closing.discard)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Loop:
    """One `async for` over an `AsyncEventStream`: each step is the stream's own `__anext__`,
    handed out as it is (no coroutine of its own on the way to each event). Dropped before the
    stream ended (a `break`, an exception), it ends the call, as the blocking flavour's loop does."""

    __slots__ = ("_stream",)

    def __init__(self, stream: AsyncEventStream) -> None:
        self._stream = stream
        stream._looping += 1

    def __aiter__(self) -> _Loop:
        return self

    def __anext__(self) -> Coroutine[Any, Any, ChatEvent]:
        return self._stream._next(None)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stream._left()  # at the stream's end, it only counts the loop out
