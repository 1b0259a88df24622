"""The thinking cap's smallest setting and the words of its refusal."""

from __future__ import annotations

import pytest

from domain.thinking import Action, ThinkingCap


def test_a_cap_of_one_token_asks_to_end_reasoning_at_the_first_token() -> None:
    cap = ThinkingCap(1, 0)
    assert cap.observe(0, in_reasoning=True) is Action.NONE
    assert cap.observe(1, in_reasoning=True) is Action.POST_REASONING_END
    assert cap.observe(2, in_reasoning=True) is Action.OVERRUN


def test_a_cap_of_zero_is_refused_with_both_settings_named() -> None:
    with pytest.raises(ValueError) as caught:
        ThinkingCap(0, 5)
    assert str(caught.value) == "thinking cap 0 must be positive and overrun 5 not negative"
