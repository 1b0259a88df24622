"""A cancelled call on the in-memory fakes: a token cancelled before the call sends nothing, not
even the request for the slot count, and its own error is the one raised; a cancel ends a retry's
wait and a place in the queue at once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import error_reply, sse_reply
from client_support import CHAT
from domain.cancel import CancelToken
from domain.errors import Cancelled
from domain.events import ChatEvent, Queued, Retrying
from scripted_client import ANSWER, REQ

pytestmark = pytest.mark.timeout(10)

JOIN_S = 5.0


def test_chat_with_a_cancelled_token_sends_nothing(client_for: Callable[..., Any]) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)})
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        client.chat(REQ, lambda event: None, token)
    assert transport.requests == []


def test_chat_with_retry_with_a_cancelled_token_sends_nothing_not_even_for_the_slot_count(
    client_for: Callable[..., Any],
) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)}, expect=None)  # the slot count comes from /props
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        client.chat_with_retry(REQ, lambda event: None, token)
    assert transport.requests == []


@pytest.mark.parametrize("retry", [False, True])
def test_a_call_cancelled_before_the_slot_count_is_known_asks_nothing_and_raises_the_cancels_error(
    client_for: Callable[..., Any], retry: bool
) -> None:
    client, transport = client_for({CHAT: sse_reply(ANSWER)}, expect=None)  # the slot count comes from /props
    token = CancelToken()
    token.cancel(Cancelled("the daemon is shutting down"))
    call = client.chat_with_retry if retry else client.chat
    with pytest.raises(Cancelled) as caught:
        call(REQ, lambda event: None, token)
    assert str(caught.value) == "the daemon is shutting down"
    assert transport.requests == []


def test_a_cancel_during_the_retry_wait_ends_the_wait_at_once(client_for: Callable[..., Any]) -> None:
    retry = {"attempts": 2, "delays_ms": [60_000], "jitter": 0.0, "total_ms": 300_000}
    client, transport = client_for({CHAT: [error_reply(503, "Loading model"), sse_reply(ANSWER)]}, retry=retry)
    token = CancelToken()
    clock = transport.clock
    waited_from: list[float] = []

    def cancel_on_retrying(event: ChatEvent) -> None:
        if isinstance(event, Retrying):
            waited_from.append(clock.now())
            token.cancel()

    with pytest.raises(Cancelled):
        client.chat_with_retry(REQ, cancel_on_retrying, token)
    assert clock.now() == waited_from[0]  # the 60 s wait was not slept
    assert len(transport.requests) == 1


def test_a_call_cancelled_while_queued_leaves_the_queue_at_once(
    client_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = client_for({CHAT: [sse_reply(ANSWER), sse_reply(ANSWER)]})
    holding = threading.Event()
    release = threading.Event()

    def hold(event: ChatEvent) -> None:
        holding.set()
        release.wait(JOIN_S)

    holder = threading.Thread(target=client.chat, args=(REQ, hold))
    holder.start()
    try:
        assert holding.wait(JOIN_S)  # the holder has the slot and sits in its first event
        token = CancelToken()
        seen: list[ChatEvent] = []

        def cancel_when_queued(event: ChatEvent) -> None:
            seen.append(event)
            token.cancel()

        with caplog.at_level(logging.DEBUG, logger="inferpath.client"), pytest.raises(Cancelled):
            client.chat(REQ, cancel_when_queued, token)
        assert seen == [Queued(1)]
        assert "slot 1: queued, 1 ahead" in [r.getMessage() for r in caplog.records]
    finally:
        release.set()
        holder.join(JOIN_S)
    assert not holder.is_alive()
