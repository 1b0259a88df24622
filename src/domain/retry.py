"""Which failures are worth another attempt, and when to make it.

The client loops: attempt -> on a failure `decide(attempt, error, elapsed_ms)` -> if `retry`,
emit `Retrying(decision.attempt, decision.after_ms, str(error))`, sleep `after_ms` on its clock,
go back through the slot gate and send the same bytes again; otherwise raise the error.

Pinned where the brief is silent:
- `attempt` passed in is the 1-based number of the attempt that just failed; the decision's
  `attempt` (and so `Retrying.attempt`) is the number of the attempt about to be made (2, 3, ...).
- `elapsed_ms` is measured from the start of the first attempt and includes every attempt and
  every wait. A retry is taken only if its wait ends strictly before `total_ms`
  (`elapsed_ms + after_ms < total_ms`): a wait that would reach or cross the budget is not taken.
  The next attempt's own duration cannot be known (a stream has no total deadline), so it is not
  required to fit; an attempt running when the budget ends is not cut short.
- The jittered wait is `round(delay * (1 + u))` with `u` uniform in `[-jitter, +jitter]`, never
  negative; the budget is checked against the jittered wait, the one actually slept.
- If there are fewer delays than gaps between attempts, the last delay repeats.
- An error that names its own wait (`InferError.retry_after_s`: a proxy's refusal, whose bucket
  refills in 1/rate s) is retried after that wait, jittered upwards only (never before it has
  passed), instead of the schedule's delay; it counts as an attempt, under the same total.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from domain.errors import InferError

# The refill time of inferproxy's accept bucket at its default rate (2 a second): the wait after
# a refusal when the client knows no other rate.
REFILL_S = 0.5


def is_retryable(err: InferError) -> bool:
    """Whether the error's class says another attempt may succeed (`InferError.retried`, drawn
    in `domain.errors`): connect failures, a stream that closed early or stalled, a load that
    timed out, HTTP 503. Everything else is final: `WaitTimeout` has already waited, HTTP 400
    carries "exceeds the available context size" (answered by compaction), `Busy` is our own
    queue, and `ThinkingOverrun` and `ProtocolError` would happen again."""
    return err.retried


class Uniform(Protocol):
    """A random source; `random.Random` is one."""

    def uniform(self, a: float, b: float) -> float: ...


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """`retry`: wait `after_ms`, then make attempt number `attempt`. Else `reason` says why not."""

    retry: bool
    attempt: int = 0
    after_ms: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The schedule; every setting is required (the brief's values are the config's defaults).
    `rng` is the jitter's source, given by the caller: the container gives each a fresh unseeded
    `random.Random`, so clients restarted together do not retry in step."""

    attempts: int
    delays_ms: tuple[int, ...]
    jitter: float
    total_ms: int
    rng: Uniform = field(compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")
        if self.attempts > 1 and not self.delays_ms:
            raise ValueError("delays_ms needs at least one delay when attempts > 1")
        if any(d < 0 for d in self.delays_ms):
            raise ValueError(f"delays_ms must not be negative: {self.delays_ms}")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter must be in [0, 1), not {self.jitter}")
        if self.total_ms <= 0:
            raise ValueError(f"total_ms must be positive, not {self.total_ms}")

    def decide(self, attempt: int, error: InferError, elapsed_ms: float) -> RetryDecision:
        """Whether to retry after attempt number `attempt` (1-based) failed with `error`."""
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, not {attempt}")
        if not is_retryable(error):
            return RetryDecision(False, reason=f"{type(error).__name__} is not retried")
        if attempt >= self.attempts:
            return RetryDecision(False, reason=f"all {self.attempts} attempts made")
        if error.retry_after_s is not None:
            factor = 1.0 + self.rng.uniform(0.0, self.jitter)  # never sooner than asked
            after_ms = max(0, round(error.retry_after_s * 1000.0 * factor))
        else:
            delay = self.delays_ms[min(attempt - 1, len(self.delays_ms) - 1)]
            after_ms = max(0, round(delay * (1.0 + self.rng.uniform(-self.jitter, self.jitter))))
        if elapsed_ms + after_ms >= self.total_ms:
            return RetryDecision(
                False,
                reason=(
                    f"a wait of {after_ms} ms after {elapsed_ms:.0f} ms would reach the {self.total_ms} ms retry budget"
                ),
            )
        return RetryDecision(True, attempt=attempt + 1, after_ms=after_ms)

    def waits_left_ms(self, attempt: int, elapsed_ms: float) -> int:
        """The longest the retries can still wait in all, before attempt number `attempt` is
        made: every remaining delay at its largest jitter, never past `total_ms`."""
        gaps = range(attempt - 1, self.attempts)
        longest = sum(self.delays_ms[min(gap - 1, len(self.delays_ms) - 1)] for gap in gaps if gap >= 1)
        return max(0, min(round(longest * (1.0 + self.jitter)), round(self.total_ms - elapsed_ms)))


class Attempts:
    """The attempts of one call under a `RetryPolicy`: which one runs (`number`, from 1) and when
    the call started (`started`, on the caller's clock). Re-sends and re-attaches count alike."""

    __slots__ = ("number", "policy", "started")

    def __init__(self, policy: RetryPolicy, started: float) -> None:
        self.policy = policy
        self.started = started
        self.number = 1

    def next(self, error: InferError, now: float) -> RetryDecision:
        """The decision after the running attempt failed with `error`; a retry moves `number` on."""
        decision = self.policy.decide(self.number, error, (now - self.started) * 1000.0)
        if decision.retry:
            self.number = decision.attempt
        return decision

    def waits_left_ms(self, now: float) -> int:
        return self.policy.waits_left_ms(self.number, (now - self.started) * 1000.0)
