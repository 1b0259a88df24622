"""The calls a client has in flight, in either flavour: the paired primitive that `close()` and
`aclose()` act on, and the scope of one call.

Every call (a chat, a stream, `props()`, `slots()`, `tokenize()`) runs under a `CancelToken` of
its own, registered here while it runs; the caller's token, when given, is linked to it. Then:

- `close_all()` marks the client closed and cancels every registered token in two phases (all
  marked first, then their wake-ups run, `domain.cancel.cancel_all`): no queued call can be
  handed a slot by a call cancelled before it and still send its request.
- A call begun after that raises `ClientClosed` without touching the server.
- `wait_idle(timeout)` returns once every call has ended, or after `timeout`.

How a cancelled token reaches the I/O is the flavour's: the blocking primitives are woken by it
(the exchange is shut down, the gate and the clock wake up), and the call raises the token's
error in place of what the broken I/O raised (`Calls.scope`). On asyncio the token's wake-up
also cancels the task while it waits inside the call (`TaskLink`), and that cancellation is taken
back (`Task.uncancel`) and replaced by the token's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Generator, Iterator
from typing import Any, ParamSpec, TypeVar

from domain.cancel import CancelToken, cancel_all
from domain.errors import ClientClosed, InferError, RequestError
from domain.limits import STOP_WAIT_S

__all__ = [
    "CLOSE_WAIT_S",
    "CLOSING",
    "AsyncCalls",
    "AsyncInner",
    "AsyncUncut",
    "Calls",
    "Inner",
    "StopBudget",
    "TaskLink",
    "Uncut",
]

T = TypeVar("T")
P = ParamSpec("P")

# Silent unless the daemon configures logging: the library's loggers never print by themselves.
logging.getLogger("inferpath").addHandler(logging.NullHandler())

# `close()` waits this long for the calls it cancelled to return.
CLOSE_WAIT_S = 0.3


class StopBudget:
    """The one `STOP_WAIT_S` a close gives every stop made in its own thread while it cancels
    (the blocking flavour ends a stream whose consumer is between two steps there and then, one
    after another): each stop takes what it spent from `left_s`, so that the close still
    returns within `CLOSE_WAIT_S` however many there are."""

    __slots__ = ("later", "left_s")

    def __init__(self) -> None:
        self.left_s = STOP_WAIT_S
        self.later: list[Callable[[], None]] = []  # those ends, made once every wake-up has run

    def spent(self, seconds: float) -> None:
        self.left_s -= seconds


# The budget of the close under way in this thread (or the task its wake-ups scheduled), if any.
CLOSING: contextvars.ContextVar[StopBudget | None] = contextvars.ContextVar(
    "inferpath_closing", default=None
)


class _Registry:
    __slots__ = ("_closed", "_links", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[CancelToken, Callable[[], None]] = {}
        self._closed = False

    def begin(self, token: CancelToken, cancel: CancelToken | None) -> None:
        """Register a call's token (linked to the caller's `cancel`); `ClientClosed` if closed,
        `RequestError` if `cancel` is not a `CancelToken`."""
        if cancel is not None and not isinstance(cancel, CancelToken):
            raise RequestError(f"cancel must be a CancelToken or None, not {type(cancel).__name__}")
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            self._links[token] = _nothing
        if cancel is not None:
            unlink = cancel.on_cancel(lambda: token.cancel(cancel.error()))
            with self._lock:
                if token in self._links:
                    self._links[token] = unlink
                    return
            unlink()

    def end(self, token: CancelToken) -> None:
        with self._lock:
            unlink = self._links.pop(token, None)
            idle = not self._links
        if unlink is not None:
            unlink()
        if idle:
            self._idle()

    def close_all(self) -> bool:
        """Refuse new calls and cancel every call in flight; whether there were any."""
        with self._lock:
            self._closed = True
            tokens = list(self._links)
        budget = StopBudget()
        closing = CLOSING.set(budget)
        try:
            cancel_all(tokens, ClientClosed("the client was closed while the call ran"))
            # After every wake-up: no call waiting inside I/O waits for them.
            for end in budget.later:
                with contextlib.suppress(Exception):
                    end()
        finally:
            CLOSING.reset(closing)
        return bool(tokens)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._links)

    def _idle(self) -> None:
        raise NotImplementedError


class Calls(_Registry):
    __slots__ = ("_changed",)

    def __init__(self) -> None:
        super().__init__()
        self._changed = threading.Condition(threading.Lock())

    def wait_idle(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: not self.busy, timeout)

    @contextlib.contextmanager
    def scope(self, cancel: CancelToken | None) -> Iterator[CancelToken]:
        """One call that is not a stream: its token, registered while the block runs; an
        `InferError` of I/O the cancel broke becomes the token's error."""
        token = CancelToken()
        self.begin(token, cancel)
        try:
            yield token
        except InferError as exc:
            if token.cancelled:
                raise token.error() from exc
            raise
        finally:
            self.end(token)

    def _idle(self) -> None:
        with self._changed:
            self._changed.notify_all()


