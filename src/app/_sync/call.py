# Generated from src/app/_async/call.py by scripts/unasync.py: do not edit.
"""What one client asks of llama-server, step by step: a chat from the slot gate to its
`Completion` (retried or not), and the small calls. The one source of the call: the blocking
twin (`app/_sync/call.py`) is generated from this file by `scripts/unasync.py`.

The life of one chat request (the brief, section 4):

    gate (Queued, at most busy_wait_ms) -> open + send -> first-byte wait (a /slots poll each
    poll_ms: Waiting) -> the stream, fed to `domain.chat_stream` (liveness, thinking cap:
    reasoning_end on a second connection) -> Completion

Every rule lives in a domain object (`FirstByteWait`, `ChatStream`, `RetryPolicy`, `SlotGate`,
`domain.bodies`, `domain.limits`), every byte of llama-server's API in `domain.llama_api`, and
the I/O behind the ports. Invariants:
- Every wait has a deadline, so no path can hang: at the gate, `busy_wait_ms`; before the
  response head, the next poll; from the head on (llama-server sends it only when it starts our
  request, so it is the brief's "first byte"), the silence the stream allows.
- Nothing is returned before the final chunk. Every way out closes the stream's connection
  (which cancels generation on the server) and gives the slot back.
- A retry sends the very same bytes: the body is rendered once per call, and each attempt goes
  back through the slot gate (never held across a retry wait).
- Every I/O step takes the call's `CancelToken`: the blocking flavour is woken by it in whatever
  phase it is, and a cancelled call never sends a request or starts a retry.
- Every request names the model (`?model=` on a GET, `model` in a POST body) so that a
  llama-server router routes it; a single-model server ignores it.
- Log lines carry statuses, error types, counts and times, never the server's text
  (`domain.errors.loggable`).
"""

from __future__ import annotations

import logging
from collections.abc import Generator

from app._sync.fetch import error_body, fetch
from app.event_stream import Step
from app.slot_queue import SlotQueue
from domain.cache import cache_outcome
from domain.cancel import CancelToken
from domain.chat_stream import ChatStream, PostReasoningEnd
from domain.completion import Completion, Timings
from domain.errors import HttpError, InferError, loggable
from domain.events import Progress, Queued, Retrying, Waiting
from domain.gate import Ticket
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
    not_a_stream,
    parse_props,
    parse_slots,
    parse_tokens,
    tokenize_body,
    with_model,
)
from domain.messages import ChatRequest
from domain.request import RequestSettings, build_chat_body, build_control_body, effective_max_tokens
from domain.retry import RetryPolicy
from domain.waiting import gate_timeout
from ports.clock import Clock
from ports.slot_probe import SlotProbe
from ports.transport import Exchange, Transport, ResponseHead, TimedOut

__all__ = ["LlamaCalls"]

log = logging.getLogger("inferpath.client")


