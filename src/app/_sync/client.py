# Generated from src/app/_async/client.py by scripts/unasync.py: do not edit.
"""The llama client: what the daemon calls, from one source for both flavours. The blocking
`Client` (`app/_sync/client.py`) is generated from this file by `scripts/unasync.py`.

    client = Container(config=cfg).async_client()          # or .client(): the same, blocking
    completion = client.chat_with_retry(req, on_event=print)
    with client.stream(req) as s:
        for event in s: ...
    s.completion

This module is the surface and the lifecycle: every call (a chat, a stream, `render`, `props`,
`slots`, `tokenize`) runs under a `CancelToken` of its own, registered with the client's calls
(`app.calls`) while it runs, so `close()` ends it; the steps of a call are `app._sync.call`.

Invariants:
- A call on a closed client raises `ClientClosed` without touching the server; `close()` ends
  every call in flight or queued (`ClientClosed`) and returns once they have ended, waiting at
  most `CLOSE_WAIT_S`; once it has begun, no queued call sends a request or returns an answer.
- A caller's `CancelToken` ends its call in whatever phase it is, with `Cancelled`; on asyncio,
  cancelling the task does too (`asyncio.CancelledError`).
- Nothing is final before the `Completion`: the events are progress. An `on_event` that raises
  ends the call (its connection closed) and the exception propagates.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Callable
from types import TracebackType

from app._sync.call import LlamaCalls
from app.calls import CLOSE_WAIT_S, Calls, Inner
from app.event_stream import EventStream, Step, check_sink
from app.slot_memory import SlotMemory
from app.slot_queue import SlotQueue
from domain.cache import CACHE_LOSS_TOKENS
from domain.cancel import CancelToken
from domain.completion import Completion
from domain.errors import InferError
from domain.events import ChatEvent
from domain.gate import SlotGate
from domain.limits import ClientLimits
from domain.llama_api import Props, SlotInfo, Token
from domain.messages import ChatRequest
from domain.prompt_cache import CacheSettings, Checkpoint
from domain.request import RequestSettings
from domain.retry import RetryPolicy
from domain.sessions import session_of
from ports.clock import Clock
from ports.slot_probe import SlotProbe
from ports.transport import Transport

__all__ = ["Client", "EventSink"]

EventSink = Callable[[ChatEvent], None]


class Client:
    """Built by `app.container.Container` from a `Config` alone. Safe to share (between tasks,
    threads and event loops); `close()` (or leaving `with client:`) ends every call."""

    def __init__(
        self,
        *,
        transport: Transport,
        probe: SlotProbe,
        clock: Clock,
        gate: SlotGate,
        retry_policy: RetryPolicy,
        request_settings: RequestSettings,
        limits: ClientLimits,
        total_slots: int | None,
        n_ctx: int | None = None,
        cache: CacheSettings | None = None,
        memory: SlotMemory | None = None,
    ) -> None:
        self._calls = Calls()
        self._clock = clock
        self._gate = gate
        self._transport = transport
        self._llama = LlamaCalls(
            transport=transport,
            probe=probe,
            clock=clock,
            queue=SlotQueue(gate, clock),
            retry_policy=retry_policy,
            request_settings=request_settings,
            limits=limits,
            total_slots=total_slots,
            n_ctx=n_ctx,
            cache=cache or CacheSettings(predict=False, loss_tokens=CACHE_LOSS_TOKENS),
            memory=memory,
        )

    # -- chat ---------------------------------------------------------------------------------

    def chat(
        self, req: ChatRequest, on_event: EventSink | None = None, cancel: CancelToken | None = None
    ) -> Completion:
        """Send `req` once and return its `Completion`, whole: nothing before the final chunk.

        `on_event` (optional) is called with every event as it comes, on the caller's thread;
        `cancel` ends the call from anywhere. A stream cut after its head is still re-attached
        (the events go on where they broke), and a proxy's refusal, which reached no server, is
        tried once more after the proxy's refill time; nothing else is tried twice.

        Raises (every one an `InferError`, drawn as a tree in `domain.errors`):
        `RequestError` for a request that must not be sent, before anything is;
        `Busy` when `queue_per_slot` callers wait for the slot already;
        `WaitTimeout` when the slot stays busy past `busy_wait_ms`;
        `LoadTimeout` when the server stays loading or unresponsive past `load_wait_ms`;
        `Stalled` on silence past `idle_grace_ms` or `liveness_ms`;
        `ConnectError`, `StreamClosedEarly` when the socket or the stream breaks;
        `HttpError` for a non-200 answer; `ProtocolError`, `ThinkingOverrun`;
        `Cancelled` when `cancel` fires, `ClientClosed` when the client is closed (either
        carrying the answer's text as far as the events showed it: `content`, `reasoning`)."""
        sink = _sink(on_event)
        with self.stream(req, cancel) as stream:
            return stream.run(sink)

    def chat_with_retry(
        self, req: ChatRequest, on_event: EventSink | None = None, cancel: CancelToken | None = None
    ) -> Completion:
        """`chat`, with every failure whose class says `retried` tried again by the retry
        policy (`retry.attempts`, `delays_ms`, `total_ms`): each attempt sends the same bytes,
        and a `Retrying` event comes before it (with `resend`, what the events showed so far is
        superseded: the answer starts again). Raises what `chat` raises, once the retries are
        spent or the failure is not retried."""
        sink = _sink(on_event)
        with self.stream_with_retry(req, cancel) as stream:
            return stream.run(sink)

    def stream(self, req: ChatRequest, cancel: CancelToken | None = None) -> EventStream:
        """`chat` as an iterator of events:
        `with client.stream(req) as s: for e in s: ...`."""
        return EventStream(lambda token: self._steps(req, token, cancel, retry=False))

    def stream_with_retry(
        self, req: ChatRequest, cancel: CancelToken | None = None
    ) -> EventStream:
        """`chat_with_retry` as an iterator of events."""
        return EventStream(lambda token: self._steps(req, token, cancel, retry=True))

    def _steps(
        self, req: ChatRequest, token: CancelToken, cancel: CancelToken | None, *, retry: bool
    ) -> Generator[Step, None, None]:
        """The steps of one chat: its events, then its `Completion`; attempts through the gate,
        retried by the policy when `retry`. Registered with the client while they run: the
        `finally` runs however the call ends (its end, an error, `close()`, or a stream dropped
        unclosed). Learning the slot count from `/props` (when the config does not give it) is
        part of the first attempt, so a server down or loading at that moment is retried too."""
        self._calls.begin(token, cancel)  # ClientClosed: nothing is sent
        try:
            token.raise_if_cancelled()  # a token cancelled before the call: nothing is sent
            steps = self._llama.chat(req, token, retry=retry)
            try:
                for step in steps:
                    yield step
            finally:
                Inner.close(steps)
        except InferError as exc:
            if token.cancelled:  # the cancel broke the I/O: say why
                raise token.error() from exc
            raise
        finally:
            self._calls.end(token)

    # -- the small calls ----------------------------------------------------------------------

    def render(self, req: ChatRequest, cancel: CancelToken | None = None) -> bytes:
        """The exact request body `chat` sends for `req` (validated, deterministic)."""
        with self._calls.scope(cancel) as token:
            token.raise_if_cancelled()  # a token cancelled before the call: it ends as every call
            session_of(req)  # RequestError: neither slot nor session, or both
            return self._llama.info.render(req, token)

    def props(self, cancel: CancelToken | None = None, *, load: bool = False) -> Props:
        """What `/props` says of the config's model. On a llama-server router that has not
        loaded it: `ModelNotLoaded`, unless `load` (then the router loads it, which may evict
        another model under `--models-max`; the head awaited up to `load_wait_ms`)."""
        with self._calls.scope(cancel) as token:
            return self._llama.info.props(token, load=load)

    def slots(self, cancel: CancelToken | None = None) -> list[SlotInfo]:
        """The server's slots; `ModelNotLoaded` from a router that has not loaded the model."""
        with self._calls.scope(cancel) as token:
            return self._llama.info.slots(token)

    def tokenize(self, text: str, cancel: CancelToken | None = None) -> list[Token]:
        with self._calls.scope(cancel) as token:
            return self._llama.info.tokenize(text, token)

    # -- slot checkpoints ---------------------------------------------------------------------

    def save_slot(self, slot: int, cancel: CancelToken | None = None) -> Checkpoint | None:
        """Save what slot `slot` holds (its KV cache) to a file in the server's `--slot-save-path`
        folder, once the slot is ours at the gate, and remember what it holds: a turn that finds
        the slot emptied (a server restart) restores it by itself. None when the server keeps no
        checkpoints (started without `--slot-save-path`: one WARNING, then never asked again)."""
        with self._calls.scope(cancel) as token:
            return self._llama.holding(slot, token, self._llama.cache.save)

    def restore_slot(self, slot: int, cancel: CancelToken | None = None) -> int:
        """Put slot `slot`'s last checkpoint back into it; the tokens restored. `RequestError`
        when it has none, or when the server's template, model or slot context is not the one it
        was saved under."""
        with self._calls.scope(cancel) as token:
            return self._llama.holding(slot, token, self._llama.cache.restore)

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """End every call in flight or queued (`ClientClosed`), refuse new ones, and return once
        they have ended (waiting at most `CLOSE_WAIT_S`), the transport closed (the socket it
        made ahead). Idempotent."""
        started = time.monotonic()  # the ends made here count against the wait for the rest
        if self._calls.close_all():
            self._calls.wait_idle(max(CLOSE_WAIT_S - (time.monotonic() - started), 0.0))
        # A transport may hold something ahead of its next connect (the real one, a socket);
        # one that holds nothing need not have a `close` (it is not part of the port).
        close: Callable[[], None] | None = getattr(self._transport, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _ignore(event: object) -> None:
    """The events of a call that asked for none."""


def _sink(on_event: EventSink | None) -> EventSink:
    if on_event is None:
        return _ignore
    check_sink(on_event)
    return on_event