class AsyncCalls(_Registry):
    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def wait_idle(self, timeout: float) -> None:
        idle = asyncio.Event()
        with self._lock:
            if not self._links:
                return
            self._waiters.append((asyncio.get_running_loop(), idle))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await idle.wait()

    @contextlib.asynccontextmanager
    async def scope(self, cancel: CancelToken | None) -> AsyncIterator[CancelToken]:
        """`Calls.scope` on asyncio: the token's wake-up also cancels the task, and that
        cancellation comes out as the token's error."""
        token = CancelToken()
        self.begin(token, cancel)
        link = TaskLink(token)
        link.enter()
        try:
            yield token
        except asyncio.CancelledError as cancelled:
            raise link.error(cancelled) from None
        except InferError as exc:
            await link.absorb()
            if token.cancelled:
                raise token.error() from exc
            raise
        finally:
            link.close()
            self.end(token)

    def _idle(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, idle in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(idle.set)


class Uncut:
    """A bounded step that a cancel must not cut short (the stop of a generation): in the
    blocking flavour a cancel wakes only the I/O it is handed, so the step has already run."""

    @staticmethod
    def run(step: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return step(*args, **kwargs)


class AsyncUncut:
    """`Uncut` on asyncio: the step runs to its end even if the task is cancelled meanwhile
    (by a `TaskLink`, a timeout, `task.cancel()`), and that cancellation is raised after it, as
    the blocking flavour would end. The step must end by itself within a bound, and may run
    twice: the end of `asyncio.run` cancels every task there is, the step's own among them,
    so a step cancelled itself is made once more, in a task the loop's end does not cancel
    (it awaits those it cancelled, this one among them, before it closes)."""

    @staticmethod
    async def run(
        step: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        task = asyncio.ensure_future(step(*args, **kwargs))
        cancelled: asyncio.CancelledError | None = None
        again = True
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError as exc:
                cancelled = exc
                if task.cancelled():  # the step itself was cancelled: the loop is ending
                    if not again:
                        raise
                    again = False
                    task = asyncio.ensure_future(step(*args, **kwargs))
        result = task.result()
        if cancelled is not None:
            raise cancelled
        return result


class Inner:
    """A call's inner steps, closed when the call ends before them."""

    @staticmethod
    def close(steps: Generator[Any, None, None]) -> None:
        steps.close()


class AsyncInner:
    """`Inner` on asyncio, where the loop's end (`shutdown_asyncgens`, at the end of
    `asyncio.run`) closes every async generator there is at once, in no set order: inner steps
    are then left to that close, whether it has begun them or not (closed twice, one of the two
    closes fails, and the loop logs it as an error)."""

    @staticmethod
    async def close(steps: AsyncGenerator[Any, None]) -> None:
        running = steps.ag_running  # type: ignore[attr-defined]
        if running or getattr(asyncio.get_running_loop(), "_asyncgens_shutdown_called", False):
            return
        await steps.aclose()


class TaskLink:
    """One call's token tied to the task that runs it: the token's wake-up (from any thread)
    cancels the task, but only while it waits inside the call (`enter` … `leave`), so the
    consumer's own awaits are never interrupted; `poked` says a cancellation is ours to take
    back."""

    __slots__ = ("_idle", "_unlink", "inside", "loop", "poked", "task", "token")

    def __init__(self, token: CancelToken, idle: Callable[[], None] | None = None) -> None:
        self.token = token
        self._idle = idle  # run on the loop for a wake-up while the task is outside the call
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task[object] | None = None
        self.inside = False
        self.poked = False
        self._unlink = token.on_cancel(self._on_cancel)

    def enter(self, task: asyncio.Task[object] | None = None) -> None:
        """The call's waits begin, in `task` (looked up when not given: a loop that runs in
        one task, as `run`'s does, looks it up once, not at every step)."""
        self.task = task if task is not None else asyncio.current_task(self.loop)
        self.inside = True

    def leave(self) -> None:
        self.inside = False

    def close(self) -> None:
        self.inside = False
        self._unlink()

    def error(self, cancelled: asyncio.CancelledError) -> BaseException:
        """What a `CancelledError` out of the call becomes: the token's error if the
        cancellation was ours alone, else the `CancelledError` itself."""
        self.inside = False
        if self.poked:
            self.poked = False
            if self.task is not None and self.task.uncancel() == 0:
                return self.token.error()
        return cancelled

    async def absorb(self) -> None:
        """After the call ended another way while our cancellation was pending on the task (its
        wait had already finished): take it, so it never reaches the consumer's next await."""
        self.inside = False
        if not self.poked:
            return
        self.poked = False
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)
        if self.task is not None and self.task.uncancel() > 0:
            raise asyncio.CancelledError

    def _on_cancel(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the call is long over
            self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self.inside:
            if not self.poked and self.task is not None:
                self.poked = True
                self.task.cancel()
        elif self._idle is not None:
            self._idle()


def _nothing() -> None:
    return None
