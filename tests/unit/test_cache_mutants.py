"""cache_outcome keeps the tolerance it was given and names a bad one."""

from __future__ import annotations

import pytest

from domain.cache import cache_outcome
from domain.completion import Timings

PREVIOUS = Timings(cache_n=100, prompt_n=900, predicted_n=200)


def test_the_outcome_carries_the_tolerance_it_was_judged_by() -> None:
    outcome = cache_outcome(PREVIOUS, Timings(cache_n=1185), loss_tokens=10)
    assert outcome.lost
    assert outcome.loss_tokens == 10
    assert str(outcome) == (
        "cache loss: reused 1185 of the 1200 tokens the previous request left in the slot; "
        "15 processed again, more than the 10 allowed"
    )


def test_a_negative_tolerance_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError) as caught:
        cache_outcome(PREVIOUS, PREVIOUS, loss_tokens=-3)
    assert str(caught.value) == "loss_tokens must not be negative, not -3"
