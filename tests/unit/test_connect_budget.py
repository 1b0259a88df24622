"""The proxy's accept limit kept on the client's side (`domain.connect_budget`): a burst at once,
then turns at the rate, handed out in the order asked, never past the caller's latest time."""

from __future__ import annotations

import math
import threading

import pytest

from domain.connect_budget import ConnectBudget


def test_a_burst_goes_at_once_and_the_rest_at_the_rate() -> None:
    budget = ConnectBudget(burst=3, rate=2.0)

    turns = [budget.reserve(10.0, 100.0) for _ in range(6)]

    assert turns == [10.0, 10.0, 10.0, 10.5, 11.0, 11.5]


def test_tokens_come_back_at_the_rate_while_nobody_connects() -> None:
    budget = ConnectBudget(burst=2, rate=4.0)
    assert [budget.reserve(0.0, 10.0) for _ in range(3)] == [0.0, 0.0, 0.25]

    assert budget.reserve(5.0, 10.0) == 5.0  # long after: the bucket is full again
    assert budget.reserve(5.0, 10.0) == 5.0
    assert budget.reserve(5.0, 10.0) == 5.25


def test_a_turn_past_the_latest_time_is_refused_and_books_nothing() -> None:
    budget = ConnectBudget(burst=1, rate=1.0)
    assert budget.reserve(0.0, 0.0) == 0.0

    assert budget.reserve(0.0, 0.5) is None  # the next turn is at 1.0
    assert budget.reserve(0.0, 1.0) == 1.0, "the refusal took no turn"
    assert budget.reserve(0.0, 5.0) == 2.0


def test_the_client_keeps_a_little_inside_the_proxys_limit() -> None:
    budget = ConnectBudget.of_proxy(burst=10, rate=2.0)

    assert (budget.limits.burst, budget.limits.rate) == (9, 1.9)
    assert ConnectBudget.of_proxy(burst=1, rate=2.0).limits.burst == 1


def test_over_any_window_no_more_connect_than_the_proxys_bucket_allows() -> None:
    # The proxy's own bucket (burst 10, 2/s) must accept every turn the client's budget gives.
    budget = ConnectBudget.of_proxy(burst=10, rate=2.0)
    turns = [budget.reserve(0.0, 1000.0) for _ in range(200)]
    tokens, stamp = 10.0, 0.0
    for turn in turns:
        assert turn is not None
        tokens = min(10.0, tokens + (turn - stamp) * 2.0)
        stamp = turn
        assert tokens >= 1.0 - 1e-9, f"the proxy would refuse the connect at {turn:.3f} s"
        tokens -= 1.0


@pytest.mark.parametrize(("burst", "rate"), [(0, 2.0), (True, 2.0), (2.5, 2.0), (10, 0), (10, -1.0), (10, "2")])
def test_a_budget_that_cannot_work_is_refused(burst: object, rate: object) -> None:
    with pytest.raises(ValueError):
        ConnectBudget(burst, rate)  # type: ignore[arg-type]


def test_threads_that_ask_at_once_each_get_a_turn_of_their_own() -> None:
    budget = ConnectBudget(burst=1, rate=10.0)
    turns: list[float] = []
    lock = threading.Lock()

    def ask() -> None:
        turn = budget.reserve(0.0, 100.0)
        assert turn is not None
        with lock:
            turns.append(turn)

    threads = [threading.Thread(target=ask) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5.0)

    assert sorted(round(t, 6) for t in turns) == [round(n * 0.1, 6) for n in range(50)]


def test_a_refusal_empties_the_budget_so_every_turn_after_it_comes_at_the_rate() -> None:
    # The proxy refused: another process spent its bucket. A burst now would be refused too.
    budget = ConnectBudget(burst=5, rate=2.0)
    budget.emptied(10.0)

    turns = [budget.reserve(10.0, math.inf) for _ in range(3)]

    assert turns == [10.5, 11.0, 11.5]


def test_a_refusal_never_moves_turns_already_booked_later_sooner() -> None:
    budget = ConnectBudget(burst=1, rate=1.0)
    booked = [budget.reserve(0.0, math.inf) for _ in range(4)]  # 0, 1, 2, 3
    budget.emptied(0.5)

    assert booked == [0.0, 1.0, 2.0, 3.0]
    assert budget.reserve(0.5, math.inf) == 4.0
