"""Refusal lines: one line per refused connection at first, then a summary at most once a period.

A connect flood must not turn into a log flood, yet a few refusals are worth a line each.

Invariants:
- At most `verbatim` refusals (10) in any period (1 s, a sliding window: the last `verbatim`
  lines' times are kept) get a line of their own. Past that the proxy is summarising: refusals
  are counted by reason, and the count is written as one line when the period ends, so a flood
  costs one line per period however fast it comes, and no period holds more than `verbatim + 1`
  lines.
- Lines of their own come back only after a whole period without a single refusal. A flood that
  pulses therefore still costs at most `verbatim + 1` lines per two periods.
- Every refusal is accounted for exactly once: in a line of its own or in one summary. `flush()`
  gives the summary of whatever is still counted (the proxy calls it when it stops).
- Periods are measured on the injected clock alone, and a summary written late (because nothing
  woke the caller at the end of the period) still describes only the period it belongs to: every
  refusal after a period's end first closes that period, so counts never leak across periods.
- No I/O and no locks: the accept loop, its only caller, writes the lines it gets back. It asks
  `seconds_until_due` for its select timeout and calls `due` after every wake-up.
"""

from collections import deque
from collections.abc import Callable

VERBATIM_PER_PERIOD = 10
PERIOD_S = 1.0


class RefusalLines:
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        verbatim: int = VERBATIM_PER_PERIOD,
        period: float = PERIOD_S,
    ) -> None:
        if verbatim < 0:
            raise ValueError(f"verbatim must be at least 0, got {verbatim}")
        if period <= 0:
            raise ValueError(f"period must be above 0, got {period}")
        self._clock = clock
        self._verbatim = verbatim
        self._period = period
        self._told: deque[float] = deque()  # times of the lines of their own in the last period
        self._summary_due: float | None = None  # set while summarising: end of the counted period
        self._counts: dict[str, int] = {}
        self._latest = clock()

    def refused(self, reason: str) -> list[str]:
        """Record one refused connection; return the lines to write now (possibly none)."""
        now = self._now()
        lines = self._due_at(now)
        if self._summary_due is None:
            told = self._told
            while told and now - told[0] >= self._period:
                told.popleft()
            if len(told) < self._verbatim:
                told.append(now)
                lines.append(f"refused a connection: {reason}")
                return lines
            self._summary_due = (told[0] if told else now) + self._period
        self._counts[reason] = self._counts.get(reason, 0) + 1
        return lines

    def due(self) -> list[str]:
        """The summary of a period that has ended, if one is waiting; otherwise nothing."""
        return self._due_at(self._now())

    def seconds_until_due(self) -> float | None:
        """How long until `due` has a line to give, by the clock; None when nothing is counted."""
        if self._summary_due is None or not self._counts:
            return None
        return max(0.0, self._summary_due - self._now())

    def flush(self) -> list[str]:
        """The summary of whatever is counted, due or not; the proxy calls it on its way out."""
        if not self._counts:
            return []
        return [self._summary()]

    @property
    def summarising(self) -> bool:
        return self._summary_due is not None

    def _due_at(self, now: float) -> list[str]:
        lines: list[str] = []
        # Runs at most twice: a summary closes one period; an empty period ends summarising.
        while self._summary_due is not None and now >= self._summary_due:
            if self._counts:
                lines.append(self._summary())
                self._summary_due += self._period
            else:
                # A whole period without a refusal: the next one gets a line of its own again.
                self._summary_due = None
        return lines

    def _summary(self) -> str:
        total = sum(self._counts.values())
        reasons = "; ".join(f"{reason}: {count}" for reason, count in self._counts.items())
        self._counts = {}
        noun = "connection" if total == 1 else "connections"
        return f"refused {total} more {noun} within {self._period:g} s [{reasons}]"

    def _now(self) -> float:
        # A clock that steps back would reopen a closed period; hold it at its latest reading.
        self._latest = max(self._latest, self._clock())
        return self._latest
