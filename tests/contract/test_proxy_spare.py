"""The spare connection: two threads started before a client arrives, with its splice pipes made
ahead. It holds one of the `--max-conns` places (not an accept token), which a client takes over,
and dies with the proxy. These tests run it without connections made ahead (`ready_every=None`,
the harness's default), so every upstream connection counted is a client's; `test_proxy_ready.py`
has those made ahead, and `test_proxy_spare_limit.py` the upstream's count with the spare's."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from adapters.proxy.connection import READY_EVERY_S
from adapters.proxy.options import ProxyLimits
from adapters.proxy.testing import LoopbackUpstream, echo, eventually, round_trip, running_proxy


def spare_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("inferproxy-") and "-spare" in t.name)


def sockets_and_pipes() -> int:
    """Descriptors of the kinds a spare holds (its pipes and its socket)."""
    kinds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return sum(kind.startswith(("socket:", "pipe:")) for kind in kinds)


def test_the_spare_waits_with_its_threads_and_without_connections_ahead_opens_nothing_upstream(
    tmp_path: Path,
) -> None:
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
    ):
        assert proxy.proxy.wait_idle(2)
        assert spare_threads() == ["inferproxy-1-spare", "inferproxy-1-spare-back"]
        assert upstream.accepted == 0
        assert proxy.proxy.open_connections == 0

        with proxy.connect() as client:
            assert round_trip(client, b"ping") == b"ping"
            # Taken: its threads bear the connection's name, and a new spare is on its way.
            names = {t.name for t in threading.enumerate()}
            assert {"inferproxy-1", "inferproxy-1-back"} <= names
        assert proxy.proxy.wait_idle(2)

        assert upstream.accepted == 1  # one upstream connection, for the one client
        assert spare_threads() == ["inferproxy-2-spare", "inferproxy-2-spare-back"]


def test_the_spare_takes_no_place_from_a_client_and_the_limit_still_refuses_the_third(tmp_path: Path) -> None:
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ProxyLimits(max_conns=2)) as proxy,
    ):
        two = [proxy.connect() for _ in range(2)]
        try:
            assert [round_trip(c, b"hi") for c in two] == [b"hi", b"hi"]
            assert proxy.proxy.open_connections == 2
            with proxy.connect() as third:
                third.settimeout(2)
                assert third.recv(1) == b""  # closed at once: two are open
            assert proxy.lines == ["refused a connection: 2 connections already open"]
            assert upstream.accepted == 2
            assert spare_threads() == []  # both places are the clients': no spare holds a third
        finally:
            for client in two:
                client.close()
        assert proxy.proxy.wait_idle(2)
        with proxy.connect() as again:
            assert round_trip(again, b"back") == b"back"  # a place came free: a spare takes it


@pytest.mark.parametrize("ready_every", [None, READY_EVERY_S])
def test_the_spare_dies_with_the_proxy_leaving_no_thread_and_no_descriptor(
    tmp_path: Path, ready_every: float | None
) -> None:
    with LoopbackUpstream(echo) as upstream:
        descriptors = sockets_and_pipes()
        with running_proxy(str(tmp_path / "p.sock"), upstream.address, ready_every=ready_every) as proxy:
            assert proxy.proxy.wait_idle(2)
            with proxy.connect() as client:
                assert round_trip(client, b"ping") == b"ping"
            assert proxy.proxy.wait_idle(2)
            assert spare_threads()  # one waits now, with its pipes (and its connection ahead)
            assert sockets_and_pipes() > descriptors
        assert spare_threads() == []
        assert not [t.name for t in threading.enumerate() if t.name.startswith("inferproxy-")]
        # The upstream's end of a connection made ahead closes once its handler has seen the EOF.
        assert eventually(lambda: upstream.live == 0)
        assert sockets_and_pipes() == descriptors


def test_a_named_upstream_is_resolved_at_the_connect_and_still_forwards(tmp_path: Path) -> None:
    with LoopbackUpstream(echo) as upstream:
        named = type(upstream.address)("localhost", upstream.address.port)
        with running_proxy(str(tmp_path / "p.sock"), named) as proxy:
            assert proxy.proxy.wait_idle(2)
            with proxy.connect() as client:
                assert round_trip(client, b"by name") == b"by name"
            assert proxy.proxy.wait_idle(2)
        assert upstream.accepted == 1
