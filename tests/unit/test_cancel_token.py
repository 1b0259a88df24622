"""CancelToken: what a cancel runs, once, and what a cancelled call raises."""

from __future__ import annotations

import pytest

from domain.cancel import CancelToken
from domain.errors import Cancelled, ClientClosed


def test_a_fresh_token_is_not_cancelled_and_lets_the_call_go_on() -> None:
    token = CancelToken()
    assert not token.cancelled
    assert not token.event.is_set()
    token.raise_if_cancelled()
    assert repr(token) == "CancelToken(cancelled=False)"


def test_a_cancelled_token_raises_cancelled_by_default() -> None:
    token = CancelToken()
    token.cancel()
    assert token.cancelled
    assert token.event.is_set()
    assert repr(token) == "CancelToken(cancelled=True)"
    with pytest.raises(Cancelled) as caught:
        token.raise_if_cancelled()
    assert type(caught.value) is Cancelled
    assert str(caught.value) == "the call was cancelled"


def test_the_error_given_to_the_first_cancel_is_the_one_raised() -> None:
    token = CancelToken()
    closed = ClientClosed("closed")
    token.cancel(closed)
    token.cancel(Cancelled("later"))
    assert token.error() is closed
    with pytest.raises(ClientClosed):
        token.raise_if_cancelled()


def test_a_cancel_runs_every_wake_up_once() -> None:
    token = CancelToken()
    ran: list[str] = []
    token.on_cancel(lambda: ran.append("a"))
    token.on_cancel(lambda: ran.append("b"))
    token.cancel()
    token.cancel()
    assert sorted(ran) == ["a", "b"]


def test_a_wake_up_that_raises_does_not_stop_the_others_or_the_cancel() -> None:
    token = CancelToken()
    ran: list[str] = []

    def broken() -> None:
        raise OSError("already closed")

    token.on_cancel(broken)
    token.on_cancel(lambda: ran.append("after"))
    token.cancel()
    assert ran == ["after"]
    assert token.cancelled


def test_an_unregistered_wake_up_is_not_run() -> None:
    token = CancelToken()
    ran: list[str] = []
    forget = token.on_cancel(lambda: ran.append("forgotten"))
    token.on_cancel(lambda: ran.append("kept"))
    forget()
    token.cancel()
    assert ran == ["kept"]


def test_unregistering_after_the_cancel_does_nothing() -> None:
    token = CancelToken()
    forget = token.on_cancel(lambda: None)
    token.cancel()
    forget()
    forget()


def test_a_wake_up_registered_after_the_cancel_runs_at_once() -> None:
    token = CancelToken()
    token.cancel()
    ran: list[str] = []
    forget = token.on_cancel(lambda: ran.append("late"))
    assert ran == ["late"]
    assert forget() is None
    assert ran == ["late"]


def test_every_one_of_many_wake_ups_runs() -> None:
    token = CancelToken()
    ran: list[int] = []
    for i in range(5):
        token.on_cancel(lambda i=i: ran.append(i))  # type: ignore[misc]
    token.cancel()
    assert sorted(ran) == [0, 1, 2, 3, 4]


def test_the_error_of_a_token_not_cancelled_yet_is_the_default_cancelled() -> None:
    error = CancelToken().error()
    assert type(error) is Cancelled
    assert str(error) == "the call was cancelled"
