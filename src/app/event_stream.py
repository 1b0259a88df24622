"""A call's events as an iterator, in either flavour: the thin facade over the one call source.

A call is a generator of steps, its `ChatEvent`s and then its `Completion` (`app._async.call`
and its generated blocking twin). `EventStream` iterates it in the caller's thread and starts no
thread; `AsyncEventStream` awaits it and ties the call's `CancelToken` to the task (`TaskLink`)
while the task waits inside the call. Both:

- are iterated once: the events, then `.completion`; a finished stream iterated again yields
  nothing and keeps its `.completion`;
- end the call at once when left early (a `break`, an exception, `close()`/`aclose()`, leaving the
  `with` block): its connection is closed, which stops the generation, and the slot given back;
- raise the call's `InferError` from the loop, and a cancelled token's `Cancelled` (or
  `ClientClosed`) at the next step if it was cancelled while the consumer ran its own code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from types import TracebackType

from app.calls import TaskLink
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import RequestError
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


class _Facade:
    __slots__ = ("_completion", "_over", "_token")

    def __init__(self) -> None:
        self._token = CancelToken()
        self._completion: Completion | None = None
        self._over = False

    @property
    def completion(self) -> Completion:
        """The answer, once the loop has run to its end."""
        if self._completion is None:
            raise RuntimeError("the stream has no completion: iterate it to its end first")
        return self._completion


class EventStream(_Facade):
    """`with client.stream(req) as s: for event in s: ...`, then `s.completion`."""

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
        try:
            while True:
                try:
                    event = self.__next__()
                except StopIteration:
                    return
                yield event
        finally:
            self.close()

    def __next__(self) -> ChatEvent:
        if self._over:
            raise StopIteration
        if self._token.cancelled:  # cancelled while the consumer ran its own code
            self.close()
            raise self._token.error()
        try:
            step = next(self._steps)
        except StopIteration:  # pragma: no cover - the steps end with their Completion
            self.close()
            raise RuntimeError("the call ended without a completion") from None
        except BaseException:
            self.close()
            raise
        if isinstance(step, Completion):
            self._completion = step
            self.close()
            raise StopIteration
        return step

    def close(self) -> None:
        """End the call now if it has not ended (idempotent)."""
        self._over = True
        self._steps.close()


class AsyncEventStream(_Facade):
    """`async with client.stream(req) as s: async for event in s: ...`, then `s.completion`.
    Cancelling the task that iterates ends the call too (`asyncio.CancelledError`)."""

    __slots__ = ("_link", "_make", "_steps")

    def __init__(self, steps: Callable[[CancelToken], AsyncGenerator[Step, None]]) -> None:
        super().__init__()
        self._make = steps
        self._steps: AsyncGenerator[Step, None] | None = None
        self._link: TaskLink | None = None

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> ChatEvent:
        if self._over:
            raise StopAsyncIteration
        steps, link = self._steps, self._link
        if steps is None or link is None:
            steps = self._steps = self._make(self._token)
            link = self._link = TaskLink(self._token)
        if self._token.cancelled:  # cancelled while the consumer ran its own code
            await self.aclose()
            raise self._token.error()
        link.enter()
        try:
            step = await steps.__anext__()
        except asyncio.CancelledError as cancelled:
            await self.aclose()
            raise link.error(cancelled) from None
        except BaseException:
            await link.absorb()
            await self.aclose()
            raise
        if link.poked:  # the cancel came as the step was made: it is not handed out
            await link.absorb()
            await self.aclose()
            raise self._token.error()
        link.leave()
        if isinstance(step, Completion):
            self._completion = step
            await self.aclose()
            raise StopAsyncIteration
        return step

    async def aclose(self) -> None:
        """End the call now if it has not ended (idempotent)."""
        if self._over:
            return
        self._over = True
        if self._link is not None:
            self._link.close()
        if self._steps is not None:
            await self._steps.aclose()  # its `finally` closes, gives the slot back, forgets the call
