"""What a call logs, the same for both flavours: the WARNING line of a retry (with its decision)
and the DEBUG lines of a finished call. No line carries the server's text (`loggable`)."""

from __future__ import annotations

import logging

from domain.cache import cache_outcome
from domain.completion import Completion, Timings
from domain.errors import InferError, loggable
from domain.events import Retrying
from domain.retry import Attempts

__all__ = ["log_done", "resent_at_once", "retrying"]

log = logging.getLogger("inferpath.client")


def log_done(slot: int, completion: Completion, previous: Timings | None, loss_tokens: int) -> None:
    """The counts of a finished call, and the cache outcome against the slot's previous request
    (`previous`, None when the client ran none there)."""
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
    if previous is not None and log.isEnabledFor(logging.DEBUG):
        log.debug("slot %d: against the request before it: %s", slot, cache_outcome(previous, t, loss_tokens))


def retrying(slot: int, attempts: Attempts, error: InferError, now: float, *, offset: int | None = None) -> Retrying:
    """The `Retrying` event after the running attempt failed with `error` at `now` (logged at
    WARNING with how long the retries may still wait), or `error` raised if it is not retried.
    `offset` is where a re-attach will pick the body up, when the next attempt is one."""
    decision = attempts.next(error, now)
    if not decision.retry:
        raise error
    how = "re-send" if offset is None else f"re-attach at body byte {offset}"
    log.warning(
        "slot %d: %s as attempt %d in %d ms after %s (attempt %d of %d; at most %d ms of waits left)",
        slot,
        how,
        decision.attempt,
        decision.after_ms,
        loggable(error),
        decision.attempt,
        attempts.policy.attempts,
        attempts.waits_left_ms(now),
    )
    error_text = f"{type(error).__name__}: {error}"
    return Retrying(attempt=decision.attempt, after_ms=decision.after_ms, error=error_text, resend=offset is None)


def resent_at_once(slot: int, attempts: Attempts, cut: InferError) -> Retrying:
    """The `Retrying` of a re-attach the server refused (it forgot the conversation, or the
    offset left its ring): the running attempt sends the request again at once (logged)."""
    log.warning(
        "slot %d: re-send at once within attempt %d after %s: the server cannot give the rest of the stream",
        slot,
        attempts.number,
        loggable(cut),
    )
    return Retrying(attempt=attempts.number, after_ms=0, error=f"{type(cut).__name__}: {cut}", resend=True)
