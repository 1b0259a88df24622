"""The llama client: one chat from slot gate to `Completion`, its retries, and the info calls.

The life of one request (the brief, section 4):

    gate -> open + send -> first-byte wait (a /slots poll each poll_ms) -> the stream, pumped
    through `domain.chat_stream` (liveness, thinking cap: reasoning_end on a second connection)
    -> Completion

This module is the use case only: every rule lives in a domain object (`FirstByteWait`,
`ChatStream`, `RetryPolicy`, `SlotGate`), every byte of llama-server's API in
`domain.llama_api`, and the I/O behind the `Transport` and `SlotProbe` ports.

Invariants:
- Every read has a deadline, so no path can hang: before the response head, the next poll; from
  the head on (llama-server sends it only when it starts our request, so it is the brief's
  "first byte"), the silence the stream allows.
- Nothing is returned before the final chunk. Every error closes the stream's connection (which
  cancels generation on the server) and releases the slot gate.
- A retry sends the very same bytes: the body is rendered once per `chat_with_retry` call, and
  each attempt goes back through the slot gate (never held across a retry wait).
- Every call names the model (`?model=` on a GET, `model` in a POST body) so that a llama-server
  router routes it; a single-model server ignores it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator
from types import TracebackType

from app.call_parts import control_limits, first_byte_wait, info_limits, log_done, not_a_stream, retrying, tokenize_body
from app.event_stream import ChatSteps, EventStream, drive
from domain.cancel import CancelToken
from domain.chat_stream import ChatStream, PostReasoningEnd
from domain.completion import Completion, Timings
from domain.errors import ClientClosed, HttpError, InferError
from domain.events import ChatEvent, Progress, Queued
from domain.fetch import error_body, fetch
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
from ports import Clock, Exchange, ResponseHead, SlotProbe, TimedOut, Transport

__all__ = ["Client", "EventSink", "EventStream", "Props", "SlotInfo", "Token"]

EventSink = Callable[[ChatEvent], None]

log = logging.getLogger("inferpath.client")
# Silent unless the daemon configures logging: the library's loggers never print by themselves.
logging.getLogger("inferpath").addHandler(logging.NullHandler())

# `close()` waits this long for the calls it cancelled to return.
CLOSE_WAIT_S = 0.3


class Client:
    """What the daemon calls. Built by `app.container.Container` from a `Config` alone. Safe to
    share between threads; `close()` (or leaving `with client:`) ends every call."""

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
    ) -> None:
        self._transport = transport
        self._probe = probe
        self._clock = clock
        self._gate = gate
        self._retry = retry_policy
        self._settings = request_settings
        self._limits = limits
        self._total_slots = total_slots
        self._info = info_limits(limits)
        self._control = control_limits(limits)
        self._calls_changed = threading.Condition()
        self._calls: set[CancelToken] = set()
        self._closed = False
        self._last_timings: dict[int, Timings] = {}

    # -- the surface --------------------------------------------------------------------------

    def chat(self, req: ChatRequest, on_event: EventSink, cancel: CancelToken | None = None) -> Completion:
        """One attempt: returns the final `Completion` or raises an `InferError`."""
        return drive(self._call(req, cancel, retry=False), on_event)

    def chat_with_retry(self, req: ChatRequest, on_event: EventSink, cancel: CancelToken | None = None) -> Completion:
        """`chat`, retried by the retry policy; every attempt sends the same bytes.

        Learning the slot count from `/props` (when the config does not give it) is part of the
        first attempt, so a server that is down or loading at that moment is retried too."""
        return drive(self._call(req, cancel, retry=True), on_event)

    def stream(self, req: ChatRequest, cancel: CancelToken | None = None) -> EventStream:
        """`chat` as an iterator of events: `with client.stream(req) as s: for e in s: ...`."""
        return EventStream(self._call(req, cancel, retry=False))

    def stream_with_retry(self, req: ChatRequest, cancel: CancelToken | None = None) -> EventStream:
        """`chat_with_retry` as an iterator of events."""
        return EventStream(self._call(req, cancel, retry=True))

    def render(self, req: ChatRequest, cancel: CancelToken | None = None) -> bytes:
        """The exact request body `chat` sends for `req` (validated, deterministic)."""
        return build_chat_body(req, self._settings, total_slots=self._slot_count(cancel))

    def close(self) -> None:
        """End every call in flight or queued (`ClientClosed`), refuse new ones, and return once
        they have ended (waiting at most `CLOSE_WAIT_S`). Idempotent."""
        with self._calls_changed:
            self._closed = True
            calls = list(self._calls)
        for token in calls:
            token.cancel(ClientClosed("the client was closed while the call ran"))
        with self._calls_changed:
            self._calls_changed.wait_for(lambda: not self._calls, CLOSE_WAIT_S)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- one call -----------------------------------------------------------------------------

    def _call(self, req: ChatRequest, cancel: CancelToken | None, *, retry: bool) -> ChatSteps:
        token = CancelToken()
        with self._calls_changed:
            if self._closed:
                raise ClientClosed("the client is closed")
            self._calls.add(token)
        unlink = cancel.on_cancel(lambda: token.cancel(cancel.error())) if cancel is not None else None
        try:
            if retry:
                completion = yield from self._retrying(req, token)
            else:
                completion = yield from self._gated(req, self.render(req, token), token)
            self._log_done(req.slot, completion)
            return completion
        finally:
            if unlink is not None:
                unlink()
            with self._calls_changed:
                self._calls.discard(token)
                self._calls_changed.notify_all()

    def _retrying(self, req: ChatRequest, token: CancelToken) -> ChatSteps:
        started = self._clock.now()
        body: bytes | None = None
        attempt = 1
        while True:
            try:
                if body is None:
                    body = self.render(req, token)
                return (yield from self._gated(req, body, token))
            except InferError as error:
                event = retrying(log, self._retry, req.slot, attempt, error, (self._clock.now() - started) * 1000.0)
                if event is None:
                    raise
                attempt = event.attempt
                yield event
                self._clock.sleep(event.after_ms / 1000.0, token.event)
                token.raise_if_cancelled()

    def _gated(self, req: ChatRequest, body: bytes, token: CancelToken) -> ChatSteps:
        """One attempt through the slot gate: queue (emitting `Queued`), hold, attempt, release."""
        slot = req.slot
        ticket = self._gate.enter(slot)
        try:
            ahead = ticket.ahead
            while ahead:
                log.debug("slot %d: queued, %d ahead", slot, ahead)
                yield Queued(ahead)
                ahead = self._gate.wait(ticket, token)
            return (yield from self._attempt(req, body, token))
        finally:
            self._gate.leave(ticket)

    def _attempt(self, req: ChatRequest, body: bytes, token: CancelToken) -> ChatSteps:
        token.raise_if_cancelled()
        limits = self._limits
        exchange = self._transport.open("POST", CHAT_PATH, body, timeout=limits.poll_ms / 1000.0, cancel=token)
        try:
            head = yield from self._await_head(exchange, req.slot, token)
            if head.status != 200:
                deadline = self._clock.now() + limits.stream.liveness_ms / 1000.0
                kept = error_body(exchange, self._clock, deadline, limits.error_body_bytes)
                raise HttpError(head.status, kept, limits.error_body_bytes)
            error = not_a_stream(head)
            if error is not None:
                raise error
            return (yield from self._pump(exchange, effective_max_tokens(req, self._settings), token))
        except InferError as exc:
            if token.cancelled:  # the abort broke the connection: say why
                raise token.error() from exc
            raise
        finally:
            exchange.close()

    def _await_head(
        self, exchange: Exchange, slot: int, token: CancelToken
    ) -> Generator[ChatEvent, None, ResponseHead]:
        """Wait for the response head, asking `/slots` each `poll_ms` and emitting `Waiting`."""
        limits = self._limits
        clock = self._clock
        sent = clock.now()
        wait = first_byte_wait(limits, sent, slot)
        while True:
            head = exchange.head(wait.timeout(clock.now()))
            if not isinstance(head, TimedOut):
                log.debug("slot %d: response head %d after %.0f ms", slot, head.status, (clock.now() - sent) * 1000)
                return head
            decision = wait.on_poll(clock.now(), self._probe.state(slot, token))
            token.raise_if_cancelled()
            yield decision.event
            if decision.error is not None:
                raise decision.error

    def _pump(self, exchange: Exchange, max_tokens: int, token: CancelToken) -> ChatSteps:
        """Read with the deadline the stream gives, feed it, act on its steps."""
        clock = self._clock
        read = exchange.read
        stream = ChatStream(self._limits.stream, max_tokens, clock.now())
        started = clock.now()
        first = True
        while True:
            data = read(stream.timeout(clock.now()))
            if isinstance(data, TimedOut):
                stream.silence(clock.now())
                continue
            for step in stream.feed(data, clock.now()):
                if isinstance(step, Completion):
                    return step
                if isinstance(step, PostReasoningEnd):
                    refusal = self._post_reasoning_end(step.completion_id, token)
                    log.debug("reasoning_end posted: %s", "accepted" if refusal is None else refusal)
                    yield stream.control_answered(refusal)
                elif isinstance(step, InferError):
                    raise step
                else:
                    if first and not isinstance(step, Progress):
                        first = False
                        log.debug("first token %.0f ms after the head", (clock.now() - started) * 1000)
                    yield step

    def _post_reasoning_end(self, completion_id: str, token: CancelToken) -> str | None:
        """Ask the server to end the thinking block on a second connection: None when it answers
        `{"success": true}`, else what went wrong."""
        try:
            body = build_control_body(completion_id, self._settings.model)
            answer = fetch(self._transport, self._clock, "POST", CONTROL_PATH, body, self._control, token)
            return control_refusal(answer)
        except InferError as exc:
            token.raise_if_cancelled()
            return f"{type(exc).__name__}: {exc}"

    def _log_done(self, slot: int, completion: Completion) -> None:
        log_done(log, self._last_timings, slot, completion)

    # -- info ---------------------------------------------------------------------------------

    def props(self) -> Props:
        return parse_props(self._get(PROPS_PATH))

    def slots(self) -> list[SlotInfo]:
        return parse_slots(self._get(SLOTS_PATH))

    def tokenize(self, text: str) -> list[Token]:
        body = tokenize_body(text, self._settings.model)
        return parse_tokens(fetch(self._transport, self._clock, "POST", TOKENIZE_PATH, body, self._info))

    def _get(self, path: str) -> bytes:
        return fetch(self._transport, self._clock, "GET", with_model(path, self._settings.model), None, self._info)

    def _slot_count(self, cancel: CancelToken | None) -> int:
        if self._total_slots is None:
            if cancel is not None:
                cancel.raise_if_cancelled()
            self._total_slots = self.props().total_slots
        return self._total_slots
