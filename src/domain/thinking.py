"""The thinking cap: when to ask the server to end reasoning, and when to give up on it.

Fed after every chunk that carried reasoning (whatever else it carried: an answer's text, a tool
call, the `finish_reason`) with the assembler's `reasoning_tokens`:

- While reasoning, reaching `cap` tokens (exactly `cap` counts) asks, once, for the client to
  post `reasoning_end` and emit `ThinkingCapped(capped_at)`; `capped_at` is the count seen then
  (chunks may carry several tokens, so it can pass `cap`).
- After that, `overrun` more reasoning tokens are tolerated (counted from the control call's
  decision only: reasoning that comes back after the budget ended a block is capped by the
  control call as any other); reasoning still going on beyond
  `capped_at + overrun` is `OVERRUN` (the client closes the connection, which cancels generation,
  and raises `ThinkingOverrun`). Once reported, `OVERRUN` is reported again on every call.
- A control call that does not answer `success: true` is `OVERRUN` too. (The server answers
  `success: false` also when the completion ended a moment before the call arrived; the brief
  treats every such answer alike.)
- A chunk without reasoning changes nothing (`in_reasoning` False), whatever the count.

With the server's own budget (`budget_sent`: the request carried `thinking_budget_tokens =
cap`), the server ends the thinking block at exactly `cap` tokens and the answer follows, with
no control call and so no race with it: `ended(tokens)`, told when the reasoning gives way to
the answer, says whether the budget ended it (`capped`, emit `ThinkingCapped`). The control call
stays as the fallback for a template without end tags (the server then ignores the budget
silently): it is asked for only past `cap + END_TAG_TOKENS`, since the end tag the server forces
is a few tokens of its own, counted by `predicted_n` while the block is still open. Reasoning
that reached that point before it gave way to the answer (in the same chunk) was not ended by
the budget: the control call caps it, as it would have a chunk earlier.
"""

from __future__ import annotations

import enum

from domain.errors import ThinkingOverrun

# The tokens of the end tag the server's budget forces (about 6 for `</think>\n\n`), with room.
END_TAG_TOKENS = 8


class Action(enum.Enum):
    NONE = "none"
    POST_REASONING_END = "post_reasoning_end"
    OVERRUN = "overrun"


class ThinkingCap:
    __slots__ = (
        "_budget_sent",
        "_cap",
        "_overran",
        "_overrun",
        "_posted",
        "_trigger",
        "acts_from",
        "capped",
        "capped_at",
    )

    def __init__(self, cap: int, overrun: int, *, budget_sent: bool = False) -> None:
        if cap <= 0 or overrun < 0:
            raise ValueError(
                f"thinking cap {cap} must be positive and overrun {overrun} not negative"
            )
        self._cap = cap
        self._overrun = overrun
        self._budget_sent = budget_sent
        self._trigger = cap + END_TAG_TOKENS if budget_sent else cap
        self._overran = False
        self._posted = False  # `POST_REASONING_END` decided: the overrun counts from then
        self.capped = False
        self.capped_at = 0  # the reasoning token count when `POST_REASONING_END` was decided
        # The fewest reasoning tokens at which `observe`, after a chunk with reasoning, answers
        # anything but NONE: below it the caller need not ask (it is asked on most chunks).
        self.acts_from = self._trigger

    def observe(self, reasoning_tokens: int, in_reasoning: bool) -> Action:
        """After a chunk; `in_reasoning` says whether it carried reasoning."""
        if self._overran:
            return Action.OVERRUN
        if not in_reasoning:
            return Action.NONE
        if not self._posted:  # (a budget that ended an earlier block posted nothing)
            if reasoning_tokens >= self._trigger:
                self._posted = self.capped = True
                self.capped_at = reasoning_tokens
                self.acts_from = reasoning_tokens + self._overrun + 1
                return Action.POST_REASONING_END
            return Action.NONE
        if reasoning_tokens > self.capped_at + self._overrun:
            self._overran = True
            self.acts_from = 0
            return Action.OVERRUN
        return Action.NONE

    def ended(self, reasoning_tokens: int) -> bool:
        """The reasoning gave way to the answer after `reasoning_tokens`: True when it was the
        server's budget that ended it (at the cap), which caps the thinking as the control call
        would have."""
        if (
            self.capped
            or not self._budget_sent
            or not self._cap <= reasoning_tokens < self._trigger
        ):
            return False
        self.capped = True
        self.capped_at = reasoning_tokens
        return True

    def control_answer(self, success: bool) -> Action:
        """The answer to the `reasoning_end` call: anything but `success: true` is `OVERRUN`."""
        if success is not True:
            self._overran = True
            self.acts_from = 0
            return Action.OVERRUN
        return Action.NONE

    def overrun_error(self, reasoning_tokens: int) -> ThinkingOverrun:
        """The error to raise after `observe` answered `OVERRUN`."""
        return ThinkingOverrun(
            f"reasoning went on to {reasoning_tokens} tokens after reasoning_end was posted at "
            f"{self.capped_at} (cap {self._cap}, {self._overrun} more allowed)"
        )

    def control_error(self, answer: str) -> ThinkingOverrun:
        """The error to raise after `control_answer` answered `OVERRUN`; `answer` says what the
        server said (or why there was no answer)."""
        return ThinkingOverrun(
            f"reasoning_end posted at {self.capped_at} reasoning tokens was not accepted: {answer}"
        )
