"""The sync `Client`'s surface over an `AsyncClient`, so that one contract suite runs over both.

    client = AsyncBridge(container.async_client())
    client.chat(req, on_event, cancel=token)      # as `Client.chat`, awaited underneath

Every call runs to its end on an event loop of its own (`asyncio.Runner`) in the calling thread,
so a test's `on_event` runs in the test's thread, a call blocks its caller as the sync client's
does, and calls made from several threads at once run on as many loops at once (the async client
may be shared by loops on several threads). A stream keeps its loop from `__enter__` to
`__exit__`: each step of the iterator is one `run` of it, and the test's code between steps runs
while no loop runs.

Cancellation is the async client's own: the `CancelToken` is handed on as it is (the async client
turns its wake-up, from any thread, into a cancel of the awaiting task, takes that cancellation
back and raises `Cancelled` or `ClientClosed`), so these tests check that mapping too. Nothing
here catches or translates an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from app.async_client import AsyncClient, AsyncEventStream
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.events import ChatEvent
from domain.gate import SlotGate
from domain.llama_api import Props, SlotInfo, Token
from domain.messages import ChatRequest
from domain.prompt_cache import Checkpoint

__all__ = ["AsyncBridge", "BridgedStream", "run"]

T = TypeVar("T")
EventSink = Callable[[ChatEvent], None]

_END = object()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`coro` to its end on a fresh event loop in this thread."""
    with asyncio.Runner() as runner:
        return runner.run(coro)


class AsyncBridge:
    """`chat`, `chat_with_retry`, `stream`, `stream_with_retry`, `render`, `props`, `slots`,
    `tokenize`, `close` and `with`, each blocking until the awaited call has ended."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"AsyncBridge({self.client!r})"

    def chat(
        self, req: ChatRequest, on_event: EventSink | None = None, cancel: CancelToken | None = None
    ) -> Completion:
        return run(self.client.chat(req, on_event, cancel=cancel))

    def chat_with_retry(
        self, req: ChatRequest, on_event: EventSink | None = None, cancel: CancelToken | None = None
    ) -> Completion:
        return run(self.client.chat_with_retry(req, on_event, cancel=cancel))

    def stream(self, req: ChatRequest, cancel: CancelToken | None = None) -> BridgedStream:
        return BridgedStream(self.client.stream(req, cancel=cancel))

    def stream_with_retry(self, req: ChatRequest, cancel: CancelToken | None = None) -> BridgedStream:
        return BridgedStream(self.client.stream_with_retry(req, cancel=cancel))

    def render(self, req: ChatRequest, cancel: CancelToken | None = None) -> bytes:
        return run(self.client.render(req, cancel))

    def props(self, cancel: CancelToken | None = None, *, load: bool = False) -> Props:
        return run(self.client.props(cancel, load=load))

    def slots(self, cancel: CancelToken | None = None) -> list[SlotInfo]:
        return run(self.client.slots(cancel))

    def tokenize(self, text: str, cancel: CancelToken | None = None) -> list[Token]:
        return run(self.client.tokenize(text, cancel))

    def save_slot(self, slot: int, cancel: CancelToken | None = None) -> Checkpoint | None:
        return run(self.client.save_slot(slot, cancel))

    def restore_slot(self, slot: int, cancel: CancelToken | None = None) -> int:
        return run(self.client.restore_slot(slot, cancel))

    def close(self) -> None:
        run(self.client.aclose())

    def __enter__(self) -> AsyncBridge:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    @property
    def _gate(self) -> SlotGate:
        """The slot gate underneath (the tests that peek at the sync client's `_gate` read it)."""
        return self.client._gate


class BridgedStream:
    """`with bridge.stream(req) as s: for e in s: ...`, then `s.completion`, over an
    `AsyncEventStream` on a loop of its own. Leaving the loop early (the iterator is dropped or
    closed) or the `with` block ends the call at once, as `AsyncEventStream.aclose` does."""

    def __init__(self, stream: AsyncEventStream) -> None:
        self._stream = stream
        self._runner = asyncio.Runner()
        self._closed = False

    def __enter__(self) -> BridgedStream:
        self._runner.run(self._stream.__aenter__())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._closed:
            return
        try:
            self._runner.run(self._stream.__aexit__(kind, error, trace))
        finally:
            self._closed = True
            self._runner.close()

    def __iter__(self) -> Iterator[ChatEvent]:
        try:
            while True:
                event = self._runner.run(self._next())
                if event is _END:
                    return
                yield event
        finally:
            self.close()

    async def _next(self) -> Any:
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            return _END

    @property
    def completion(self) -> Completion:
        return self._stream.completion

    def close(self) -> None:
        """End the call now if it has not ended (idempotent); the loop stays until `__exit__`."""
        if not self._closed:
            self._runner.run(self._stream.aclose())
