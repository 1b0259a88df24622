# Generated from src/adapters/uds_http/_async/transport.py by scripts/unasync.py: do not edit.
"""HTTP/1.1 over a Unix socket, one request per connection: the real transport, written once.

Written once: the asyncio flavour under `_async/` is the source of the blocking one under
`_sync/` (`scripts/unasync.py`). The exchange is `adapters.uds_http._sync.exchange`, shared
with the in-memory fake; this module adds the socket: connecting (`adapters.uds_http.sockets`,
which names the socket path and what is wrong with it in every `ConnectError`) and the stream
over it.

Invariants:
- No `OSError` leaves this module: connect failures are `ConnectError` naming the socket path;
  the exchange maps everything after the connect.
- A malformed method or path is refused before connecting (`ValueError`): the caller's bug.
- A transport may serve several threads (and event loops); each exchange belongs to the one that
  opened it.
"""

from __future__ import annotations

import socket
import time

from adapters.uds_http._sync.exchange import HttpExchange, send
from adapters.uds_http.places import Places
from adapters.uds_http.response import render, render_for
from adapters.uds_http.sockets import SocketStream, SocketAhead
from domain.connect_budget import ConnectBudget
from domain.retry import REFILL_S
from ports.transport import CancelSignal, Link

__all__ = ["UdsTransport", "exchange_over"]


class UdsTransport:
    """Opens one connection per exchange to `socket_path` (nothing happens at construction),
    each in its turn under `budget` (the proxy's accept limit) and holding one of `places` (its
    concurrency limit) while open, when they are given. Each request written makes the socket
    of the next connect (`SocketAhead`), off its path."""

    __slots__ = ("_ahead", "_budget", "_header_bytes", "_places", "_refill_s", "socket_path")

    def __init__(
        self,
        socket_path: str,
        *,
        header_bytes: int,
        budget: ConnectBudget | None = None,
        places: Places | None = None,
    ) -> None:
        self.socket_path = socket_path
        self._header_bytes = header_bytes
        self._ahead = SocketAhead()
        self._budget = budget  # the proxy's accept limit, shared by every transport of a container
        self._places = places  # the proxy's concurrency limit, shared likewise
        # A refusal's wait: the time the client's budget (a little slower than the proxy's
        # bucket) takes to refill a token.
        self._refill_s = REFILL_S if budget is None else 1.0 / budget.limits.rate

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.socket_path!r})"

    def close(self) -> None:
        """Close the socket made ahead, and make none from now on (a later connect makes its
        own). Exchanges open go on. Idempotent."""
        self._ahead.close()

    def connect(
        self, timeout: float, cancel: CancelSignal | None = None
    ) -> SocketStream:
        """A connection to the socket, nothing sent: `open(..., link=)` sends on it. Made ahead
        of its request, it takes a place only if one is free now (else `ConnectError`): it must
        never hold, or wait for, a place that a request of the same call needs first."""
        return SocketStream.connect(
            self.socket_path, timeout, cancel, self._ahead, self._budget, self._places, at_once=True
        )

    def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        cancel: CancelSignal | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        link: Link | None = None,
        place_wait: float | None = None,
    ) -> HttpExchange:
        """Connect (or take `link`, a connection `connect` made), send the whole request (with
        the `headers` given besides its own) and return the exchange (aborted if `cancel`
        fires, from the first byte written on). A connect waits for a place at most
        `place_wait` s (None: `timeout`).

        Raises `ConnectError` if the socket cannot be reached, `StreamClosedEarly` if the
        connection breaks while the request is written and `Stalled` if writing it takes longer
        than `timeout`."""
        # Rendered before connecting, so a malformed request fails first.
        request, stream = render_for(
            link, SocketStream, self, method, path, body, self._header_bytes, headers
        )
        if stream is None:
            wait = timeout if place_wait is None else place_wait
            stream = SocketStream.connect(
                self.socket_path, wait, cancel, self._ahead, self._budget, self._places
            )
        exchange = send(
            stream,
            request,
            timeout=timeout,
            now=time.monotonic,
            peer=self.socket_path,
            cancel=cancel,
            refill_s=self._refill_s,
            refused=None if self._budget is None else self._emptied,
        )
        self._ahead.refill()  # the request is out: its answer is awaited next
        return exchange

    def _emptied(self) -> None:
        """A refusal: the proxy's bucket is empty, and the budget paces on from that."""
        if self._budget is not None:
            self._budget.emptied(time.monotonic())


def exchange_over(
    sock: socket.socket,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    timeout: float,
    header_bytes: int,
    peer: str = "the server",
) -> HttpExchange:
    """Send the request on an already connected socket and return the exchange, which owns the
    socket from then on (closed on failure). Tests hand it one end of a `socketpair` to play the
    server byte by byte."""
    try:
        request = render(method, path, body, header_bytes)
    except ValueError:
        sock.close()
        raise
    return send(
        SocketStream(sock), request, timeout=timeout, now=time.monotonic, peer=peer
    )
