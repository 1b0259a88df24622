"""HTTP/1.1 over a Unix socket: the real `Transport`, one request per connection.

h11 renders the request and parses the status line and headers (validating them, refusing
conflicting `Content-Length`s and transfer codings other than `chunked`); `adapters.uds_http.body`
de-frames the body (chunked, content-length, read-to-close), because h11's per-chunk cost was
measured at more than the rest of the streaming client together. This module owns the socket,
the timeouts, the size cap on the head and the mapping of every failure onto `domain.errors`.

Invariants:
- Parser state changes only when bytes (or EOF) are handed to it. A read that times out hands
  over nothing, so a timeout leaves the exchange exactly as it was: bytes already received stay
  buffered and the next read continues from them.
- EOF is handed to h11 only after it asked for more data (`NEED_DATA`), so every error h11
  raises after EOF means "the peer closed inside the head": `StreamClosedEarly`. Every other
  framing error is a `ProtocolError`; EOF inside a body is `StreamClosedEarly` saying where.
- No `OSError` leaves this module: connect failures are `ConnectError` naming the socket path,
  failures while writing or reading are `StreamClosedEarly` (or `Stalled` for a write timeout).
- `read` hands out each chunk as soon as it is buffered, as one `bytes`; the hot path is one
  `pull` on the body reader and, when it runs dry, one 64 KiB recv.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from typing import Final

import h11

from adapters.uds_http.body import BodyReader, ChunkedBody, EmptyBody, LengthBody
from domain.errors import ConnectError, ProtocolError, Stalled, StreamClosedEarly
from ports.transport import TIMED_OUT, ResponseHead, TimedOut

RECV_BYTES: Final = 65536

_NEED_DATA = h11.NEED_DATA
_monotonic = time.monotonic


class UdsTransport:
    """Opens one connection per exchange to `socket_path` (nothing happens at construction)."""

    __slots__ = ("_connect_timeout", "_header_bytes", "socket_path")

    def __init__(
        self,
        socket_path: str,
        *,
        header_bytes: int = 16384,
        connect_timeout: float = 5.0,
    ) -> None:
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
    ) -> UdsExchange:
        """Connect, send the whole request and return the exchange.

        Raises `ConnectError` if the socket cannot be reached, `StreamClosedEarly` if the
        connection breaks while the request is written and `Stalled` if writing it takes longer
        than `timeout`. A malformed method or path is the caller's bug: `ValueError`.
        """
        conn, request = _render_request(method, path, body, self._header_bytes)  # fails before connecting
        sock = self._connect(timeout)
        return _start(sock, conn, request, method, path, timeout, self._header_bytes, self.socket_path)

    def _connect(self, timeout: float) -> socket.socket:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.socket_path}: no socket ({_reason(exc)})") from exc
        limit = max(min(timeout, self._connect_timeout), 0.0)
        try:
            sock.settimeout(limit)
            sock.connect(self.socket_path)
        except (OSError, ValueError) as exc:
            sock.close()
            raise ConnectError(f"cannot connect to {self.socket_path}: {_connect_reason(exc, limit)}") from exc
        return sock


def exchange_over(
    sock: socket.socket,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    timeout: float,
    header_bytes: int = 16384,
    peer: str = "the server",
) -> UdsExchange:
    """Send the request on an already connected socket and return the exchange, which owns the
    socket from then on (closed on failure). `UdsTransport.open` uses it; tests hand it one end
    of a `socketpair` to play the server byte by byte."""
    try:
        conn, request = _render_request(method, path, body, header_bytes)
    except ValueError:
        sock.close()
        raise
    return _start(sock, conn, request, method, path, timeout, header_bytes, peer)


def _start(
    sock: socket.socket,
    conn: h11.Connection,
    request: bytes,
    method: str,
    path: str,
    timeout: float,
    header_bytes: int,
    peer: str,
) -> UdsExchange:
    try:
        sock.settimeout(max(timeout, 0.0))
        sock.sendall(request)
    except TimeoutError as exc:
        sock.close()
        raise Stalled(f"{method} {path}: writing the request to {peer} took over {timeout} s") from exc
    except OSError as exc:
        sock.close()
        raise StreamClosedEarly(
            f"{method} {path}: connection to {peer} closed while the request was written ({_reason(exc)})"
        ) from exc
    return UdsExchange(sock, conn, method.upper(), f"{method} {path}", header_bytes)


def _render_request(
    method: str, path: str, body: bytes | None, header_bytes: int = 16384
) -> tuple[h11.Connection, bytes]:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=header_bytes)
    headers = [("Host", "localhost")]
    if body is not None:
        headers.append(("Content-Type", "application/json"))
        headers.append(("Content-Length", str(len(body))))
    headers.append(("Connection", "close"))
    try:
        out = conn.send(h11.Request(method=method, target=path, headers=headers))
        if body:
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise ValueError(f"cannot send {method!r} {path!r}: {exc}") from exc
    return conn, bytes(out)


class UdsExchange:
    """One request's response on its own connection. See `ports.transport` for the contract."""

    __slots__ = (
        "_body",
        "_closed",
        "_conn",
        "_eof",
        "_fed",
        "_head",
        "_header_bytes",
        "_lock",
        "_method",
        "_sock",
        "_timeout",
        "_what",
    )

    def __init__(self, sock: socket.socket, conn: h11.Connection, method: str, what: str, header_bytes: int) -> None:
        self._sock = sock
        self._conn: h11.Connection | None = conn  # only until the head is parsed
        self._method = method
        self._what = what
        self._header_bytes = header_bytes
        self._head: ResponseHead | None = None
        self._body: BodyReader | None = None
        self._timeout: float | None = None
        self._fed = 0  # bytes handed to h11 while reading the head
        self._eof = False
        self._closed = False
        self._lock = threading.Lock()  # close() and abort() may come from two threads

    def __enter__(self) -> UdsExchange:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def head(self, timeout: float) -> ResponseHead | TimedOut:
        """The status and headers, or `TIMED_OUT` if they did not arrive within `timeout`."""
        if self._head is not None:
            return self._head
        if self._closed:
            raise StreamClosedEarly(f"{self._what}: exchange already closed")
        conn = self._conn
        if conn is None:  # the head was refused (too big, ambiguous framing): keep refusing it
            raise ProtocolError(f"{self._what}: response head already refused")
        deadline = _monotonic() + timeout
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._head_error(exc) from exc
            if event is _NEED_DATA:
                data = self._recv(deadline - _monotonic())
                if data is None:
                    return TIMED_OUT
                if data:
                    self._fed += len(data)
                    conn.receive_data(data)
                else:
                    self._eof = True
                    conn.receive_data(b"")
            elif type(event) is h11.Response:
                return self._take_head(event)
            elif type(event) is not h11.InformationalResponse:  # pragma: no cover - h11 guarantees
                raise ProtocolError(f"{self._what}: unexpected {type(event).__name__} before the head")

    def read(self, timeout: float) -> bytes | TimedOut:
        """The next piece of the body; `b""` once it ended cleanly; `TIMED_OUT` after `timeout`."""
        body = self._body
        if body is None or self._closed:
            if self._closed:
                raise StreamClosedEarly(f"{self._what}: exchange already closed")
            start = _monotonic()
            if self.head(timeout) is TIMED_OUT:
                return TIMED_OUT
            timeout -= _monotonic() - start
            body = self._body
            assert body is not None
        piece = body.pull()
        if piece is not None:
            return piece
        # Nothing buffered: the only place a read waits, and the only clock read on the hot path.
        deadline = _monotonic() + timeout
        while True:
            data = self._recv(timeout)
            if data is None:
                return TIMED_OUT
            if data:
                body.push(data)
            else:
                self._eof = True
                body.eof()
            piece = body.pull()
            if piece is not None:
                return piece
            timeout = deadline - _monotonic()

    def read_all(self, limit: int, timeout: float) -> bytes:
        """The rest of the body, waiting at most `timeout` seconds in all.

        Raises `Stalled` if it does not complete in time and `ProtocolError` naming the limit if
        it would exceed `limit` bytes (checked against `Content-Length` before reading).
        """
        deadline = _monotonic() + timeout
        head = self.head(timeout)
        if isinstance(head, TimedOut):
            raise Stalled(f"{self._what}: no response head within {timeout} s")
        body = self._body
        assert body is not None
        length = head.header("content-length")
        if isinstance(body, LengthBody) and length is not None and int(length) - body.received > limit:
            raise ProtocolError(f"{self._what}: Content-Length {length} is over the {limit}-byte body limit")
        parts: list[bytes] = []
        total = 0
        while True:
            piece = self.read(max(deadline - _monotonic(), 0.0))
            if isinstance(piece, TimedOut):
                raise Stalled(f"{self._what}: body incomplete after {timeout} s ({total} bytes read)")
            if not piece:
                return b"".join(parts)
            total += len(piece)
            if total > limit:
                raise ProtocolError(f"{self._what}: body over the {limit}-byte limit")
            parts.append(piece)

    def close(self) -> None:
        """Close the connection (the server cancels the generation). Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):
                self._sock.close()

    def abort(self) -> None:
        """From any thread: shut the connection down, so a `head` or `read` blocked on it returns
        at once and the server sees the close. Never raises; the owner still calls `close`."""
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    # -- the socket side ------------------------------------------------------------------------

    def _recv(self, timeout: float) -> bytes | None:
        """The next bytes (`b""` at EOF), or None if none arrived within `timeout`."""
        if self._eof:  # pragma: no cover - the parsers end or raise at EOF
            raise StreamClosedEarly(f"{self._what}: connection already at EOF")
        sock = self._sock
        if timeout <= 0.0:
            timeout = 0.0
        if timeout != self._timeout:
            sock.settimeout(timeout)
            self._timeout = timeout
        try:
            return sock.recv(RECV_BYTES)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError as exc:
            if self._closed:
                raise StreamClosedEarly(f"{self._what}: exchange already closed") from exc
            raise StreamClosedEarly(f"{self._what}: connection failed {self._where()} ({_reason(exc)})") from exc

    def _where(self) -> str:
        if self._body is None:
            return f"inside the response head after {self._fed} bytes"
        return self._body.where()

    # -- the head -------------------------------------------------------------------------------

    def _take_head(self, event: h11.Response) -> ResponseHead:
        conn = self._conn
        assert conn is not None
        self._conn = None  # h11 is done either way: the body is read by a body reader
        unread, closed = conn.trailing_data
        size = self._fed - len(unread)
        if size > self._header_bytes:
            raise ProtocolError(
                f"{self._what}: response head of {size} bytes is over the {self._header_bytes}-byte limit"
            )
        if event.http_version not in (b"1.1", b"1.0"):
            raise ProtocolError(f"{self._what}: unsupported HTTP version {event.http_version.decode()!r}")
        headers = tuple((name.decode("ascii"), value.decode("latin-1")) for name, value in event.headers)
        head = ResponseHead(status=event.status_code, headers=headers)
        body = self._body_reader(head, unread)
        if closed:  # pragma: no cover - EOF is handed to h11 only when it needs more for the head
            body.eof()
        self._head = head
        self._body = body
        return head

    def _body_reader(self, head: ResponseHead, buffered: bytes) -> BodyReader:
        # RFC 9112 section 6.3, in order. h11 has already refused a transfer coding other than
        # `chunked` and conflicting Content-Length values.
        status = head.status
        if self._method == "HEAD" or status in (204, 304) or status < 200:
            return EmptyBody(self._what, buffered)
        coding = head.header("transfer-encoding")
        length = head.header("content-length")
        if coding is not None:
            if length is not None:
                # RFC 9112 lets Transfer-Encoding win, but the pair is the shape of a smuggling
                # or splitting attempt and no honest server sends it: refuse it.
                raise ProtocolError(f"{self._what}: response has both Transfer-Encoding and Content-Length")
            return ChunkedBody(self._what, self._header_bytes, buffered)
        if length is not None:
            return LengthBody(self._what, int(length), buffered)
        return BodyReader(self._what, buffered)

    def _head_error(self, exc: h11.RemoteProtocolError) -> Exception:
        if self._eof:
            if self._fed == 0:
                return StreamClosedEarly(f"{self._what}: connection closed before any response byte")
            return StreamClosedEarly(
                f"{self._what}: connection closed inside the response head after {self._fed} bytes"
            )
        if str(exc) == "Receive buffer too long":
            return ProtocolError(f"{self._what}: response head over the {self._header_bytes}-byte limit")
        return ProtocolError(f"{self._what}: malformed response head: {exc}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _connect_reason(exc: BaseException, limit: float) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such socket file (is the server or proxy running?)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nobody is listening on the socket)"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, TimeoutError):
        return f"connect timed out after {limit} s"
    if isinstance(exc, BlockingIOError):
        return "the server's accept backlog is full"
    return _reason(exc)
