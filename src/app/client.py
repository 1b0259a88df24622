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

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from adapters.uds_http.sse import SseData, SseDecoder, SseDone, parse_chunk
from app.config import Limits
from domain.assembler import Assembler
from domain.completion import Completion
from domain.errors import HttpError, InferError, ProtocolError, Stalled, StreamClosedEarly
from domain.events import ChatEvent, Retrying, ThinkingCapped
from domain.gate import SlotGate
from domain.hashing import sha256
from domain.messages import ChatRequest
from domain.request import RequestSettings, build_chat_body, build_control_body
from domain.retry import RetryPolicy
from domain.thinking import Action, ThinkingCap
from domain.waiting import FirstByteWait, Liveness
from ports import Clock, Exchange, ResponseHead, SlotProbe, TimedOut, Transport

EventSink = Callable[[ChatEvent], None]

CHAT_PATH = "/v1/chat/completions"
CONTROL_PATH = "/v1/chat/completions/control"


@dataclass(frozen=True, slots=True)
class Props:
    """What `/props` says of the server; `n_ctx` is per slot."""

    chat_template: str
    chat_template_sha256: str
    total_slots: int
    n_ctx: int
    model_alias: str | None = None
    model_path: str | None = None


@dataclass(frozen=True, slots=True)
class SlotInfo:
    id: int
    is_processing: bool
    n_ctx: int | None = None


