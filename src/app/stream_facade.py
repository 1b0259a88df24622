"""What the two flavours' event streams share (`app.event_stream` is where they are used from):
the step type, the check and the call of a caller's `on_event`, and the facade's state (the
call's token, its completion, and how a loop over a stream closed from elsewhere ends)."""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable
from typing import NoReturn

from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import Cancelled, RequestError
from domain.events import ChatEvent, Content, Reasoning, Retrying

__all__ = [
    "CLOSED_WHILE_READ",
    "ONE_READER",
    "Facade",
    "OneReader",
    "Step",
    "check_sink",
    "emit",
    "weakly",
]

Step = ChatEvent | Completion


def check_sink(on_event: object) -> None:
    """A call's `on_event` is called with every event and nothing awaits what it returns: one
    that cannot be called, or an `async def` one (whose events would be lost), is a
    `RequestError` before anything is sent."""
    if not callable(on_event):
        raise RequestError(f"on_event must be callable, not {type(on_event).__name__}")
    kind: type = type(on_event)
    # A function's or a method's own `__call__` is never async: only the callable is looked at.
    for f in (on_event,) if kind in _PLAIN_CALLABLES else (on_event, kind.__call__):
        if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f):
            raise RequestError(_AWAITABLE_SINK)


_PLAIN_CALLABLES: frozenset[type] = frozenset(
    (types.FunctionType, types.MethodType, types.BuiltinFunctionType)
)


_AWAITABLE_SINK = (
    "on_event must be a plain function:"
    " it is called with each event and nothing awaits what it returns"
)


def emit(on_event: Callable[[ChatEvent], object], event: ChatEvent) -> None:
    """Hand `event` to the caller's callback. A `StopIteration` it raises would read as the end
    of the call's steps: it is an error of the callback's; so is an awaitable it returns (the
    event would be lost), closed unawaited: a `TypeError`, as the callback's own errors end the
    call (the request was sent: it is no `RequestError`)."""
    try:
        returned = on_event(event)
    except StopIteration as exc:
        raise RuntimeError(f"on_event raised StopIteration on {type(event).__name__}") from exc
    if returned is not None and (inspect.isawaitable(returned) or inspect.isasyncgen(returned)):
        close = getattr(returned, "close", None)
        if close is not None and not inspect.isasyncgen(returned):
            close()
        raise TypeError(
            f"{_AWAITABLE_SINK}; it returned {type(returned).__name__} for {type(event).__name__}"
        )


# Said by a loop whose stream was closed from elsewhere while it ran (another thread or task, or
# its own body): it never ends as if the answer had come whole.
CLOSED_WHILE_READ = "the stream was closed before it was read to its end"
# Said to a second loop over a stream, or a step while another thread or task is inside one.
ONE_READER = "the stream is being read by another thread or task: one loop reads a stream"


class OneReader(RuntimeError):
    """A second reader of a stream, refused: it touches nothing, and the first reads on."""

    def __init__(self) -> None:
        super().__init__(ONE_READER)


def weakly(method: Callable[[], None]) -> Callable[[], None]:
    """`method`, called through a weak reference to its object: a token's wake-up that never
    keeps a stream dropped unclosed alive (its call's generator, collected, ends the call)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    return call


class Facade:
    """What both flavours' streams share: the call's token, its completion, how a loop over a
    stream closed from elsewhere ends, and the answer's text as far as the events showed it,
    which a `Cancelled` out of the stream carries (`Cancelled.content`, `.reasoning`)."""

    __slots__ = (
        "__weakref__",
        "_completion",
        "_cut",
        "_looping",
        "_over",
        "_said",
        "_thought",
        "_token",
    )

    def __init__(self) -> None:
        self._token = CancelToken()
        self._completion: Completion | None = None
        self._over = False
        self._looping = 0  # loops running over it
        self._cut = False  # closed while a loop ran: that loop (and any later) raises
        # UTF-8 in one growing buffer each, as the assembler keeps it: never an object per event.
        self._said = bytearray()
        self._thought = bytearray()

    def _saw(self, event: ChatEvent) -> None:
        """Note what an event handed out brought to the answer; a re-send starts it over."""
        if type(event) is Content:
            self._said += event.text.encode()
        elif type(event) is Reasoning:
            self._thought += event.text.encode()
        elif type(event) is Retrying and event.resend:
            self._said.clear()
            self._thought.clear()

    def _carrying(self, error: Cancelled) -> Cancelled:
        """The `Cancelled` a step raises, carrying the answer as far as the events showed it."""
        if not self._said and not self._thought:
            return error  # its `content` and `reasoning` are empty already
        return error.carrying(self._said.decode(), self._thought.decode())

    def _raise_carrying(self, error: Cancelled) -> NoReturn:
        """Raise `error` as it is when nothing was said, else its copy carrying the answer so far
        (chained as the original was), for both flavours' steps."""
        carried = self._carrying(error)
        if carried is error:
            raise error
        raise carried from error.__cause__

    @property
    def completion(self) -> Completion:
        """The answer, once the loop has run to its end."""
        if self._completion is None:
            raise RuntimeError("the stream has no completion: iterate it to its end first")
        return self._completion

    def _closed_from_elsewhere(self, running: bool) -> bool:
        """A close while the call runs in another thread or task (`running`): the call is
        cancelled, which ends that read with `Cancelled`, and the reader ends the call (True).
        Otherwise a stream not yet ended is marked cut, so that a loop over it (under way, or
        any later one, in any thread or task) raises `Cancelled`, and the caller ends the call
        (False)."""
        if running:
            self._token.cancel(Cancelled(CLOSED_WHILE_READ))
            return True
        if not self._over:
            self._cut = True
        return False

    def _raise_if_cut(self) -> None:
        """A loop over an ended stream meets its end; `Cancelled` if the stream was cut, or the
        token's error if the call was cancelled (and so ended) before its completion."""
        if self._completion is None and self._token.cancelled:
            raise self._token.error()
        if self._cut:
            raise Cancelled(CLOSED_WHILE_READ)
