"""The llama client for asyncio: `app.client.Client`'s surface, awaited, on the same domain.

    client = Container(config=cfg).async_client()
    completion = await client.chat_with_retry(req, on_event=print)
    async with client.stream(req) as s:
        async for event in s: ...
    s.completion

The life of one request is the sync client's (see `app.client`): the same slot gate (one
`SlotGate`, shared with the container's sync client), `build_chat_body`, `FirstByteWait` with a
`/slots` poll each `poll_ms`, `ChatStream` with its liveness rule and thinking cap, the same
`RetryPolicy`, the same events, `Completion`, errors and bytes on the wire. Only the waiting is
different: every wait is an `await` on the event loop, and no thread is started.

Cancellation is asyncio's own. Cancelling the task that awaits `chat` (or iterates a stream) ends
the call in whatever phase it is (queued at the gate, waiting for the head, a `/slots` poll,
streaming, the `reasoning_end` call, a retry wait): the `finally` blocks close the connections
(the server sees the close) and give the slot back, and `asyncio.CancelledError` propagates.

A `CancelToken` (`cancel=`) and `aclose()` work as with the sync client and raise `Cancelled` or
`ClientClosed`: the token's wake-up (from any thread) asks the loop to cancel the task while it
waits inside the call, and that cancellation is taken back (`Task.uncancel`) and replaced by the
token's error. A token cancelled while a stream's consumer runs its own code is seen at the next
step, so the consumer's own awaits are never interrupted by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from types import TracebackType

from app.async_gate import AsyncSlotGate
from app.call_parts import control_limits, first_byte_wait, info_limits, log_done, not_a_stream, retrying, tokenize_body
from app.client import CLOSE_WAIT_S, EventSink
from domain.cancel import CancelToken
from domain.chat_stream import ChatStream, PostReasoningEnd
from domain.completion import Completion, Timings
from domain.errors import ClientClosed, HttpError, InferError
from domain.events import ChatEvent, Progress, Queued, Retrying, Waiting
from domain.fetch import error_body_async, fetch_async
from domain.gate import SlotGate
from domain.limits import ClientLimits
from domain.llama_api import (
    CHAT_PATH,
    CONTROL_PATH,
    PROPS_PATH,
    SLOTS_PATH,
    TOKENIZE_PATH,
    Props,
    SlotInfo,
    Token,
    control_refusal,
    parse_props,
    parse_slots,
    parse_tokens,
    with_model,
)
from domain.messages import ChatRequest
from domain.request import RequestSettings, build_chat_body, build_control_body, effective_max_tokens
from domain.retry import RetryPolicy
from ports import AsyncClock, AsyncExchange, AsyncSlotProbe, AsyncTransport, ResponseHead, TimedOut

__all__ = ["AsyncClient", "AsyncEventStream"]

log = logging.getLogger("inferpath.client")

Step = ChatEvent | Completion


class _Call:
    """One call's link to its task: `wake` (on the loop) cancels the task only while it waits
    inside the call (`inside`); `poked` says the task's cancellation is ours to take back."""

    __slots__ = ("inside", "loop", "poked", "task", "token", "unlink")

    def __init__(self, token: CancelToken, loop: asyncio.AbstractEventLoop) -> None:
        self.token = token
        self.loop = loop
        self.task: asyncio.Task[object] | None = None
        self.inside = False
        self.poked = False
        self.unlink: list[Callable[[], None]] = []

    def on_cancel(self) -> None:
        """From any thread, when the token is cancelled."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the call is long over
            self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self.inside and not self.poked and self.task is not None:
            self.poked = True
            self.task.cancel()

    def error(self, cancelled: asyncio.CancelledError) -> BaseException:
        """What a `CancelledError` out of the call becomes: the token's error if the
        cancellation was ours alone, else the `CancelledError` itself."""
        if self.poked:
            self.poked = False
            if self.task is not None and self.task.uncancel() == 0:
                return self.token.error()
        return cancelled


class AsyncClient:
    """What an asyncio daemon calls. Built by `app.container.Container` from a `Config` alone.
    May be shared by tasks (and by event loops on several threads); `aclose()` (or leaving
    `async with client:`) ends every call."""

    def __init__(
        self,
        *,
        transport: AsyncTransport,
        probe: AsyncSlotProbe,
        clock: AsyncClock,
        gate: SlotGate,
        retry_policy: RetryPolicy,
        request_settings: RequestSettings,
        limits: ClientLimits,
        total_slots: int | None,
    ) -> None:
        self._transport = transport
        self._probe = probe
        self._clock = clock
        self._gate = AsyncSlotGate(gate)
        self._retry = retry_policy
        self._settings = request_settings
        self._limits = limits
        self._total_slots = total_slots
        self._info = info_limits(limits)
        self._control = control_limits(limits)
        self._lock = threading.Lock()
        self._calls: set[_Call] = set()
        self._idle: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._closed = False
        self._last_timings: dict[int, Timings] = {}

    # -- the surface --------------------------------------------------------------------------

    async def chat(self, req: ChatRequest, on_event: EventSink, cancel: CancelToken | None = None) -> Completion:
        """One attempt: returns the final `Completion` or raises an `InferError`."""
        async with AsyncEventStream(self, req, cancel, retry=False) as stream:
            async for event in stream:
                on_event(event)
        return stream.completion

    async def chat_with_retry(
        self, req: ChatRequest, on_event: EventSink, cancel: CancelToken | None = None
    ) -> Completion:
        """`chat`, retried by the retry policy; every attempt sends the same bytes."""
        async with AsyncEventStream(self, req, cancel, retry=True) as stream:
            async for event in stream:
                on_event(event)
        return stream.completion

    def stream(self, req: ChatRequest, cancel: CancelToken | None = None) -> AsyncEventStream:
        """`chat` as an async iterator: `async with client.stream(req) as s: async for e in s:`."""
        return AsyncEventStream(self, req, cancel, retry=False)

    def stream_with_retry(self, req: ChatRequest, cancel: CancelToken | None = None) -> AsyncEventStream:
        """`chat_with_retry` as an async iterator of events."""
        return AsyncEventStream(self, req, cancel, retry=True)

    async def render(self, req: ChatRequest) -> bytes:
        """The exact request body `chat` sends for `req` (validated, deterministic)."""
        return build_chat_body(req, self._settings, total_slots=await self._slot_count())

    async def aclose(self) -> None:
        """End every call in flight or queued (`ClientClosed`), refuse new ones, and return once
        they have ended (waiting at most `CLOSE_WAIT_S`). Idempotent."""
        idle = asyncio.Event()
        with self._lock:
            self._closed = True
            calls = list(self._calls)
            if calls:
                self._idle.append((asyncio.get_running_loop(), idle))
        for call in calls:
            call.token.cancel(ClientClosed("the client was closed while the call ran"))
        if calls:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await idle.wait()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- one call: its bookkeeping ------------------------------------------------------------

    def _begin(self, call: _Call, cancel: CancelToken | None) -> None:
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed")
            self._calls.add(call)
        if cancel is not None:
            call.unlink.append(cancel.on_cancel(lambda: call.token.cancel(cancel.error())))
        call.unlink.append(call.token.on_cancel(call.on_cancel))

    def _end(self, call: _Call) -> None:
        for unlink in call.unlink:
            unlink()
        call.unlink.clear()
        with self._lock:
            self._calls.discard(call)
            waiters = self._idle if not self._calls else []
            if waiters:
                self._idle = []
        for loop, idle in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(idle.set)

    # -- one call: its steps ------------------------------------------------------------------

    async def _steps(
        self, req: ChatRequest, retry: bool, call: _Call, cancel: CancelToken | None
    ) -> AsyncGenerator[Step, None]:
        """The events of one call, then its `Completion`: attempts through the gate, retried.

        The call is registered with the client (for `aclose()`) while this runs, and forgotten in
        its `finally`, which runs however it ends: `aclose()`, an error, a cancellation, or a
        stream dropped without `aclose()` (the loop's async-generator finaliser closes it)."""
        self._begin(call, cancel)  # ClientClosed: nothing is sent
        try:
            call.token.raise_if_cancelled()  # a token cancelled before the call: nothing is sent
            gate = self._gate
            started = self._clock.now()
            body: bytes | None = None
            attempt = 1
            while True:
                try:
                    if body is None:
                        body = await self.render(req)
                    ticket = gate.enter(req.slot)
                    try:
                        ahead = ticket.ahead
                        while ahead:
                            log.debug("slot %d: queued, %d ahead", req.slot, ahead)
                            yield Queued(ahead)
                            ahead = await gate.wait(ticket)
                        call.token.raise_if_cancelled()
                        async with contextlib.aclosing(self._attempt(req, body)) as steps:
                            async for step in steps:
                                if isinstance(step, Completion):
                                    self._log_done(req.slot, step)
                                yield step
                        return
                    finally:
                        gate.leave(ticket)
                except InferError as error:
                    if not retry:
                        raise
                    retrying = self._retrying(req.slot, attempt, error, started)
                    attempt = retrying.attempt
                    yield retrying
                    await self._clock.sleep_async(retrying.after_ms / 1000.0)
        finally:
            self._end(call)

    def _retrying(self, slot: int, attempt: int, error: InferError, started: float) -> Retrying:
        """The event announcing the next attempt after `attempt` failed, or `error` raised."""
        event = retrying(log, self._retry, slot, attempt, error, (self._clock.now() - started) * 1000.0)
        if event is None:
            raise error
        return event

    async def _attempt(self, req: ChatRequest, body: bytes) -> AsyncGenerator[Step, None]:
        """One request: open + send, the head (with its polls), then the stream to its end."""
        limits = self._limits
        clock = self._clock
        exchange = await self._transport.open("POST", CHAT_PATH, body, timeout=limits.poll_ms / 1000.0)
        try:
            head: ResponseHead | None = None
            async with contextlib.aclosing(self._await_head(exchange, req.slot)) as waits:
                async for item in waits:
                    if isinstance(item, ResponseHead):
                        head = item
                    else:
                        yield item
            assert head is not None
            await self._check_head(exchange, head)
            read = exchange.read
            stream = ChatStream(limits.stream, effective_max_tokens(req, self._settings), clock.now())
            started = clock.now()
            first = True
            while True:
                data = await read(stream.timeout(clock.now()))
                if isinstance(data, TimedOut):
                    stream.silence(clock.now())
                    continue
                for step in stream.feed(data, clock.now()):
                    if isinstance(step, PostReasoningEnd):
                        refusal = await self._post_reasoning_end(step.completion_id)
                        log.debug("reasoning_end posted: %s", "accepted" if refusal is None else refusal)
                        yield stream.control_answered(refusal)
                    elif isinstance(step, InferError):
                        raise step
                    else:
                        if first and not isinstance(step, Progress | Completion):
                            first = False
                            log.debug("first token %.0f ms after the head", (clock.now() - started) * 1000)
                        yield step
                        if isinstance(step, Completion):
                            return
        finally:
            exchange.close()

    async def _await_head(self, exchange: AsyncExchange, slot: int) -> AsyncGenerator[Waiting | ResponseHead, None]:
        """Wait for the response head, asking `/slots` each `poll_ms`: `Waiting` events, then
        the head."""
        limits = self._limits
        clock = self._clock
        sent = clock.now()
        wait = first_byte_wait(limits, sent, slot)
        while True:
            head = await exchange.head(wait.timeout(clock.now()))
            if not isinstance(head, TimedOut):
                log.debug("slot %d: response head %d after %.0f ms", slot, head.status, (clock.now() - sent) * 1000)
                yield head
                return
            decision = wait.on_poll(clock.now(), await self._probe.state(slot))
            yield decision.event
            if decision.error is not None:
                raise decision.error

    async def _check_head(self, exchange: AsyncExchange, head: ResponseHead) -> None:
        limits = self._limits
        if head.status != 200:
            deadline = self._clock.now() + limits.stream.liveness_ms / 1000.0
            kept = await error_body_async(exchange, self._clock, deadline, limits.error_body_bytes)
            raise HttpError(head.status, kept, limits.error_body_bytes)
        error = not_a_stream(head)
        if error is not None:
            raise error

    async def _post_reasoning_end(self, completion_id: str) -> str | None:
        """Ask the server to end the thinking block on a second connection: None when it answers
        `{"success": true}`, else what went wrong."""
        try:
            body = build_control_body(completion_id, self._settings.model)
            answer = await fetch_async(self._transport, self._clock, "POST", CONTROL_PATH, body, self._control)
            return control_refusal(answer)
        except InferError as exc:
            return f"{type(exc).__name__}: {exc}"

    def _log_done(self, slot: int, completion: Completion) -> None:
        log_done(log, self._last_timings, slot, completion)

    # -- info ---------------------------------------------------------------------------------

    async def props(self) -> Props:
        return parse_props(await self._get(PROPS_PATH))

    async def slots(self) -> list[SlotInfo]:
        return parse_slots(await self._get(SLOTS_PATH))

    async def tokenize(self, text: str) -> list[Token]:
        body = tokenize_body(text, self._settings.model)
        return parse_tokens(await fetch_async(self._transport, self._clock, "POST", TOKENIZE_PATH, body, self._info))

    async def _get(self, path: str) -> bytes:
        path = with_model(path, self._settings.model)
        return await fetch_async(self._transport, self._clock, "GET", path, None, self._info)

    async def _slot_count(self) -> int:
        if self._total_slots is None:
            self._total_slots = (await self.props()).total_slots
        return self._total_slots


class AsyncEventStream:
    """`async with client.stream(req) as s: async for event in s: ...`, then `s.completion`.

    Iterate it once. Leaving the loop or the `async with` block before the end (a `break`, an
    exception, the task cancelled) ends the call at once: its connection is closed and the slot
    given back. An `InferError` of the call is raised from the loop."""

    __slots__ = ("_call", "_cancel", "_client", "_completion", "_over", "_req", "_retry", "_steps")

    def __init__(self, client: AsyncClient, req: ChatRequest, cancel: CancelToken | None, *, retry: bool) -> None:
        self._client = client
        self._req = req
        self._cancel = cancel
        self._retry = retry
        self._call: _Call | None = None
        self._steps: AsyncGenerator[Step, None] | None = None
        self._completion: Completion | None = None
        self._over = False

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
        call, steps = self._call, self._steps
        if call is None or steps is None:
            call = self._call = _Call(CancelToken(), asyncio.get_running_loop())
            steps = self._steps = self._client._steps(self._req, self._retry, call, self._cancel)
        if call.token.cancelled:  # cancelled while the consumer ran its own code
            await self.aclose()
            raise call.token.error()
        call.task = asyncio.current_task()
        call.inside = True
        try:
            step = await steps.__anext__()
        except asyncio.CancelledError as cancelled:
            call.inside = False
            await self.aclose()
            raise call.error(cancelled) from None
        except BaseException:
            call.inside = False
            await self.aclose()
            raise
        call.inside = False
        if isinstance(step, Completion):
            self._completion = step
            await self.aclose()
            raise StopAsyncIteration
        return step

    @property
    def completion(self) -> Completion:
        """The answer, once the loop has run to its end."""
        if self._completion is None:
            raise RuntimeError("the stream has no completion: iterate it to its end first")
        return self._completion

    async def aclose(self) -> None:
        """End the call now if it has not ended (idempotent)."""
        if self._over:
            return
        self._over = True
        if self._steps is not None:
            await self._steps.aclose()  # its `finally` closes, gives the slot back, forgets the call
