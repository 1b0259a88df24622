"""The asyncio flavour of a call's events as an iterator (`app.event_stream` says what both do):
`AsyncEventStream` awaits the call's steps and ties its `CancelToken` to the task (`TaskLink`)
while the task waits inside the call; a cancel that comes while no step runs ends the call in a
task of its own on its loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Coroutine
from types import TracebackType
from typing import Any

from app.calls import TaskLink
from app.stream_facade import Facade, OneReader, Step, emit, weakly
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import Cancelled
from domain.events import ChatEvent

__all__ = ["AsyncEventStream"]

_closing: set[asyncio.Task[None]] = set()  # the closes a dropped loop scheduled, kept till they end


class AsyncEventStream(Facade):
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
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> _Loop:
        return _Loop(self)

    async def run(self, on_event: Callable[[ChatEvent], None]) -> Completion:
        """Every event to `on_event`, then the completion: `chat`'s loop. Left by an exception,
        it has closed the call when it returns (awaited, not left to the loop's next turn)."""
        loop = _Loop(self)
        try:
            async for event in loop:
                emit(on_event, event)
        finally:
            await loop.finish()
        return self.completion

    def __anext__(self) -> Coroutine[Any, Any, ChatEvent]:
        return self._next(None)

    async def _next(self, task: asyncio.Task[Any] | None, loop: _Loop | None = None) -> ChatEvent:
        """The next event, in `task` (None: the one running, looked up). `loop`, the `async for`
        that asked for it, is held till the step is made: one dropped meanwhile (`await
        anext(aiter(stream))`) ends the call after its event, not before it."""
        try:
            if self._over:
                if self._closer is not None:
                    await asyncio.shield(self._closer)  # an end under way: awaited, then said
                self._raise_if_cut()
                raise StopAsyncIteration
            steps, link = self._steps, self._link
            if steps is None or link is None:
                steps = self._steps = self._make(self._token)
                link = self._link = TaskLink(self._token, idle=weakly(self._end_idle))
            elif steps.ag_running:  # type: ignore[attr-defined]  # another task is inside a step
                raise OneReader()
            if self._token.cancelled:  # cancelled while the consumer ran its own code
                await self._end()
                raise self._token.error()
            link.enter(task)
            try:
                step = await steps.__anext__()
            except asyncio.CancelledError as cancelled:
                await self._end()
                raise link.error(cancelled) from None
            except StopAsyncIteration:  # closed by the end of the event loop it began on
                await self._end()
                raise RuntimeError(
                    "the call ended without a completion:"
                    " the end of the event loop it began on closed it"
                ) from None
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
            self._saw(step)
            return step
        except Cancelled as error:
            self._raise_carrying(error)

    async def aclose(self) -> None:
        """End the call now if it has not ended (idempotent), in a task of its own that every
        later step and close awaits; from another task while a loop waits inside the call, by
        cancelling it (that loop raises `Cancelled`)."""
        if self._closer is not None:
            await asyncio.shield(self._closer)
            return
        link = self._link
        if self._over or self._closed_from_elsewhere(_stepping(self._steps)):
            return
        if link is None or _running_loop() is not link.loop:
            # Never started, or another loop's call.
            await self._end()
            return
        self._over = True
        self._close_later()
        if self._closer is not None:
            await asyncio.shield(self._closer)

    async def _end(self) -> None:
        closer = self._closer
        if closer is not None and closer is not asyncio.current_task():
            await asyncio.shield(closer)  # the end under way in a task of its own
            return
        if self._over and closer is None:
            return
        if _stepping(self._steps):
            return  # another task's step runs (this loop was refused): that loop reads on
        self._over = True
        if self._link is not None:
            self._link.close()
        if self._steps is not None:
            await (
                self._steps.aclose()
            )  # its `finally` closes, gives the slot back, forgets the call

    def _end_idle(self) -> None:
        """The call's token fired while no step runs, its consumer in its own code: the call is
        ended now, in a task of its own on its loop (its generation stopped, its connections
        closed, its slot given back), not at the next step, which awaits that end and raises the
        token's error."""
        if not self._over:
            self._over = True
            self._close_later()

    def _left(self) -> None:
        """A loop over it was left before the end: no more events, and the call ended on the
        loop's next turn (the blocking flavour's loop ends it at once, which asyncio cannot)."""
        self._looping -= 1
        if self._over or _stepping(self._steps):
            return  # ended, or read by another task (this loop was refused): nothing to end
        self._over = True
        if self._link is None:  # never started: nothing to close
            return
        loop = self._link.loop
        with contextlib.suppress(
            RuntimeError
        ):  # the loop is closed: the generator's finalizer ends it
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


def _stepping(steps: AsyncGenerator[Step, None] | None) -> bool:
    """Whether a task is inside a step of the call (another one, seen from outside it)."""
    return bool(getattr(steps, "ag_running", False))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Loop:
    """One `async for` over an `AsyncEventStream`: each step is the stream's own `__anext__`,
    handed out as it is (no coroutine of its own on the way to each event). Dropped before the
    stream ended (a `break`, an exception), it ends the call, as the blocking flavour's loop does;
    dropped before it asked for a step, it ends nothing, as a generator never started."""

    __slots__ = ("_asked", "_done", "_refused", "_stream")

    def __init__(self, stream: AsyncEventStream) -> None:
        self._stream = stream
        # A loop dropped before it asked for a step ends nothing (as a generator).
        self._asked = False
        self._done = False  # finished by `run`, which awaited the end
        self._refused = stream._looping > 0  # a second loop: it touches nothing
        if not self._refused:
            stream._looping += 1

    def __aiter__(self) -> _Loop:
        return self

    def __anext__(self) -> Coroutine[Any, Any, ChatEvent]:
        if self._refused:
            raise OneReader()
        self._asked = True
        return self._stream._next(None, self)

    async def finish(self) -> None:
        """The loop is over (`run`'s): counted out, and the call ended, awaited; then its
        `__del__` does nothing."""
        if self._refused or self._done:
            return
        self._done = True
        self._stream._looping -= 1
        await self._stream._end()  # ended already at the completion; another task's step: nothing

    def __del__(self) -> None:
        if self._refused or self._done:
            return
        if not self._asked:
            self._stream._looping -= 1
            return
        with contextlib.suppress(Exception):
            self._stream._left()  # at the stream's end, it only counts the loop out
