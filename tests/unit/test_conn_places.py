"""The decision under the proxy's concurrency limit (`domain.conn_places`): at most `limit`
places held, the waiters served first come first served, a waiter never both queued and served."""

from __future__ import annotations

import pytest

from domain.conn_places import ConnPlaces


def test_places_are_taken_up_to_the_limit_then_waiters_queue() -> None:
    places: ConnPlaces[str] = ConnPlaces(2)

    assert [places.ask("a"), places.ask("b"), places.ask("c")] == [True, True, False]
    assert (places.held, places.waiting) == (2, 1)


def test_a_place_given_back_goes_to_the_longest_waiter() -> None:
    places: ConnPlaces[str] = ConnPlaces(1)
    places.ask("holder")
    places.ask("first")
    places.ask("second")

    assert places.give_back() == "first"
    assert places.give_back() == "second"
    assert places.give_back() is None
    assert (places.held, places.waiting) == (0, 0)


def test_a_newcomer_takes_no_place_while_someone_waits_for_one() -> None:
    # The place handed over is held from the moment it is given back: a connect that comes
    # between the give-back and the waiter's wake-up finds none free, so no waiter starves.
    places: ConnPlaces[str] = ConnPlaces(1)
    places.ask("holder")
    places.ask("waiter")

    assert places.give_back() == "waiter"
    assert not places.take_now()
    assert not places.ask("newcomer")
    assert places.give_back() == "newcomer"


def test_take_now_never_queues() -> None:
    places: ConnPlaces[str] = ConnPlaces(1)

    assert places.take_now()
    assert not places.take_now()
    assert places.waiting == 0


def test_a_waiter_that_gives_up_while_queued_holds_nothing() -> None:
    places: ConnPlaces[str] = ConnPlaces(1)
    places.ask("holder")
    places.ask("waiter")

    assert places.withdraw("waiter")
    assert places.give_back() is None
    assert places.held == 0


def test_a_waiter_that_gives_up_after_it_was_handed_a_place_holds_it() -> None:
    places: ConnPlaces[str] = ConnPlaces(1)
    places.ask("holder")
    places.ask("waiter")
    places.give_back()  # handed to "waiter", which has not woken yet

    assert not places.withdraw("waiter"), "it holds the place: its to give back"
    assert places.held == 1
    assert places.give_back() is None
    assert places.held == 0


def test_the_client_keeps_one_place_below_the_proxys_max_conns() -> None:
    assert ConnPlaces.proxy_limit(8) == 7
    assert ConnPlaces.proxy_limit(2) == 1
    assert ConnPlaces.proxy_limit(1) == 1


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_a_limit_that_is_no_positive_integer_is_refused(limit: object) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        ConnPlaces(limit)  # type: ignore[arg-type]


def test_a_place_given_back_that_was_never_taken_is_a_bug() -> None:
    with pytest.raises(RuntimeError, match="never taken"):
        ConnPlaces[str](1).give_back()
