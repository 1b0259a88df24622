"""Every connect of a container's clients takes its turn under the proxy's accept limit (`[proxy]
burst` and `rate`, kept a little inside: one token less, 5 % slower), shared by both flavours, so
that inferproxy never refuses one of ours. A turn is waited for locally; a cancel ends the wait,
and a call that waits connects nothing before its turn."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from adapters.fake_server import FakeServer, sse_reply
from app.config import parse_config
from app.container import Container
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, EXPECT, LIMITS, REQ, RETRY, Kind
from domain.cancel import CancelToken
from domain.errors import Cancelled

pytestmark = pytest.mark.timeout(20)

# The proxy's limit for these tests: 3 at once, then 5 a second; the client's: 2, then 4.75.
PROXY = {"burst": 3, "rate": 5}
INTERVAL_S = 1 / 4.75
MARGIN_S = 0.02  # the turns are booked on the system clock; a lower bound needs no more slack


def container_for(server: FakeServer, **proxy: Any) -> Container:
    data = {"socket": server.socket_path, "limits": LIMITS, "retry": RETRY, "expect": EXPECT, "proxy": proxy or PROXY}
    return Container(config=parse_config(data))


def test_connects_past_the_burst_wait_their_turn_at_the_rate(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, *[sse_reply(ANSWER)] * 4)
    client = client_kind.client_of(container_for(server))
    started = time.monotonic()

    answers = [client.chat(REQ) for _ in range(4)]

    assert answers == [ANSWER_COMPLETION] * 4
    assert time.monotonic() - started >= 2 * INTERVAL_S - MARGIN_S, "two connects past the burst of 2"
    assert server.accepted == 4


def test_both_flavours_of_one_container_share_one_budget(server: FakeServer) -> None:
    server.route(*CHAT, *[sse_reply(ANSWER)] * 3)
    container = container_for(server)
    blocking = container.client()
    blocking.chat(REQ)
    blocking.chat(REQ)  # the burst of 2 spent
    started = time.monotonic()

    async def one() -> object:
        return await container.async_client().chat(REQ)

    assert asyncio.run(one()) == ANSWER_COMPLETION
    assert time.monotonic() - started >= INTERVAL_S - MARGIN_S, "the asyncio client waited its turn too"


def test_a_cancel_ends_the_wait_for_a_turn_and_nothing_connects(server: FakeServer, client_kind: Kind) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    client = client_kind.client_of(container_for(server, burst=1, rate=0.1))  # a turn each 10.5 s
    client.chat(REQ)
    token = CancelToken()
    timer = threading.Timer(0.1, token.cancel)
    timer.start()
    started = time.monotonic()

    with pytest.raises(Cancelled):
        client.chat(REQ, cancel=token)

    timer.join()
    assert time.monotonic() - started < 2.0, "ended by the cancel, not by the turn 10 s away"
    assert server.accepted == 1
