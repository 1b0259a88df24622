"""The thinking cap: post reasoning_end once at the cap, give up past the overrun."""

from __future__ import annotations

import pytest

from domain.errors import ThinkingOverrun
from domain.thinking import Action, ThinkingCap

NONE, POST, OVERRUN = Action.NONE, Action.POST_REASONING_END, Action.OVERRUN


def test_below_the_cap_nothing_happens() -> None:
    cap = ThinkingCap(4096, 256)
    assert cap.observe(4095, True) is NONE
    assert not cap.capped
    assert cap.capped_at == 0


def test_exactly_at_the_cap_posts_reasoning_end_once() -> None:
    cap = ThinkingCap(4096, 256)
    assert cap.observe(4096, True) is POST
    assert cap.capped and cap.capped_at == 4096
    assert cap.observe(4097, True) is NONE


def test_a_chunk_jumping_past_the_cap_posts_at_the_count_seen() -> None:
    cap = ThinkingCap(10, 5)
    assert cap.observe(9, True) is NONE
    assert cap.observe(12, True) is POST
    assert cap.capped_at == 12


@pytest.mark.parametrize(("tokens", "action"), [(4096 + 255, NONE), (4096 + 256, NONE), (4096 + 257, OVERRUN)])
def test_overrun_boundary_counts_from_the_post(tokens: int, action: Action) -> None:
    # `overrun` more tokens are tolerated after the post; the one after that is an overrun.
    cap = ThinkingCap(4096, 256)
    cap.observe(4096, True)
    assert cap.observe(tokens, True) is action


def test_reasoning_that_ends_after_the_post_is_fine_whatever_the_count() -> None:
    cap = ThinkingCap(10, 2)
    assert cap.observe(10, True) is POST
    assert cap.observe(11, True) is NONE
    assert cap.observe(500, False) is NONE  # content tokens: predicted_n grows, reasoning is over


def test_outside_the_thinking_block_the_cap_never_fires() -> None:
    cap = ThinkingCap(10, 2)
    assert cap.observe(10_000, False) is NONE
    assert not cap.capped


def test_overrun_is_reported_again_once_reported() -> None:
    cap = ThinkingCap(10, 2)
    cap.observe(10, True)
    assert cap.observe(13, True) is OVERRUN
    assert cap.observe(13, False) is OVERRUN


def test_control_call_that_is_not_a_success_is_an_overrun() -> None:
    cap = ThinkingCap(10, 2)
    cap.observe(10, True)
    assert cap.control_answer(True) is NONE
    assert ThinkingCap(10, 2).control_answer(False) is OVERRUN


def test_control_failure_sticks() -> None:
    cap = ThinkingCap(10, 2)
    cap.observe(10, True)
    cap.control_answer(False)
    assert cap.observe(11, True) is OVERRUN


def test_section_4_sequence_capped_then_content() -> None:
    # Reasoning to the cap, the post is accepted, a few tokens more, then the answer.
    cap = ThinkingCap(4, 3)
    actions = [cap.observe(n, True) for n in (1, 2, 3, 4)]
    assert actions == [NONE, NONE, NONE, POST]
    assert cap.control_answer(True) is NONE
    assert [cap.observe(n, True) for n in (5, 6)] == [NONE, NONE]
    assert [cap.observe(6, False) for _ in range(3)] == [NONE] * 3


def test_errors_name_the_counts() -> None:
    cap = ThinkingCap(4096, 256)
    cap.observe(4100, True)
    overrun = cap.overrun_error(4357)
    assert isinstance(overrun, ThinkingOverrun)
    assert str(overrun) == (
        "reasoning went on to 4357 tokens after reasoning_end was posted at 4100 (cap 4096, 256 more allowed)"
    )
    control = cap.control_error("no active completion for this id")
    assert str(control) == (
        "reasoning_end posted at 4100 reasoning tokens was not accepted: no active completion for this id"
    )


@pytest.mark.parametrize(("cap", "overrun"), [(0, 1), (-1, 1), (1, -1)])
def test_bad_settings_are_refused(cap: int, overrun: int) -> None:
    with pytest.raises(ValueError):
        ThinkingCap(cap, overrun)


def test_zero_overrun_gives_up_on_the_first_token_after_the_post() -> None:
    cap = ThinkingCap(10, 0)
    cap.observe(10, True)
    assert cap.observe(10, True) is NONE
    assert cap.observe(11, True) is OVERRUN


# -- the smallest cap, and the words of a refusal --------------------------------------------------


def test_a_cap_of_one_token_asks_to_end_reasoning_at_the_first_token() -> None:
    cap = ThinkingCap(1, 0)
    assert cap.observe(0, in_reasoning=True) is Action.NONE
    assert cap.observe(1, in_reasoning=True) is Action.POST_REASONING_END
    assert cap.observe(2, in_reasoning=True) is Action.OVERRUN


def test_a_cap_of_zero_is_refused_with_both_settings_named() -> None:
    with pytest.raises(ValueError) as caught:
        ThinkingCap(0, 5)
    assert str(caught.value) == "thinking cap 0 must be positive and overrun 5 not negative"


def seen(counts: list[int], budget_sent: bool) -> ThinkingCap:
    """A cap that has observed `counts` of chunks with reasoning."""
    cap = ThinkingCap(10, 3, budget_sent=budget_sent)
    for count in counts:
        cap.observe(count, True)
    return cap


@pytest.mark.parametrize("budget_sent", [False, True])
def test_acts_from_is_the_first_count_observe_answers_at(budget_sent: bool) -> None:
    # The stream asks `observe` only from `acts_from` on: every count below it is NONE, at every
    # stage of the cap's life, and the count at it is the post, then the overrun.
    counts: list[int] = []
    cap = seen(counts, budget_sent)
    for expected in (POST, OVERRUN):
        for below in range(counts[-1] if counts else 0, cap.acts_from):
            assert seen(counts, budget_sent).observe(below, True) is NONE
        at = cap.acts_from
        assert cap.observe(at, True) is expected
        counts.append(at)
    assert counts == ([18, 22] if budget_sent else [10, 14])
    assert cap.acts_from == 0 and cap.observe(0, True) is OVERRUN  # every chunk, from then on


def test_a_refused_control_call_makes_every_later_chunk_act() -> None:
    cap = ThinkingCap(10, 3)
    assert cap.observe(10, True) is POST
    cap.control_answer(False)
    assert cap.acts_from == 0 and cap.observe(0, True) is OVERRUN
