"""The proxy's concurrency limit on the client's side (`adapters.uds_http.places`): a container's
connections hold at most `max_conns - 1` places; a connect past them waits (first come, first
served) within its timeout, and a cancel ends the wait; every way a connection ends gives its
place back (a close, a failed connect, an exchange collected unclosed); a connection made ahead
never waits for a place. Both flavours."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable

import pytest

from adapters.fake_server import FakeServer, error_reply, sse_reply
from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.transport import UdsTransport
from adapters.uds_http.places import Places
from app.config import parse_config
from app.container import Container
from client_support import ANSWER, CHAT, REQ, Kind, config_for
from domain.cancel import CancelToken
from domain.errors import Cancelled, ConnectError, HttpError
from ports.transport import Exchange

pytestmark = pytest.mark.timeout(20)

HEALTH = "/health"


def until(condition: Callable[[], bool], within_s: float = 2.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.001)


def open_one(transport: UdsTransport, opened: list[Exchange]) -> None:
    opened.append(transport.open("GET", HEALTH, timeout=5.0))


def opener(transport: UdsTransport, opened: list[Exchange]) -> threading.Thread:
    """A thread that opens an exchange (waiting for a place) and keeps it in `opened`."""
    thread = threading.Thread(target=open_one, args=(transport, opened))
    thread.start()
    return thread


def test_a_connect_past_the_places_waits_until_one_is_given_back(server: FakeServer) -> None:
    places = Places(1)
    transport = UdsTransport(server.socket_path, header_bytes=16384, places=places)
    first = transport.open("GET", HEALTH, timeout=5.0)
    opened: list[Exchange] = []

    thread = opener(transport, opened)
    until(lambda: places.waiting == 1)
    until(lambda: server.accepted == 1)
    assert not opened, "the second connect waits, not connected"
    first.close()
    thread.join(5.0)

    assert len(opened) == 1
    until(lambda: server.accepted == 2)
    opened[0].close()
    assert places.held == 0


def open_tagged(transport: UdsTransport, n: int, opened: list[tuple[int, Exchange]]) -> None:
    opened.append((n, transport.open("GET", HEALTH, timeout=5.0)))


def test_places_go_to_the_waiters_in_the_order_they_came(server: FakeServer) -> None:
    places = Places(1)
    transport = UdsTransport(server.socket_path, header_bytes=16384, places=places)
    holder = transport.open("GET", HEALTH, timeout=5.0)
    opened: list[tuple[int, Exchange]] = []
    threads = []
    for n in range(3):
        threads.append(threading.Thread(target=open_tagged, args=(transport, n, opened)))
        threads[-1].start()
        until(lambda n=n: places.waiting == n + 1)  # queued one after another
    order = []

    holder.close()
    for _ in range(3):
        until(lambda: len(opened) == 1)
        ((n, served),) = opened
        opened.clear()
        order.append(n)
        served.close()
    for thread in threads:
        thread.join(5.0)

    assert order == [0, 1, 2] and places.held == 0


def test_a_wait_past_its_timeout_is_a_connect_error_that_holds_nothing(server: FakeServer) -> None:
    places = Places(1)
    transport = UdsTransport(server.socket_path, header_bytes=16384, places=places)
    holder = transport.open("GET", HEALTH, timeout=5.0)
    started = time.monotonic()

    with pytest.raises(ConnectError, match=r"all 1 connection places in use for 0\.1 s"):
        transport.open("GET", HEALTH, timeout=0.1)

    assert 0.1 <= time.monotonic() - started < 1.0
    assert (places.held, places.waiting, server.accepted) == (1, 0, 1)
    holder.close()
    assert places.held == 0


def test_a_cancel_ends_the_wait_for_a_place(server: FakeServer) -> None:
    places = Places(1)
    transport = UdsTransport(server.socket_path, header_bytes=16384, places=places)
    holder = transport.open("GET", HEALTH, timeout=5.0)
    token = CancelToken()
    timer = threading.Timer(0.05, token.cancel)
    timer.start()
    started = time.monotonic()

    with pytest.raises(ConnectError, match="or cancelled"):
        transport.open("GET", HEALTH, timeout=10.0, cancel=token)

    timer.join()
    assert time.monotonic() - started < 2.0, "ended by the cancel, not the 10 s timeout"
    assert (places.held, places.waiting) == (1, 0)
    holder.close()


def test_cancelling_a_task_that_waits_for_a_place_holds_nothing(server: FakeServer) -> None:
    places = Places(1)

    async def scenario() -> None:
        transport = AsyncUdsTransport(server.socket_path, header_bytes=16384, places=places)
        holder = await transport.open("GET", HEALTH, timeout=5.0)
        waiting = asyncio.create_task(transport.open("GET", HEALTH, timeout=10.0))
        while places.waiting == 0:
            await asyncio.sleep(0.001)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert (places.held, places.waiting) == (1, 0)
        holder.close()

    asyncio.run(scenario())
    assert places.held == 0


def test_a_task_waits_for_a_place_a_thread_gives_back(server: FakeServer) -> None:
    # One count for both flavours: the blocking client's connection holds the place the
    # asyncio client's connect waits for.
    places = Places(1)
    blocking = UdsTransport(server.socket_path, header_bytes=16384, places=places)
    holder = blocking.open("GET", HEALTH, timeout=5.0)
    threading.Timer(0.05, holder.close).start()

    async def scenario() -> float:
        transport = AsyncUdsTransport(server.socket_path, header_bytes=16384, places=places)
        started = time.monotonic()
        exchange = await transport.open("GET", HEALTH, timeout=5.0)
        exchange.close()
        return time.monotonic() - started

    assert 0.04 <= asyncio.run(scenario()) < 2.0
    assert places.held == 0


def test_an_exchange_collected_unclosed_gives_its_place_back(server: FakeServer) -> None:
    places = Places(1)
    transport = UdsTransport(server.socket_path, header_bytes=16384, places=places)
    transport.open("GET", HEALTH, timeout=5.0)  # dropped at once, never closed
    gc.collect()
    assert places.held == 0

    async def scenario() -> None:
        async_transport = AsyncUdsTransport(server.socket_path, header_bytes=16384, places=places)
        await async_transport.open("GET", HEALTH, timeout=5.0)
        gc.collect()
        assert places.held == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_connect_that_fails_gives_its_place_back(tmp_path: object, flavour: str) -> None:
    places = Places(1)
    missing = f"{tmp_path}/no.sock"
    with pytest.raises(ConnectError, match="no such socket file"):
        if flavour == "sync":
            blocking = UdsTransport(missing, header_bytes=16384, places=places)
            blocking.open("GET", HEALTH, timeout=1.0)
        else:
            transport = AsyncUdsTransport(missing, header_bytes=16384, places=places)
            asyncio.run(transport.open("GET", HEALTH, timeout=1.0))
    assert places.held == 0


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_connection_made_ahead_takes_a_free_place_or_none_and_never_waits(
    server: FakeServer,
    flavour: str,
) -> None:
    places = Places(1)
    blocking = UdsTransport(server.socket_path, header_bytes=16384, places=places)
    asyncio_transport = AsyncUdsTransport(server.socket_path, header_bytes=16384, places=places)

    def ahead() -> object:
        if flavour == "sync":
            return blocking.connect(5.0)
        return asyncio.run(asyncio_transport.connect(5.0))

    link = ahead()
    assert places.held == 1
    started = time.monotonic()
    with pytest.raises(ConnectError, match="no connection place free"):
        ahead()
    assert time.monotonic() - started < 0.5 and places.waiting == 0
    link.close()  # type: ignore[attr-defined]
    assert places.held == 0


def test_both_flavours_of_a_container_share_one_count_below_the_proxys_max_conns(
    server: FakeServer,
) -> None:
    container = Container(config=parse_config({"socket": server.socket_path}))  # proxy defaults
    places = container.places()

    assert places is container.places() and places.max_conns == 8 and places.take_now() is not None
    assert container.transport()._places is places  # type: ignore[attr-defined]
    assert container.async_transport()._places is places  # type: ignore[attr-defined]


@pytest.mark.parametrize("outcome", ["answer", "http error", "cancel"])
def test_a_chat_gives_every_place_back_however_it_ends(
    server: FakeServer,
    client_kind: Kind,
    outcome: str,
) -> None:
    if outcome == "answer":
        server.route(*CHAT, sse_reply(ANSWER))
    elif outcome == "http error":
        server.route(*CHAT, error_reply(500, "boom"))
    else:
        server.route(*CHAT, sse_reply(ANSWER, delay_s=10.0))
    container = Container(config=config_for(server.socket_path))
    client = client_kind.client_of(container)
    token = CancelToken()
    if outcome == "cancel":
        threading.Timer(0.1, token.cancel).start()

    try:
        client.chat(REQ, cancel=token)
    except (HttpError, Cancelled):
        assert outcome != "answer"

    until(lambda: container.places().held == 0)
