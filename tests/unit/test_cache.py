"""cache_outcome: a loss is more than `loss_tokens` short of what the previous request left."""

from __future__ import annotations

import pytest

from domain.cache import CacheOutcome, cache_outcome
from domain.completion import Timings

PREVIOUS = Timings(cache_n=100, prompt_n=900, predicted_n=200)  # 1200 tokens left in the slot


@pytest.mark.parametrize(("cached", "lost"), [(1200, False), (1137, False), (1136, False), (1135, True), (0, True)])
def test_loss_boundary_at_64_tokens_short(cached: int, lost: bool) -> None:
    outcome = cache_outcome(PREVIOUS, Timings(cache_n=cached, prompt_n=1300 - cached, predicted_n=10))  # 1300 in all
    assert outcome.lost is lost
    assert outcome.expected == 1200
    assert outcome.cached == cached


def test_more_cached_than_expected_is_a_hit() -> None:
    outcome = cache_outcome(PREVIOUS, Timings(cache_n=1300))
    assert not outcome.lost
    assert outcome.shortfall == 0


def test_loss_tokens_is_configurable() -> None:
    assert cache_outcome(PREVIOUS, Timings(cache_n=1190), loss_tokens=10).lost is False
    assert cache_outcome(PREVIOUS, Timings(cache_n=1189), loss_tokens=10).lost is True
    assert cache_outcome(PREVIOUS, Timings(cache_n=1199), loss_tokens=0).lost is True


def test_first_request_on_an_empty_slot_is_not_a_loss() -> None:
    assert not cache_outcome(Timings(), Timings(cache_n=0, prompt_n=500)).lost


def test_outcome_reads_with_both_numbers() -> None:
    assert str(cache_outcome(PREVIOUS, Timings(cache_n=100))) == (
        "cache loss: reused 100 of the 1200 tokens it could of what the previous request left in the slot; "
        "1100 processed again, more than the 64 allowed"
    )
    # A hit with tokens processed again reads as a hit and says why: the shortfall is tolerated.
    assert str(cache_outcome(PREVIOUS, Timings(cache_n=1190))) == (
        "cache hit: reused 1190 of the 1200 tokens it could of what the previous request left in the slot; "
        "10 processed again, no more than the 64 allowed"
    )
    assert str(cache_outcome(PREVIOUS, Timings(cache_n=1136))).endswith(
        "64 processed again, no more than the 64 allowed"
    )


def test_outcome_is_a_value() -> None:
    assert cache_outcome(PREVIOUS, Timings(cache_n=1190)) == CacheOutcome(False, 1200, 1190)


def test_negative_loss_tokens_is_refused() -> None:
    with pytest.raises(ValueError):
        cache_outcome(PREVIOUS, PREVIOUS, loss_tokens=-1)


# -- the tolerance an outcome carries, and the words of a bad tolerance's refusal ------------------


def test_the_outcome_carries_the_tolerance_it_was_judged_by() -> None:
    outcome = cache_outcome(PREVIOUS, Timings(cache_n=1185), loss_tokens=10)
    assert outcome.lost
    assert outcome.loss_tokens == 10
    assert str(outcome) == (
        "cache loss: reused 1185 of the 1200 tokens it could of what the previous request left in the slot; "
        "15 processed again, more than the 10 allowed"
    )


def test_a_negative_tolerance_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError) as caught:
        cache_outcome(PREVIOUS, PREVIOUS, loss_tokens=-3)
    assert str(caught.value) == "loss_tokens must not be negative, not -3"


def test_the_same_request_again_is_held_to_its_own_prompt_not_to_the_answer_after_it() -> None:
    # A 32-token question answered in 300 tokens, then asked again: 31 reused, 1 processed (the
    # server always processes one); the answer the slot also holds is no part of this prompt.
    outcome = cache_outcome(Timings(cache_n=0, prompt_n=32, predicted_n=300), Timings(cache_n=31, prompt_n=1))
    assert not outcome.lost
    assert (outcome.expected, outcome.cached, outcome.shortfall) == (32, 31, 1)


def test_a_shorter_prompt_that_reused_little_of_itself_is_still_a_loss() -> None:
    outcome = cache_outcome(PREVIOUS, Timings(cache_n=10, prompt_n=490))
    assert outcome.lost and outcome.expected == 500
