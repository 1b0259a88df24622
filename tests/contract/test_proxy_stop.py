"""A stop of the in-process proxy is never held up by what its connections are doing: connects
that the upstream never answers are aborted with everything else, at once and without a line.

The upstream is a `black_hole`, where a connect neither succeeds nor is refused; which connects
are under way is read from the kernel's table of TCP sockets, so nothing here sleeps.
"""

import time
from pathlib import Path

from adapters.proxy.testing import (
    LoopbackUpstream,
    black_hole,
    closed,
    echo,
    eventually,
    pending_connects,
    running_proxy,
)


def test_a_stop_ends_serving_within_100_ms_while_connections_wait_for_their_upstream_connect(tmp_path: Path) -> None:
    with black_hole() as address:
        others = pending_connects(address)  # the black hole's own queue holders
        clients = []
        try:
            with running_proxy(str(tmp_path / "p.sock"), address, connect_timeout=5.0) as proxy:
                clients = [proxy.connect() for _ in range(3)]
                for client in clients:
                    client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
                assert eventually(lambda: len(pending_connects(address) - others) == 3, 2.0)
                started = time.monotonic()
            elapsed = time.monotonic() - started  # stop() and the end of serve(), as SIGTERM runs them
            assert elapsed < 0.1, f"{elapsed * 1000:.0f} ms from the stop to the end of serving"
            assert all(closed(client) for client in clients)
        finally:
            for client in clients:
                client.close()
        assert pending_connects(address) <= others  # the connecting sockets were closed, not left behind
    assert proxy.proxy.open_connections == 0
    assert proxy.lines == []  # an aborted connect is not an unreachable upstream


def test_a_stop_ends_serving_within_100_ms_while_clients_have_yet_to_send_their_first_byte(tmp_path: Path) -> None:
    with LoopbackUpstream(echo) as upstream:
        clients = []
        try:
            with running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy:
                clients = [proxy.connect() for _ in range(3)]
                assert eventually(lambda: upstream.accepted == 3, 2.0)  # connected, waiting for a byte
                started = time.monotonic()
            elapsed = time.monotonic() - started
            assert elapsed < 0.1, f"{elapsed * 1000:.0f} ms from the stop to the end of serving"
            assert all(closed(client) for client in clients)
        finally:
            for client in clients:
                client.close()
    assert proxy.lines == []  # stopped, not timed out
