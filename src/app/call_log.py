"""The debug lines of a finished call, the same for both flavours."""

from __future__ import annotations

import logging

from domain.cache import cache_outcome
from domain.completion import Completion, Timings

__all__ = ["log_done"]

log = logging.getLogger("inferpath.client")


def log_done(last_timings: dict[int, Timings], slot: int, completion: Completion) -> None:
    """The counts of a finished call, and the cache outcome against the slot's previous one
    (`last_timings`, per slot, is updated)."""
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
