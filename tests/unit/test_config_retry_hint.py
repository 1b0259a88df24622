"""`retry.attempts` changed without `retry.delays_ms`: the message says which list would fit,
derived from the default waits (cut short, or with the last one repeated)."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import ConfigError, parse_config


def refusal(retry: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"socket": "s", "retry": retry})
    return str(caught.value)


@pytest.mark.parametrize(
    ("attempts", "message"),
    [
        (
            2,
            "config: retry.delays_ms: has 3 entries but attempts = 2 needs 1 entry (one wait between two attempts), "
            "e.g. delays_ms = [2000] (got (2000, 8000, 30000))",
        ),
        (
            1,
            "config: retry.delays_ms: has 3 entries but attempts = 1 needs 0 entries (one wait between two "
            "attempts), e.g. delays_ms = [] (got (2000, 8000, 30000))",
        ),
        (
            6,
            "config: retry.delays_ms: has 3 entries but attempts = 6 needs 5 entries (one wait between two "
            "attempts), e.g. delays_ms = [2000, 8000, 30000, 30000, 30000] (got (2000, 8000, 30000))",
        ),
    ],
)
def test_attempts_changed_alone_names_a_delays_list_that_fits(attempts: int, message: str) -> None:
    assert refusal({"attempts": attempts}) == message


def test_the_suggested_list_loads() -> None:
    config = parse_config({"socket": "s", "retry": {"attempts": 6, "delays_ms": [2000, 8000, 30000, 30000, 30000]}})
    assert config.retry.attempts == 6


def test_a_list_of_one_entry_is_counted_in_the_singular() -> None:
    assert "has 1 entry but attempts = 4 needs 3 entries" in refusal({"delays_ms": [5]})
