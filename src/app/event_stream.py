"""Driving a chat's steps: with a callback (`drive`) or as an iterator (`EventStream`).

A call is a generator of `ChatEvent`s that returns the `Completion` (`ChatSteps`): it does its
blocking I/O inside `next()`, in the caller's thread, and starts no thread. Closing it (`close()`,
or leaving a `for` loop or `with` block early) runs its cleanup at once: the connection is closed,
which cancels the generation on the server, and the slot gate is released.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from types import TracebackType

from domain.completion import Completion
from domain.events import ChatEvent

__all__ = ["ChatSteps", "EventStream", "drive"]

ChatSteps = Generator[ChatEvent, None, Completion]


def drive(steps: ChatSteps, on_event: Callable[[ChatEvent], None]) -> Completion:
    """Run `steps` to its end, handing each event to `on_event`; if `on_event` raises, the call
    is closed and the exception propagates."""
    send = steps.send
    try:
        while True:
            on_event(send(None))
    except StopIteration as done:
        completion: Completion = done.value
        return completion
    finally:
        steps.close()


class EventStream:
    """`with client.stream(req) as s: for event in s: ...`, then `s.completion`.

    Iterate it once. Leaving the loop or the `with` block before the end (a `break`, an
    exception) cancels the call and closes its connection at once; an `InferError` of the call
    is raised from the loop."""

    __slots__ = ("_completion", "_steps")

    def __init__(self, steps: ChatSteps) -> None:
        self._steps = steps
        self._completion: Completion | None = None

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[ChatEvent]:
        send = self._steps.send
        try:
            while True:
                yield send(None)
        except StopIteration as done:
            self._completion = done.value
        finally:
            self._steps.close()

    @property
    def completion(self) -> Completion:
        """The answer, once the loop has run to its end."""
        if self._completion is None:
            raise RuntimeError("the stream has no completion: iterate it to its end first")
        return self._completion

    def close(self) -> None:
        """End the call now if it has not ended (idempotent)."""
        self._steps.close()
