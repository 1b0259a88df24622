"""What a call logs, the same for both flavours: the WARNING line of a retry the attempt machine
(`domain.attempt`) decided and the DEBUG lines of a finished call. No line carries the server's
text (`loggable`)."""

from __future__ import annotations

import logging

from domain.attempt import Next
from domain.cache import cache_outcome
from domain.completion import Completion, Timings
from domain.errors import InferError, loggable
from domain.events import Retrying
from domain.retry import Attempts

__all__ = ["log_done", "log_resent_at_once", "log_retry"]

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
        log.debug(
            "slot %d: against the request before it: %s",
            slot,
            cache_outcome(previous, t, loss_tokens),
        )


def log_retry(
    slot: int, attempts: Attempts, taken: Next, now: float, *, offset: int | None = None
) -> Retrying:
    """Log the retry the attempt machine decided (`taken`) at WARNING, with how long the retries
    may still wait, and return its `Retrying` event. `offset` is where a re-attach will pick the
    body up, when the next try is one."""
    how = "re-send" if offset is None else f"re-attach at body byte {offset}"
    event = taken.event
    log.warning(
        "slot %d: %s as attempt %d in %d ms after %s"
        " (attempt %d of %d; at most %d ms of waits left)",
        slot,
        how,
        event.attempt,
        event.after_ms,
        loggable(taken.error),
        event.attempt,
        attempts.policy.attempts,
        round(attempts.waits_left_s(now) * 1000),
    )
    return event


def log_resent_at_once(slot: int, attempt: int, cut: InferError) -> None:
    """The WARNING line of a re-attach the server refused (it forgot the conversation, or the
    offset left its ring): the running attempt sends the request again at once."""
    log.warning(
        "slot %d: re-send at once within attempt %d after %s:"
        " the server cannot give the rest of the stream",
        slot,
        attempt,
        loggable(cut),
    )