@dataclass(frozen=True, slots=True)
class Token:
    """One token of `/tokenize`. llama-server sends a piece that is not valid UTF-8 on its own
    (part of a multi-byte character) as a list of byte values: `data` holds the exact bytes, so
    `b"".join(t.data for t in tokens)` is the text's UTF-8; `piece` is `data` as text, with
    U+FFFD where a character is split between tokens."""

    id: int
    piece: str
    data: bytes


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
        # A llama-server router routes a GET by `?model=` and a POST by the body's `model`; a
        # single-model server ignores both.
        self._model_query = "?model=" + quote(request_settings.model, safe="")

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
        chunk, two clock reads per read. A read's deadline is the silence left; a read that brings
        no data event (a keep-alive comment, part of a line) moves no deadline, so not even a
        flood of comments keeps a dead stream alive."""
        limits = self._limits
        clock = self._clock
        read = exchange.read
        decoder = SseDecoder(max_line=limits.sse_line_bytes)
        feed = decoder.feed
        assembler = Assembler()
        assemble = assembler.feed
        cap = ThinkingCap(limits.thinking_cap, limits.thinking_overrun)
        liveness = Liveness(limits.liveness_ms, clock.now())
        while True:
            try:
                data = read(liveness.timeout(clock.now()))
            except StreamClosedEarly:
                if assembler.finished:
                    # Cut after the final chunk (only `[DONE]` was missing): the answer is whole.
                    return assembler.result(thinking_capped=cap.capped)
                raise
            arrived = clock.now()
            if isinstance(data, TimedOut):
                if liveness.expired(arrived):
                    if assembler.finished:
                        # The final chunk came and then only silence (no `[DONE]`, no close):
                        # the answer is whole, so it is returned rather than lost to a stall.
                        return assembler.result(thinking_capped=cap.capped)
                    raise liveness.error(arrived)
                continue
            if not data:
                decoder.end()  # raises a decoder failure still pending
                return assembler.result(thinking_capped=cap.capped)
            fresh = False
            for event in feed(data):
                if type(event) is SseData:
                    fresh = True
                    for out in assemble(parse_chunk(event.data)):
                        on_event(out)
                    if assembler.in_reasoning:
                        self._check_thinking(cap, assembler, exchange, on_event)
                elif type(event) is SseDone:
                    return assembler.result(thinking_capped=cap.capped)
            if fresh:
                liveness.on_data(arrived)
            elif liveness.expired(arrived):
                raise liveness.error(arrived)

    def _check_thinking(
        self, cap: ThinkingCap, assembler: Assembler, exchange: Exchange, on_event: EventSink
    ) -> None:
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
            answer = self._request_json("POST", CONTROL_PATH, body, wait_ms=self._limits.liveness_ms)
        except InferError as exc:
            return f"{type(exc).__name__}: {exc}"
        if isinstance(answer, dict) and answer.get("success") is True:
            return None
        return f"the server answered {json.dumps(answer)[:300]}"

    # -- info ---------------------------------------------------------------------------------

    def props(self) -> Props:
        data = self._request_json("GET", "/props" + self._model_query)
        try:
            template = data["chat_template"]
            total_slots = data["total_slots"]
            n_ctx = data["default_generation_settings"]["n_ctx"]
        except (KeyError, TypeError) as exc:
            raise ProtocolError(f"/props answer lacks {exc}") from exc
        if not isinstance(template, str) or not isinstance(total_slots, int) or not isinstance(n_ctx, int):
            raise ProtocolError("/props answer has chat_template, total_slots or n_ctx of the wrong type")
        return Props(
            chat_template=template,
            chat_template_sha256=sha256(template.encode("utf-8")).hex(),
            total_slots=total_slots,
            n_ctx=n_ctx,
            model_alias=_opt_str(data.get("model_alias")),
            model_path=_opt_str(data.get("model_path")),
        )

    def slots(self) -> list[SlotInfo]:
        data = self._request_json("GET", "/slots" + self._model_query)
        if not isinstance(data, list):
            raise ProtocolError("/slots answer is not a list")
        out = []
        for entry in data:
            if not isinstance(entry, dict) or type(entry.get("id")) is not int:
                raise ProtocolError(f"/slots entry without an integer id: {str(entry)[:200]}")
            busy = entry.get("is_processing")
            if type(busy) is not bool:
                raise ProtocolError(f"/slots entry {entry['id']} has is_processing {busy!r}, not a boolean")
            n_ctx = entry.get("n_ctx")
            out.append(SlotInfo(entry["id"], busy, n_ctx if type(n_ctx) is int else None))
        return out

    def tokenize(self, text: str) -> list[Token]:
        request = {"content": text, "with_pieces": True, "model": self._settings.model}
        body = json.dumps(request, ensure_ascii=False).encode("utf-8")
        data = self._request_json("POST", "/tokenize", body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise ProtocolError("/tokenize answer has no token list")
        out = []
        for tok in tokens:
            if not isinstance(tok, dict) or type(tok.get("id")) is not int:
                raise ProtocolError(f"/tokenize entry without an integer id: {str(tok)[:200]}")
            piece = tok.get("piece")
            if isinstance(piece, str):
                out.append(Token(tok["id"], piece, piece.encode("utf-8")))
            elif isinstance(piece, list) and all(type(b) is int and 0 <= b <= 255 for b in piece):
                data = bytes(piece)
                out.append(Token(tok["id"], data.decode("utf-8", "replace"), data))
            else:
                raise ProtocolError(f"/tokenize entry {tok['id']} has a piece that is neither text nor bytes")
        return out

    def _request_json(self, method: str, path: str, body: bytes | None = None, *, wait_ms: int | None = None) -> Any:
        """A small request whose answer is one JSON document (not a stream); `Stalled` if its head
        does not come within `wait_ms` (by default `load_wait_ms`: a router may be loading)."""
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
            raw = exchange.read_all(limits.body_bytes, limits.liveness_ms / 1000.0)
        finally:
            exchange.close()
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"{method} {path}: answer is not JSON: {exc}") from exc

    def _error_body(self, exchange: Exchange) -> bytes:
        """Up to `error_body_bytes` of an error answer; a longer body is cut, never an error."""
        limit = self._limits.error_body_bytes
        timeout = self._limits.poll_ms / 1000.0
        kept = bytearray()
        try:
            while len(kept) < limit:
                piece = exchange.read(timeout)
                if isinstance(piece, TimedOut) or not piece:
                    break
                kept += piece
        except InferError:
            pass  # the status is the news; a body cut short still says what it can
        return bytes(kept[:limit])


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None
