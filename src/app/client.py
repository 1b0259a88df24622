"""The llama client: one chat from slot gate to `Completion`, its retries, and the info calls.

The life of one request (the brief, section 4):

    gate -> open + send -> first-byte wait (a /slots poll each poll_ms) -> events under the
    liveness limit -> thinking cap (reasoning_end on a second connection) -> Completion

Invariants:
- Every read has a deadline, so no path can hang: before the response head the deadline is the
  next poll; from the head on (llama-server sends it only when it starts our request, so it is
  the brief's "first byte"), the liveness limit. Only data events (progress, deltas) restart the
  liveness timer; keep-alive comments and partial lines move no deadline.
- Nothing is returned before the final chunk (the one with `finish_reason`); a stream that ends
  after it without `[DONE]` is complete, one that ends before it is `StreamClosedEarly`. Every
  error closes the stream's connection (which cancels generation on the server) and releases
  the slot gate.
- A retry sends the very same bytes: the body is rendered once per `chat_with_retry` call.
- Every call names the model (`?model=` on a GET, `model` in a POST body) so that a llama-server
  router routes it; a single-model server ignores it.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from adapters.uds_http.sse import SseData, SseDecoder, SseDone, parse_chunk
from app.config import Limits
from domain.assembler import Assembler
from domain.completion import Completion
from domain.errors import HttpError, InferError, ProtocolError, RequestError, Stalled
from domain.events import ChatEvent, Retrying, ThinkingCapped
from domain.gate import SlotGate
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
from domain.request import RequestSettings, build_chat_body, build_control_body
from domain.retry import RetryPolicy
from domain.thinking import Action, ThinkingCap
from domain.waiting import FirstByteWait, Liveness
from ports import Clock, Exchange, ResponseHead, SlotProbe, TimedOut, Transport

EventSink = Callable[[ChatEvent], None]

__all__ = ["Client", "EventSink", "Props", "SlotInfo", "Token"]


class Client:
    """What the daemon calls. Built by `app.container.Container` from a `Config` alone."""

    def __init__(
        self,
        *,
        transport: Transport,
        probe: SlotProbe,
        clock: Clock,
        gate: SlotGate,
        retry_policy: RetryPolicy,
        request_settings: RequestSettings,
        limits: Limits,
        total_slots: int | None = None,
    ) -> None:
        self._transport = transport
        self._probe = probe
        self._clock = clock
        self._gate = gate
        self._retry = retry_policy
        self._settings = request_settings
        self._limits = limits
        self._total_slots = total_slots

    # -- chat ---------------------------------------------------------------------------------

    def chat(self, req: ChatRequest, on_event: EventSink) -> Completion:
        """One attempt: returns the final `Completion` or raises an `InferError`."""
        body = self.render(req)
        with self._gate.hold(req.slot, on_event):
            return self._attempt(req.slot, body, on_event)

    def chat_with_retry(self, req: ChatRequest, on_event: EventSink) -> Completion:
        """`chat`, retried by the retry policy; every attempt sends the same bytes.

        Learning the slot count from `/props` (when the config does not give it) is part of the
        first attempt, so a server that is down or loading at that moment is retried too."""
        started = self._clock.now()
        body: bytes | None = None
        attempt = 1
        while True:
            try:
                if body is None:
                    body = self.render(req)
                with self._gate.hold(req.slot, on_event):
                    return self._attempt(req.slot, body, on_event)
            except InferError as error:
                elapsed_ms = (self._clock.now() - started) * 1000.0
                decision = self._retry.decide(attempt, error, elapsed_ms)
                if not decision.retry:
                    raise
                attempt = decision.attempt
                reason = f"{type(error).__name__}: {error}"
                on_event(Retrying(attempt=attempt, after_ms=decision.after_ms, error=reason))
                self._clock.sleep(decision.after_ms / 1000.0)

    def render(self, req: ChatRequest) -> bytes:
        """The exact request body `chat` sends for `req` (validated, deterministic)."""
        return build_chat_body(req, self._settings, total_slots=self._slot_count())

    def _slot_count(self) -> int:
        if self._total_slots is None:
            self._total_slots = self.props().total_slots
        return self._total_slots

    def _attempt(self, slot: int, body: bytes, on_event: EventSink) -> Completion:
        exchange = self._transport.open("POST", CHAT_PATH, body, timeout=self._limits.poll_ms / 1000.0)
        try:
            head = self._await_head(exchange, slot, on_event)
            if head.status != 200:
                raise HttpError(head.status, self._error_body(exchange), self._limits.error_body_bytes)
            kind = head.header("content-type")
            if kind is not None and not kind.lower().startswith("text/event-stream"):
                # A whole answer where a stream was asked for would read as a stream without its
                # final chunk and be retried; it is a server that ignored `stream: true`.
                raise ProtocolError(f"POST {CHAT_PATH}: 200 answer is {kind!r}, not an event stream")
            return self._stream(exchange, on_event)
        finally:
            exchange.close()

    def _await_head(self, exchange: Exchange, slot: int, on_event: EventSink) -> ResponseHead:
        """Wait for the response head, asking `/slots` each `poll_ms` and emitting `Waiting`.

        llama-server sends no byte (no head, no ping) while the request is queued, and sends the
        head only when it starts the request, so the head is the brief's "first byte"."""
        limits = self._limits
        clock = self._clock
        wait = FirstByteWait(
            poll_ms=limits.poll_ms,
            busy_wait_ms=limits.busy_wait_ms,
            load_wait_ms=limits.load_wait_ms,
            idle_grace_ms=limits.idle_grace_ms,
            sent_at=clock.now(),
            slot=slot,
        )
        while True:
            head = exchange.head(wait.timeout(clock.now()))
            if not isinstance(head, TimedOut):
                return head
            decision = wait.on_poll(clock.now(), self._probe.state(slot))
            on_event(decision.event)
            if decision.error is not None:
                raise decision.error

    def _stream(self, exchange: Exchange, on_event: EventSink) -> Completion:
        """Read the stream to its final chunk under the liveness limit, with the thinking cap.

        The hot path: one read, one decoder feed, one orjson parse and one assembler feed per
        chunk, two clock reads per read. A read's deadline is the silence left since the
        generation last advanced (the assembler's `advanced`); anything else (a keep-alive
        comment, part of a line, a chunk that carries nothing new) moves no deadline, so no flood
        of empty events keeps a dead stream alive. The final chunk returns the answer at once:
        nothing after it is read, so nothing after it can change the answer."""
        limits = self._limits
        clock = self._clock
        read = exchange.read
        decoder = SseDecoder(max_line=limits.sse_line_bytes)
        feed = decoder.feed
        assembler = Assembler(max_answer_bytes=limits.answer_bytes, max_predicted=self._settings.max_tokens)
        assemble = assembler.feed
        cap = ThinkingCap(limits.thinking_cap, limits.thinking_overrun)
        liveness = Liveness(limits.liveness_ms, clock.now())
        while True:
            data = read(liveness.timeout(clock.now()))
            arrived = clock.now()
            if isinstance(data, TimedOut):
                if liveness.expired(arrived):
                    raise liveness.error(arrived)
                continue
            if not data:
                decoder.end()  # raises a decoder failure still pending
                return assembler.result(thinking_capped=cap.capped)
            advanced = False
            for event in feed(data):
                if type(event) is SseData:
                    for out in assemble(parse_chunk(event.data)):
                        on_event(out)
                    if assembler.finished:
                        return assembler.result(thinking_capped=cap.capped)
                    if assembler.advanced:
                        advanced = True
                        if assembler.in_reasoning:
                            self._check_thinking(cap, assembler, exchange, on_event)
                elif type(event) is SseDone:
                    return assembler.result(thinking_capped=cap.capped)
            if advanced:
                liveness.on_data(arrived)
            elif liveness.expired(arrived):
                raise liveness.error(arrived)

    def _check_thinking(self, cap: ThinkingCap, assembler: Assembler, exchange: Exchange, on_event: EventSink) -> None:
        action = cap.observe(assembler.reasoning_tokens, assembler.in_reasoning)
        if action is Action.POST_REASONING_END:
            answer = self._post_reasoning_end(assembler.completion_id)
            if cap.control_answer(answer is None) is Action.OVERRUN:
                exchange.close()
                raise cap.control_error(answer or "")
            on_event(ThinkingCapped(tokens=assembler.reasoning_tokens))
        elif action is Action.OVERRUN:
            exchange.close()
            raise cap.overrun_error(assembler.reasoning_tokens)

    def _post_reasoning_end(self, completion_id: str | None) -> str | None:
        """Ask the server to end the thinking block on a second connection: None when it answers
        `{"success": true}`, else what went wrong."""
        if completion_id is None:
            return "the stream carried no completion id"
        try:
            # The stream is not read meanwhile, so the call gets the liveness limit, not a load wait.
            body = build_control_body(completion_id, self._settings.model)
            answer = self._request("POST", CONTROL_PATH, body, wait_ms=self._limits.liveness_ms)
        except InferError as exc:
            return f"{type(exc).__name__}: {exc}"
        return control_refusal(answer)

    # -- info ---------------------------------------------------------------------------------

    def props(self) -> Props:
        return parse_props(self._request("GET", with_model(PROPS_PATH, self._settings.model)))

    def slots(self) -> list[SlotInfo]:
        return parse_slots(self._request("GET", with_model(SLOTS_PATH, self._settings.model)))

    def tokenize(self, text: str) -> list[Token]:
        if type(text) is not str:
            raise RequestError(f"tokenize takes text (a str), not {type(text).__name__}")
        try:
            body = orjson.dumps({"content": text, "with_pieces": True, "model": self._settings.model})
        except orjson.JSONEncodeError as exc:
            raise RequestError(f"the text to tokenize is not valid Unicode ({exc})") from exc
        return parse_tokens(self._request("POST", TOKENIZE_PATH, body))

    def _request(self, method: str, path: str, body: bytes | None = None, *, wait_ms: int | None = None) -> bytes:
        """A small request whose answer is one body (not a stream). Its head must come within
        `wait_ms` (by default `load_wait_ms`: a router may be loading the model), else `Stalled`;
        its body, or an error body, within `liveness_ms` more in all."""
        limits = self._limits
        wait_ms = limits.load_wait_ms if wait_ms is None else wait_ms
        exchange = self._transport.open(method, path, body, timeout=limits.poll_ms / 1000.0)
        try:
            deadline = self._clock.now() + wait_ms / 1000.0
            while True:
                head = exchange.head(max(0.0, min(limits.poll_ms / 1000.0, deadline - self._clock.now())))
                if not isinstance(head, TimedOut):
                    break
                if self._clock.now() >= deadline:
                    raise Stalled(f"{method} {path}: no answer within {wait_ms} ms")
            if head.status != 200:
                raise HttpError(head.status, self._error_body(exchange), limits.error_body_bytes)
            return exchange.read_all(limits.body_bytes, limits.liveness_ms / 1000.0)
        finally:
            exchange.close()

    def _error_body(self, exchange: Exchange) -> bytes:
        """Up to `error_body_bytes` of an error answer, read within `liveness_ms` in all; a body
        that is longer, slower or cut short is kept as far as it came, never an error: the status
        is the news."""
        limit = self._limits.error_body_bytes
        clock = self._clock
        deadline = clock.now() + self._limits.liveness_ms / 1000.0
        kept = bytearray()
        try:
            while len(kept) < limit:
                left = deadline - clock.now()
                if left <= 0.0:
                    break
                piece = exchange.read(left)
                if isinstance(piece, TimedOut) or not piece:
                    break
                kept += piece
        except InferError:
            pass
        return bytes(kept[:limit])
