"""Which failures are worth another attempt, and when to make it.

The client loops: attempt -> on a failure `decide(attempt, error, elapsed_s)` -> if `retry`,
emit `Retrying` (its `after_ms` the decision's `after_s`), sleep `after_s` on its clock, go back
through the slot gate and send the same bytes again; otherwise raise the error.

Times are seconds: the config's `delays_ms` and `total_ms` are turned into `delays_s` and
`total_s` once, where the config is read (`app.container`); messages say milliseconds.

Pinned where the brief is silent:
- `attempt` passed in is the 1-based number of the attempt that just failed; the decision's
  `attempt` (and so `Retrying.attempt`) is the number of the attempt about to be made (2, 3, ...).
- `elapsed_s` is measured from the start of the first attempt and includes every attempt and
  every wait. A retry is taken only if its wait ends strictly before `total_s`
  (`elapsed_s + after_s < total_s`, to within a nanosecond): a wait that would reach or cross
  the budget is not taken.
  The next attempt's own duration cannot be known (a stream has no total deadline), so it is not
  required to fit; an attempt running when the budget ends is not cut short.
- The jittered wait is `delay * (1 + u)` rounded to the millisecond (what `Retrying.after_ms`
  says), with `u` uniform in `[-jitter, +jitter]`, never negative; the budget is checked against
  the jittered wait, the one actually slept.
- If there are fewer delays than gaps between attempts, the last delay repeats.
- An error that names its own wait (`InferError.retry_after_s`: a proxy's refusal, whose bucket
  refills in 1/rate s) is retried after that wait, jittered upwards only (never before it has
  passed), instead of the schedule's delay; it counts as an attempt, under the same total. A
  refusal right after one is an outage, not a refusal: the schedule's delays from then on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from domain.errors import InferError

# Times are float seconds; a budget reached to within a nanosecond is reached.
_EPS_S = 1e-9


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


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
    """`retry`: wait `after_s`, then make attempt number `attempt`. Else `reason` says why not."""

    retry: bool
    attempt: int = 0
    after_s: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The schedule; every setting is required (the brief's values are the config's defaults).
    `rng` is the jitter's source, given by the caller: the container gives each a fresh unseeded
    `random.Random`, so clients restarted together do not retry in step."""

    attempts: int
    delays_s: tuple[float, ...]
    jitter: float
    total_s: float
    rng: Uniform = field(compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")
        if self.attempts > 1 and not self.delays_s:
            raise ValueError("delays_s needs at least one delay when attempts > 1")
        if any(d < 0 for d in self.delays_s):
            raise ValueError(f"delays_s must not be negative: {self.delays_s}")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter must be in [0, 1), not {self.jitter}")
        if self.total_s <= 0:
            raise ValueError(f"total_s must be positive, not {self.total_s}")

    def decide(
        self, attempt: int, error: InferError, elapsed_s: float, *, asked: bool = True
    ) -> RetryDecision:
        """Whether to retry after attempt number `attempt` (1-based) failed with `error`; the
        wait the error asks for (`retry_after_s`) is taken only if `asked`."""
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, not {attempt}")
        if not is_retryable(error):
            return RetryDecision(False, reason=f"{type(error).__name__} is not retried")
        if attempt >= self.attempts:
            return RetryDecision(False, reason=f"all {self.attempts} attempts made")
        if asked and error.retry_after_s is not None:
            factor = 1.0 + self.rng.uniform(0.0, self.jitter)  # never sooner than asked
            after_s = max(0.0, round(error.retry_after_s * factor, 3))
        else:
            delay = self.delays_s[min(attempt - 1, len(self.delays_s) - 1)]
            factor = 1.0 + self.rng.uniform(-self.jitter, self.jitter)
            after_s = max(0.0, round(delay * factor, 3))
        if elapsed_s + after_s >= self.total_s - _EPS_S:
            wait = f"a wait of {_ms(after_s)} after {_ms(elapsed_s)}"
            reason = f"{wait} would reach the {_ms(self.total_s)} retry budget"
            return RetryDecision(False, reason=reason)
        return RetryDecision(True, attempt=attempt + 1, after_s=after_s)

    def waits_left_s(self, attempt: int, elapsed_s: float) -> float:
        """The longest the retries can still wait in all, before attempt number `attempt` is
        made: every remaining delay at its largest jitter, never past `total_s`."""
        delays, gaps = self.delays_s, range(max(attempt - 1, 1), self.attempts)
        longest = sum(delays[min(gap - 1, len(delays) - 1)] for gap in gaps)
        return max(0.0, min(longest * (1.0 + self.jitter), self.total_s - elapsed_s))


class Attempts:
    """The attempts of one call under a `RetryPolicy`: which one runs (`number`, from 1) and when
    the call started (`started`, on the caller's clock). Re-sends and re-attaches count alike."""

    __slots__ = ("asked", "number", "outage", "policy", "started")

    def __init__(self, policy: RetryPolicy, started: float) -> None:
        self.policy = policy
        self.started = started
        self.number = 1
        self.asked = False  # the last retry waited what its error asked for (a refusal's refill)
        self.outage = False  # a refusal came right after a refill: the schedule's waits from now

    def next(self, error: InferError, now: float) -> RetryDecision:
        """The decision after the running attempt failed with `error`; a retry moves `number` on.
        A refusal right after the bucket's refill is no refusal a refill mends (a proxy whose
        upstream is down closes alike): from then on the waits are the schedule's, as for an
        outage."""
        refused = error.retry_after_s is not None
        self.outage = self.outage or (refused and self.asked)
        asking = refused and not self.outage
        decision = self.policy.decide(self.number, error, now - self.started, asked=asking)
        if decision.retry:
            self.number = decision.attempt
            self.asked = asking
        return decision

    def waits_left_s(self, now: float) -> float:
        return self.policy.waits_left_s(self.number, now - self.started)
