"""Did a request reuse the server's prompt cache from the request before it on the same slot?

The previous request left `cache_n + prompt_n + predicted_n` tokens in the slot (its prompt and
its answer). A follow-up that extends it should find nearly all of them cached: the answer's
last token and the template's re-rendering of it may differ, hence a tolerance. A request whose
whole prompt (`cache_n + prompt_n`) is shorter than that (the same request again, a shorter
one) can reuse no more than its own prompt: that is what it is held to. More than `loss_tokens`
short is a loss; exactly `loss_tokens` short is not. A pure function; the caller logs or checks
the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.completion import Timings

CACHE_LOSS_TOKENS = 64


@dataclass(frozen=True, slots=True)
class CacheOutcome:
    lost: bool
    expected: int  # tokens the previous request left in the slot, at most this request's prompt
    cached: int  # tokens this request found cached
    loss_tokens: int = CACHE_LOSS_TOKENS

    @property
    def shortfall(self) -> int:
        """Tokens the cache fell short of `expected` (0 if it did not)."""
        return max(0, self.expected - self.cached)

    def __str__(self) -> str:
        verdict, bound = ("cache loss", "more than") if self.lost else ("cache hit", "no more than")
        return (
            f"{verdict}: reused {self.cached} of the {self.expected} tokens it could"
            " of what the previous request"
            " left in the slot; "
            f"{self.shortfall} processed again, {bound} the {self.loss_tokens} allowed"
        )


def cache_outcome(
    previous: Timings, current: Timings, loss_tokens: int = CACHE_LOSS_TOKENS
) -> CacheOutcome:
    if loss_tokens < 0:
        raise ValueError(f"loss_tokens must not be negative, not {loss_tokens}")
    expected = previous.cache_n + previous.prompt_n + previous.predicted_n
    if current.prompt_n:  # a prompt of its own known: no more of it can be reused
        expected = min(expected, current.cache_n + current.prompt_n)
    cached = current.cache_n
    return CacheOutcome(expected - cached > loss_tokens, expected, cached, loss_tokens)
