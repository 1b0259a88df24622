"""Through a real inferproxy (in process, its upstream a TCP relay to the scripted server): a
container's sessions never exceed the proxy's limits, so more sessions than its `max_conns` run
at once with no refusal and no retry; and a refusal that still happens (another process spent
the proxy's accept bucket) is retried after the bucket's refill time, not on the outage
schedule. Both flavours."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.fake_server import FakeServer, json_reply, sse_reply
from adapters.proxy.options import ProxyLimits
from adapters.proxy.testing import LoopbackUpstream, RunningProxy, running_proxy
from app.config import parse_config
from app.container import Container
from client_support import ANSWER, ANSWER_COMPLETION, CHAT, LIMITS, REQ, SLOTS, Kind
from domain.events import ChatEvent, Retrying
from domain.messages import ChatRequest

pytestmark = pytest.mark.timeout(30)

SESSIONS = 10  # past the proxy's 8 connections
HELD_S = 0.15  # between an answer's pieces: each answer holds its connection 5 times that
EXPECT = {"chat_template_sha256": "0" * 64, "n_ctx": 4096, "total_slots": SESSIONS}


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def relay_to(path: str) -> Callable[[socket.socket], None]:
    """An upstream handler that plays llama-server by relaying to the scripted server at `path`."""

    def relay(conn: socket.socket) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as inner:
            inner.connect(path)
            back = threading.Thread(target=_pump, args=(inner, conn))
            back.start()
            _pump(conn, inner)
            back.join()

    return relay


@contextlib.contextmanager
def proxied(server: FakeServer, tmp_path: Path, limits: ProxyLimits) -> Iterator[RunningProxy]:
    with (
        LoopbackUpstream(relay_to(server.socket_path)) as upstream,
        running_proxy(str(tmp_path / "infer.sock"), upstream.address, limits) as proxy,
    ):
        yield proxy


def config(running: RunningProxy, **changes: Any) -> Any:
    data = {"socket": running.path, "limits": LIMITS, "expect": EXPECT, **changes}
    return parse_config(data)


def refusals(proxy: RunningProxy) -> list[str]:
    return [line for line in proxy.lines if line.startswith("refused")]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_more_sessions_than_the_proxys_connections_run_with_no_refusal_and_no_retry(
    server: FakeServer, tmp_path: Path, flavour: str
) -> None:
    server.route(*CHAT, *[sse_reply(ANSWER, delay_s=HELD_S)] * SESSIONS)
    requests = [ChatRequest(slot=n, messages=REQ.messages) for n in range(SESSIONS)]
    events: list[ChatEvent] = []
    # The proxy's defaults: 8 connections, a burst of 10, then 2 a second.
    with proxied(server, tmp_path, ProxyLimits()) as proxy:
        container = Container(config=config(proxy))
        if flavour == "sync":
            client = container.client()
            answers: list[object] = [None] * SESSIONS

            def session(n: int) -> None:
                answers[n] = client.chat_with_retry(requests[n], events.append)

            threads = [threading.Thread(target=session, args=(n,)) for n in range(SESSIONS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(20.0)
        else:

            async def sessions() -> list[object]:
                client = container.async_client()
                calls = (client.chat_with_retry(req, events.append) for req in requests)
                return list(await asyncio.gather(*calls))

            answers = asyncio.run(sessions())

    assert answers == [ANSWER_COMPLETION] * SESSIONS
    assert refusals(proxy) == [], "the proxy refused none of ours"
    assert [e for e in events if isinstance(e, Retrying)] == []
    assert container.places().held == 0


def test_a_refusal_is_retried_after_the_buckets_refill_time(
    server: FakeServer, tmp_path: Path, client_kind: Kind
) -> None:
    server.route(*CHAT, sse_reply(ANSWER))
    limits = ProxyLimits(burst=1, rate=2.0)  # one token, back in 0.5 s
    retry = {"attempts": 4, "delays_ms": [2000, 2000, 2000], "jitter": 0.0, "total_ms": 10_000}
    with proxied(server, tmp_path, limits) as proxy:
        container = Container(config=config(proxy, retry=retry, proxy={"burst": 1, "rate": 2}))
        client = client_kind.client_of(container)
        another_process = proxy.connect()  # spends the proxy's one token
        another_process.close()
        assert eventually(lambda: proxy.proxy.accepted == 1)
        events: list[ChatEvent] = []
        started = time.monotonic()

        assert client.chat_with_retry(REQ, events.append) == ANSWER_COMPLETION

        took = time.monotonic() - started
    (retrying,) = [e for e in events if isinstance(e, Retrying)]
    # The client's refill time: its budget's rate, 5 % under the proxy's 2 a second.
    assert retrying.after_ms == round(1000 / 1.9), "after the refill time, not the 2 s delay"
    assert retrying.error.startswith("ProxyRefused: ")
    assert took < 1.5
    assert len(refusals(proxy)) == 1 and "accept rate limit" in refusals(proxy)[0]


def test_a_call_that_sends_once_still_tries_once_more_after_a_refusal(
    server: FakeServer, tmp_path: Path, client_kind: Kind
) -> None:
    # A refusal reached no server: `chat` and the small calls wait the refill and try once more.
    server.route(*CHAT, sse_reply(ANSWER))
    server.route(*SLOTS, json_reply([{"id": 0, "is_processing": False}]))
    limits = ProxyLimits(burst=1, rate=2.0)  # one token, back in 0.5 s
    with proxied(server, tmp_path, limits) as proxy:
        container = Container(config=config(proxy, proxy={"burst": 1, "rate": 2}))
        client = client_kind.client_of(container)
        for accepted, call in enumerate((lambda: client.chat(REQ), client.slots), start=1):
            another_process = proxy.connect()  # spends the proxy's one token
            another_process.close()
            assert eventually(lambda n=accepted: proxy.proxy.accepted >= 2 * n - 1)
            started = time.monotonic()

            answer = call()

            assert answer is not None
            assert 0.5 <= time.monotonic() - started < 1.5, "the refill waited, then one more try"
    assert len(refusals(proxy)) == 2


def eventually(condition: Callable[[], bool], within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
