"""HTTP/1.1 over a Unix socket: the real `Transport`, one request per connection.

The exchange itself (h11 for the head, `adapters.uds_http.body` for the framing, the waits and
the head's size cap) is `adapters.uds_http.exchange`, shared with the in-memory fake; this
module adds the socket: connecting, the `ByteStream` over a connected socket, and the mapping
of connect failures onto `ConnectError` naming the socket path.

Invariants:
- No `OSError` leaves this module: connect failures are `ConnectError` naming the socket path;
  the exchange maps everything after the connect.
- The socket's timeout is set only when a call's timeout differs from the last one, so a stream
  read with one timeout throughout costs one `recv` per call and nothing more.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time

from adapters.uds_http.exchange import HttpExchange, reason, render, send
from domain.errors import ConnectError
from ports.transport import TIMED_OUT, CancelSignal, TimedOut

UdsExchange = HttpExchange
"""The exchange `UdsTransport.open` returns (the one exchange class, over a socket)."""


class SocketStream:
    """The `ByteStream` port over a connected socket, which it owns (see `ports.stream`)."""

    __slots__ = ("_sock", "_timeout")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._timeout: float | None = None

    def send_all(self, data: bytes, timeout: float) -> None:
        self._settimeout(max(timeout, 0.0))
        self._sock.sendall(data)

    def recv(self, max_bytes: int, timeout: float) -> bytes | TimedOut:
        if timeout <= 0.0:
            timeout = 0.0
        if timeout != self._timeout:
            self._settimeout(timeout)
        try:
            return self._sock.recv(max_bytes)
        except (TimeoutError, BlockingIOError):  # a zero timeout polls: BlockingIOError
            return TIMED_OUT

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def _settimeout(self, timeout: float) -> None:
        self._sock.settimeout(timeout)
        self._timeout = timeout


class UdsTransport:
    """Opens one connection per exchange to `socket_path` (nothing happens at construction)."""

    __slots__ = ("_connect_timeout", "_header_bytes", "socket_path")

    def __init__(self, socket_path: str, *, header_bytes: int, connect_timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self._header_bytes = header_bytes
        self._connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"UdsTransport({self.socket_path!r})"

    def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        cancel: CancelSignal | None = None,
    ) -> UdsExchange:
        """Connect, send the whole request and return the exchange (aborted if `cancel` fires).

        Raises `ConnectError` if the socket cannot be reached, `StreamClosedEarly` if the
        connection breaks while the request is written and `Stalled` if writing it takes longer
        than `timeout`. A malformed method or path is the caller's bug: `ValueError`.
        """
        request = render(method, path, body, self._header_bytes)  # fails before connecting
        sock = self._connect(timeout)
        exchange = send(SocketStream(sock), request, timeout=timeout, now=time.monotonic, peer=self.socket_path)
        if cancel is not None:
            exchange.watch(cancel)
        return exchange

    def _connect(self, timeout: float) -> socket.socket:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.socket_path}: no socket ({reason(exc)})") from exc
        limit = max(min(timeout, self._connect_timeout), 0.0)
        try:
            sock.settimeout(limit)
            sock.connect(self.socket_path)
        except (OSError, ValueError) as exc:
            sock.close()
            raise ConnectError(
                f"cannot connect to {self.socket_path}: {connect_reason(exc, limit, self.socket_path)}"
            ) from exc
        return sock


def exchange_over(
    sock: socket.socket,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    timeout: float,
    header_bytes: int,
    peer: str = "the server",
) -> UdsExchange:
    """Send the request on an already connected socket and return the exchange, which owns the
    socket from then on (closed on failure). Tests hand it one end of a `socketpair` to play the
    server byte by byte."""
    try:
        request = render(method, path, body, header_bytes)
    except ValueError:
        sock.close()
        raise
    return send(SocketStream(sock), request, timeout=timeout, now=time.monotonic, peer=peer)


def connect_reason(exc: BaseException, limit: float, path: str | None = None) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such socket file (is the server or proxy running?)"
    if isinstance(exc, ConnectionRefusedError):
        kind = _not_a_socket(path)
        if kind is not None:
            return f"it is {kind}, not a socket (the config's socket must name the proxy's socket file)"
        return "connection refused (nobody is listening on the socket)"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, TimeoutError):
        return f"connect timed out after {limit} s"
    if isinstance(exc, BlockingIOError):
        return "the server's accept backlog is full"
    return reason(exc)


def _not_a_socket(path: str | None) -> str | None:
    """What `path` is when it exists and is not a socket (the kernel says only "refused")."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISSOCK(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    return "a special file"
