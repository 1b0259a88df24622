"""HTTP/1.1 over a Unix socket: the real `Transport`, one request per connection.

h11 does the framing (status line, headers, chunked / content-length / read-to-close bodies);
this module owns the socket, the timeouts, the size cap on the head and the mapping of every
failure onto `domain.errors`.

Invariants:
- h11's state changes only when bytes (or EOF) are handed to it. A read that times out hands it
  nothing, so a timeout leaves the exchange exactly as it was: bytes already received stay in
  h11's buffer and the next read continues from them.
- EOF is handed to h11 only after it asked for more data (`NEED_DATA`), so every error h11
  raises after EOF means "the peer closed before the message was complete": those become
  `StreamClosedEarly` with where it happened; every other h11 error is a `ProtocolError`.
- No `OSError` leaves this module: connect failures are `ConnectError` naming the socket path,
  failures while writing or reading are `StreamClosedEarly` (or `Stalled` for a write timeout).
- `read` hands out each h11 `Data` event as it comes, one `bytes` per event, with no extra
  buffering: the streaming hot path is one `next_event` and, when h11 runs dry, one 64 KiB recv.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from typing import Final

import h11

from domain.errors import ConnectError, ProtocolError, Stalled, StreamClosedEarly
from ports.transport import TIMED_OUT, ResponseHead, TimedOut

RECV_BYTES: Final = 65536

_Data = h11.Data
_NEED_DATA = h11.NEED_DATA
_EndOfMessage = h11.EndOfMessage
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
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=self._header_bytes)
        request = _render_request(conn, method, path, body)
        sock = self._connect(timeout)
        try:
            sock.settimeout(max(timeout, 0.0))
            sock.sendall(request)
        except TimeoutError as exc:
            sock.close()
            raise Stalled(
                f"{method} {path}: writing the request to {self.socket_path} took over {timeout} s"
            ) from exc
        except OSError as exc:
            sock.close()
            raise StreamClosedEarly(
                f"{method} {path}: connection to {self.socket_path} closed while the request was "
                f"written ({_reason(exc)})"
            ) from exc
        return UdsExchange(sock, conn, f"{method} {path}", self._header_bytes)

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


def _render_request(conn: h11.Connection, method: str, path: str, body: bytes | None) -> bytes:
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
    return bytes(out)


class UdsExchange:
    """One request's response on its own connection. See `ports.transport` for the contract."""

    __slots__ = (
        "_body_bytes",
        "_closed",
        "_conn",
        "_ended",
        "_eof",
        "_fed",
        "_head",
        "_header_bytes",
        "_last",
        "_sock",
        "_timeout",
        "_what",
    )

    def __init__(self, sock: socket.socket, conn: h11.Connection, what: str, header_bytes: int) -> None:
        self._sock = sock
        self._conn = conn
        self._what = what
        self._header_bytes = header_bytes
        self._head: ResponseHead | None = None
        self._timeout: float | None = None
        self._fed = 0  # bytes handed to h11 so far
        self._body_bytes = 0
        self._last: h11.Data | None = None  # the last body event, for error messages
        self._eof = False
        self._ended = False
        self._closed = False

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
        deadline = _monotonic() + timeout
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._head_error(exc) from exc
            if event is _NEED_DATA:
                if not self._fill(deadline - _monotonic()):
                    return TIMED_OUT
            elif type(event) is h11.Response:
                return self._take_head(event)
            elif type(event) is not h11.InformationalResponse:  # pragma: no cover - h11 guarantees
                raise ProtocolError(f"{self._what}: unexpected {type(event).__name__} before the head")

    def read(self, timeout: float) -> bytes | TimedOut:
        """The next piece of the body; `b""` once it ended cleanly; `TIMED_OUT` after `timeout`."""
        if self._ended:
            return b""
        if self._head is None:
            if self._closed:
                raise StreamClosedEarly(f"{self._what}: exchange already closed")
            start = _monotonic()
            if self.head(timeout) is TIMED_OUT:
                return TIMED_OUT
            timeout -= _monotonic() - start
        elif self._closed:
            raise StreamClosedEarly(f"{self._what}: exchange already closed")
        conn = self._conn
        deadline: float | None = None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._body_error(exc) from exc
            if type(event) is _Data:
                self._last = event
                data = bytes(event.data)
                self._body_bytes += len(data)
                return data
            if event is _NEED_DATA:
                # The deadline is taken only when a recv is needed: pieces already buffered in
                # h11 cost no clock read.
                if deadline is None:
                    deadline = _monotonic() + timeout
                    remaining = timeout
                else:
                    remaining = deadline - _monotonic()
                if not self._fill(remaining):
                    return TIMED_OUT
            elif type(event) is _EndOfMessage:
                self._ended = True
                return b""
            else:  # pragma: no cover - ConnectionClosed after the end; h11 guarantees order
                self._ended = True
                return b""

    def read_all(self, limit: int, timeout: float) -> bytes:
        """The rest of the body, waiting at most `timeout` seconds in all.

        Raises `Stalled` if it does not complete in time and `ProtocolError` naming the limit if
        it would exceed `limit` bytes (checked against `Content-Length` before reading).
        """
        deadline = _monotonic() + timeout
        head = self.head(timeout)
        if isinstance(head, TimedOut):
            raise Stalled(f"{self._what}: no response head within {timeout} s")
        length = head.header("content-length")
        if length is not None and length.isdigit() and int(length) - self._body_bytes > limit:
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
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()

    # -- the socket side ------------------------------------------------------------------------

    def _fill(self, timeout: float) -> bool:
        """Hand h11 the next bytes (or EOF). False if none arrived within `timeout`."""
        if self._eof:  # pragma: no cover - h11 raises before asking for data after EOF
            raise StreamClosedEarly(f"{self._what}: connection already at EOF")
        sock = self._sock
        if timeout <= 0.0:
            timeout = 0.0
        if timeout != self._timeout:
            sock.settimeout(timeout)
            self._timeout = timeout
        try:
            data = sock.recv(RECV_BYTES)
        except (TimeoutError, BlockingIOError):
            return False
        except OSError as exc:
            if self._closed:
                raise StreamClosedEarly(f"{self._what}: exchange already closed") from exc
            raise StreamClosedEarly(f"{self._what}: connection failed {self._where()} ({_reason(exc)})") from exc
        if data:
            self._fed += len(data)
            self._conn.receive_data(data)
        else:
            self._eof = True
            self._conn.receive_data(b"")
        return True

    # -- the head -------------------------------------------------------------------------------

    def _take_head(self, event: h11.Response) -> ResponseHead:
        unread = len(self._conn.trailing_data[0])
        size = self._fed - unread
        if size > self._header_bytes:
            raise ProtocolError(
                f"{self._what}: response head of {size} bytes is over the {self._header_bytes}-byte limit"
            )
        headers = tuple((name.decode("ascii"), value.decode("latin-1")) for name, value in event.headers)
        head = ResponseHead(status=event.status_code, headers=headers)
        if head.header("transfer-encoding") is not None and head.header("content-length") is not None:
            # RFC 9112 lets Transfer-Encoding win, but the pair is the shape of a smuggling or
            # splitting attempt and no honest server sends it: refuse it.
            raise ProtocolError(f"{self._what}: response has both Transfer-Encoding and Content-Length")
        self._head = head
        return head

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

    # -- the body -------------------------------------------------------------------------------

    def _where(self) -> str:
        if self._head is None:
            return f"inside the response head after {self._fed} bytes"
        return self._body_place()

    def _body_place(self) -> str:
        head = self._head
        assert head is not None
        n = self._body_bytes
        if head.header("transfer-encoding") is not None:
            last = self._last
            if last is not None and not last.chunk_end:
                return f"inside a chunk after {n} body bytes"
            return f"between chunks after {n} body bytes (no terminating zero-size chunk)"
        length = head.header("content-length")
        if length is not None:
            return f"inside the body: content-length short, {n} of {length} bytes received"
        return f"inside the body after {n} bytes"  # pragma: no cover - read-to-close ends at EOF

    def _body_error(self, exc: h11.RemoteProtocolError) -> Exception:
        if self._eof:
            return StreamClosedEarly(f"{self._what}: connection closed {self._body_place()}")
        if str(exc) == "Receive buffer too long":
            return ProtocolError(
                f"{self._what}: chunk header or trailer over {self._header_bytes} bytes "
                f"after {self._body_bytes} body bytes"
            )
        return ProtocolError(f"{self._what}: malformed body after {self._body_bytes} bytes: {exc}")


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