class LlamaCalls:
    """The I/O of one client's calls, over the ports it is given. Safe to share between calls."""

    def __init__(
        self,
        *,
        transport: Transport,
        probe: SlotProbe,
        clock: Clock,
        queue: SlotQueue,
        retry_policy: RetryPolicy,
        request_settings: RequestSettings,
        limits: ClientLimits,
        total_slots: int | None,
    ) -> None:
        self._transport = transport
        self._probe = probe
        self._clock = clock
        self._queue = queue
        self._retry = retry_policy
        self._settings = request_settings
        self._limits = limits
        self._total_slots = total_slots
        self._last_timings: dict[int, Timings] = {}

    # -- a chat -------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock.now()

    def sleep(self, seconds: float, token: CancelToken) -> None:
        self._clock.sleep(seconds, token)

    def retrying(self, slot: int, attempt: int, error: InferError, elapsed_ms: float) -> Retrying:
        """The `Retrying` event after attempt number `attempt` failed with `error` (logged at
        WARNING with how long the retries may still wait), or `error` raised if it is not retried."""
        policy = self._retry
        decision = policy.decide(attempt, error, elapsed_ms)
        if not decision.retry:
            raise error
        log.warning(
            "slot %d: retrying as attempt %d in %d ms after %s (attempt %d of %d; at most %d ms of waits left)",
            slot,
            decision.attempt,
            decision.after_ms,
            loggable(error),
            decision.attempt,
            policy.attempts,
            policy.waits_left_ms(decision.attempt, elapsed_ms),
        )
        return Retrying(attempt=decision.attempt, after_ms=decision.after_ms, error=f"{type(error).__name__}: {error}")

    def attempt(self, req: ChatRequest, body: bytes, token: CancelToken) -> Generator[Step, None, None]:
        """One attempt: through the slot gate (queued, emitting `Queued`, at most `busy_wait_ms`),
        open + send, the head (with its polls), then the stream to its `Completion`; the slot is
        given back on every way out."""
        limits = self._limits
        clock = self._clock
        slot = req.slot
        queue = self._queue
        token.raise_if_cancelled()
        ticket = queue.enter(slot)
        try:
            if ticket.ahead:
                for queued in self._queued(ticket, slot, token):
                    yield queued
            token.raise_if_cancelled()  # a close() that began while we queued: nothing is sent
            exchange = self._transport.open(
                "POST", CHAT_PATH, body, timeout=limits.poll_ms / 1000.0, cancel=token
            )
        except BaseException:
            queue.leave(ticket)
            raise
        try:
            head: ResponseHead | None = None
            for waited in self._head(exchange, slot, token):
                if isinstance(waited, ResponseHead):
                    head = waited
                else:
                    yield waited
            assert head is not None
            if head.status != 200:
                kept = error_body(exchange, clock, clock.now() + limits.liveness_s, limits.error_body_bytes)
                raise HttpError(head.status, kept, limits.error_body_bytes)
            refused = not_a_stream(head)
            if refused is not None:
                raise refused
            read = exchange.read
            stream = ChatStream(limits.stream, effective_max_tokens(req, self._settings), clock.now())
            started = clock.now()
            first = True
            while True:
                data = read(stream.timeout(clock.now()))
                if isinstance(data, TimedOut):
                    stream.silence(clock.now())
                    continue
                for step in stream.feed(data, clock.now()):
                    if isinstance(step, PostReasoningEnd):
                        refusal = self._post_reasoning_end(step.completion_id, token)
                        log.debug("reasoning_end posted: %s", "accepted" if refusal is None else "refused")
                        yield stream.control_answered(refusal)
                    elif isinstance(step, InferError):
                        raise step
                    elif isinstance(step, Completion):
                        self._log_done(slot, step)
                        yield step
                        return
                    else:
                        if first and not isinstance(step, Progress):
                            first = False
                            log.debug("first token %.0f ms after the head", (clock.now() - started) * 1000)
                        yield step
        finally:
            exchange.close()
            queue.leave(ticket)

    def _queued(self, ticket: Ticket, slot: int, token: CancelToken) -> Generator[Queued, None, None]:
        """Wait at the gate until the ticket holds its slot, emitting `Queued` each time it moves
        up; `WaitTimeout` past `busy_wait_ms`."""
        queue = self._queue
        deadline = queue.deadline(self._limits.gate_wait_s)
        ahead = ticket.ahead
        while ahead:
            log.debug("slot %d: queued, %d ahead", slot, ahead)
            yield Queued(ahead)
            moved = queue.wait(ticket, token, deadline)
            if isinstance(moved, TimedOut):
                raise gate_timeout(slot, self._limits.gate_wait_s, self._limits.busy_wait_ms)
            ahead = moved

    def _head(
        self, exchange: Exchange, slot: int, token: CancelToken
    ) -> Generator[Waiting | ResponseHead, None, None]:
        """Wait for the response head, asking `/slots` each `poll_ms`: `Waiting` events, then the
        head."""
        clock = self._clock
        sent = clock.now()
        wait = self._limits.first_byte_wait(sent, slot)
        while isinstance(head := exchange.head(wait.timeout(clock.now())), TimedOut):
            decision = wait.on_poll(clock.now(), self._probe.state(slot, token))
            token.raise_if_cancelled()
            yield decision.event
            if decision.error is not None:
                raise decision.error
        log.debug("slot %d: response head %d after %.0f ms", slot, head.status, (clock.now() - sent) * 1000)
        yield head

    def _post_reasoning_end(self, completion_id: str, token: CancelToken) -> str | None:
        """Ask the server to end the thinking block on a second connection: None when it answers
        `{"success": true}`, else what went wrong."""
        try:
            body = build_control_body(completion_id, self._settings.model)
            answer = fetch(
                self._transport, self._clock, "POST", CONTROL_PATH, body, self._limits.control(), token
            )
            return control_refusal(answer)
        except InferError as exc:
            token.raise_if_cancelled()
            return f"{type(exc).__name__}: {exc}"

    def _log_done(self, slot: int, completion: Completion) -> None:
        """The debug lines of a finished call, with the cache outcome against the slot's last one."""
        t = completion.timings
        log.debug(
            "slot %d: %s, %d prompt tokens (%d cached), %d predicted, %d reasoning%s",
            slot,
            completion.finish_reason.value,
            t.prompt_n + t.cache_n,
            t.cache_n,
            t.predicted_n,
            completion.reasoning_tokens,
            ", thinking capped" if completion.thinking_capped else "",
        )
        previous = self._last_timings.get(slot)
        self._last_timings[slot] = t
        if previous is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("slot %d: against the request before it: %s", slot, cache_outcome(previous, t))

    # -- the small calls ----------------------------------------------------------------------

    def render(self, req: ChatRequest, token: CancelToken) -> bytes:
        """The exact request body `chat` sends for `req` (validated, deterministic)."""
        return build_chat_body(req, self._settings, total_slots=self._slot_count(token))

    def props(self, token: CancelToken) -> Props:
        return parse_props(self._get(PROPS_PATH, token))

    def slots(self, token: CancelToken) -> list[SlotInfo]:
        return parse_slots(self._get(SLOTS_PATH, token))

    def tokenize(self, text: str, token: CancelToken) -> list[Token]:
        body = tokenize_body(text, self._settings.model)
        return parse_tokens(
            fetch(self._transport, self._clock, "POST", TOKENIZE_PATH, body, self._limits.info(), token)
        )

    def _get(self, path: str, token: CancelToken) -> bytes:
        path = with_model(path, self._settings.model)
        return fetch(self._transport, self._clock, "GET", path, None, self._limits.info(), token)

    def _slot_count(self, token: CancelToken) -> int:
        if self._total_slots is None:
            token.raise_if_cancelled()
            self._total_slots = (self.props(token)).total_slots
        return self._total_slots
