"""What the sync and the asyncio client do alike around the I/O of one call, in one place: the
limits of the small requests, the head wait's policy, the check that a 200 answer is a stream,
the tokenize body, and the log lines of a finished call.

Pure apart from logging; each client keeps only its own way of waiting.
"""

from __future__ import annotations

import logging

import orjson

from domain.cache import cache_outcome
from domain.completion import Completion, Timings
from domain.errors import InferError, ProtocolError, RequestError
from domain.events import Retrying
from domain.fetch import FetchLimits
from domain.limits import ClientLimits
from domain.llama_api import CHAT_PATH
from domain.retry import RetryPolicy
from domain.waiting import FirstByteWait
from ports.transport import ResponseHead

__all__ = [
    "control_limits",
    "first_byte_wait",
    "info_limits",
    "log_done",
    "not_a_stream",
    "retrying",
    "tokenize_body",
]


def info_limits(limits: ClientLimits) -> FetchLimits:
    """`/props`, `/slots`, `/tokenize`: they may meet a router loading the model."""
    liveness_s = limits.stream.liveness_ms / 1000.0
    return FetchLimits(limits.load_wait_ms / 1000.0, liveness_s, limits.body_bytes, limits.error_body_bytes)


def control_limits(limits: ClientLimits) -> FetchLimits:
    """`reasoning_end`: made while the stream is not read, so it gets the liveness limit."""
    liveness_s = limits.stream.liveness_ms / 1000.0
    return FetchLimits(liveness_s, liveness_s, limits.body_bytes, limits.error_body_bytes)


def first_byte_wait(limits: ClientLimits, sent: float, slot: int) -> FirstByteWait:
    return FirstByteWait(
        poll_ms=limits.poll_ms,
        busy_wait_ms=limits.busy_wait_ms,
        load_wait_ms=limits.load_wait_ms,
        idle_grace_ms=limits.idle_grace_ms,
        sent_at=sent,
        slot=slot,
    )


def not_a_stream(head: ResponseHead) -> ProtocolError | None:
    """A whole answer where a stream was asked for would read as a stream without its final
    chunk and be retried; it is a server that ignored `stream: true`."""
    kind = head.header("content-type")
    if kind is not None and not kind.lower().startswith("text/event-stream"):
        return ProtocolError(f"POST {CHAT_PATH}: 200 answer is {kind!r}, not an event stream")
    return None


def tokenize_body(text: object, model: str | None) -> bytes:
    if type(text) is not str:
        raise RequestError(f"tokenize takes text (a str), not {type(text).__name__}")
    try:
        return orjson.dumps({"content": text, "with_pieces": True, "model": model})
    except orjson.JSONEncodeError as exc:
        raise RequestError(f"the text to tokenize is not valid Unicode ({exc})") from exc


def retrying(
    log: logging.Logger, policy: RetryPolicy, slot: int, attempt: int, error: InferError, elapsed_ms: float
) -> Retrying | None:
    """The `Retrying` event after attempt number `attempt` failed with `error` (logged at
    WARNING with how long the retries may still wait), or None when it is not retried."""
    decision = policy.decide(attempt, error, elapsed_ms)
    if not decision.retry:
        return None
    reason = f"{type(error).__name__}: {error}"
    left_ms = policy.waits_left_ms(decision.attempt, elapsed_ms)
    log.warning(
        "slot %d: retrying as attempt %d in %d ms after %s (attempt %d of %d; at most %d ms of waits left)",
        slot,
        decision.attempt,
        decision.after_ms,
        reason,
        decision.attempt,
        policy.attempts,
        left_ms,
    )
    return Retrying(attempt=decision.attempt, after_ms=decision.after_ms, error=reason)


def log_done(log: logging.Logger, last_timings: dict[int, Timings], slot: int, completion: Completion) -> None:
    """The debug lines of a finished call; `last_timings` (per slot) gives the cache outcome."""
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
    previous = last_timings.get(slot)
    last_timings[slot] = t
    if previous is not None and log.isEnabledFor(logging.DEBUG):
        log.debug("slot %d: against the request before it: %s", slot, cache_outcome(previous, t))
