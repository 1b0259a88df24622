"""One HTTP/1.1 request and its response over a `ByteStream`: the exchange every transport returns.

h11 renders the request and parses the status line and headers (validating them, refusing
conflicting `Content-Length`s and transfer codings other than `chunked`); `adapters.uds_http.body`
de-frames the body (chunked, content-length, read-to-close), because h11's per-chunk cost was
measured at more than the rest of the streaming client together. This module owns the waits,
the size cap on the head and the mapping of every stream failure onto `domain.errors`. Under it
is a Unix socket (`adapters.uds_http.transport`) or a script replayed on a fake clock
(`adapters.fake_server.memory`): both run this same code.

Invariants:
- Parser state changes only when bytes (or EOF) are handed to it. A read that times out hands
  over nothing, so a timeout leaves the exchange exactly as it was: bytes already received stay
  buffered and the next read continues from them.
- EOF is handed to h11 only after it asked for more data (`NEED_DATA`), so every error h11
  raises after EOF means "the peer closed inside the head": `StreamClosedEarly`. Every other
  framing error is a `ProtocolError`; EOF inside a body is `StreamClosedEarly` saying where.
- No `OSError` leaves this module: failures while writing or reading are `StreamClosedEarly`
  (or `Stalled` for a write timeout), saying where in the response they happened.
- One wait loop per purpose: the head's in `head`, the body's in `read`. `read` hands out each
  chunk as soon as it is buffered, as one `bytes`; the hot path is one `pull` on the body reader
  and, when it runs dry, one 64 KiB recv.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import h11

from adapters.uds_http.body import BodyReader, ChunkedBody, EmptyBody, LengthBody
from domain.errors import ProtocolError, Stalled, StreamClosedEarly
from ports.stream import ByteStream
from ports.transport import TIMED_OUT, CancelSignal, ResponseHead, TimedOut

RECV_BYTES: Final = 65536

_NEED_DATA = h11.NEED_DATA


@dataclass(frozen=True, slots=True)
class Request:
    """A request rendered by h11, ready to send; `conn` then parses its response's head."""

    method: str
    path: str
    data: bytes
    conn: h11.Connection
    header_bytes: int

    @property
    def what(self) -> str:
        return f"{self.method} {self.path}"


def render(method: str, path: str, body: bytes | None, header_bytes: int) -> Request:
    """The request's bytes (`Host`, a JSON body's type and length, `Connection: close`). A
    malformed method or path is the caller's bug: `ValueError`."""
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
    return Request(method, path, bytes(out), conn, header_bytes)


def send(stream: ByteStream, request: Request, *, timeout: float, now: Callable[[], float], peer: str) -> HttpExchange:
    """Write the whole request and return the exchange, which owns the stream from then on
    (closed on failure). `now` is the clock the waits are measured on; `peer` names the other
    end in errors. Raises `Stalled` if writing takes longer than `timeout` and
    `StreamClosedEarly` if the connection breaks meanwhile."""
    try:
        stream.send_all(request.data, max(timeout, 0.0))
    except TimeoutError as exc:
        stream.close()
        raise Stalled(f"{request.what}: writing the request to {peer} took over {timeout} s") from exc
    except OSError as exc:
        stream.close()
        raise StreamClosedEarly(
            f"{request.what}: connection to {peer} closed while the request was written ({reason(exc)})"
        ) from exc
    return HttpExchange(stream, request, now)


class HttpExchange:
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
        "_now",
        "_recv_from",
        "_stream",
        "_unwatch",
        "what",
    )

    def __init__(self, stream: ByteStream, request: Request, now: Callable[[], float]) -> None:
        self._stream = stream
        self._recv_from = stream.recv
        self._now = now
        self._conn: h11.Connection | None = request.conn  # only until the head is parsed
        self._method = request.method.upper()
        self.what = request.what
        self._header_bytes = request.header_bytes
        self._head: ResponseHead | None = None
        self._body: BodyReader | None = None
        self._fed = 0  # bytes handed to h11 while reading the head
        self._eof = False
        self._closed = False
        self._lock = threading.Lock()  # close() and abort() may come from two threads
        self._unwatch: Callable[[], None] | None = None

    def __enter__(self) -> HttpExchange:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def head(self, timeout: float) -> ResponseHead | TimedOut:
        """The status and headers, or `TIMED_OUT` if they did not arrive within `timeout`."""
        if self._head is not None:
            return self._head
        if self._closed:
            raise StreamClosedEarly(f"{self.what}: exchange already closed")
        conn = self._conn
        if conn is None:  # the head was refused (too big, ambiguous framing): keep refusing it
            raise ProtocolError(f"{self.what}: response head already refused")
        now = self._now
        deadline = now() + timeout
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._head_error(exc) from exc
            if event is _NEED_DATA:
                data = self._recv(deadline - now())
                if data is TIMED_OUT:
                    return TIMED_OUT
                if data:
                    self._fed += len(data)
                else:
                    self._eof = True
                conn.receive_data(data)
            elif type(event) is h11.Response:
                return self._take_head(event)
            elif type(event) is not h11.InformationalResponse:  # pragma: no cover - h11 guarantees
                raise ProtocolError(f"{self.what}: unexpected {type(event).__name__} before the head")

    def read(self, timeout: float) -> bytes | TimedOut:
        """The next piece of the body; `b""` once it ended cleanly; `TIMED_OUT` after `timeout`."""
        body = self._body
        if body is None or self._closed:
            if self._closed:
                raise StreamClosedEarly(f"{self.what}: exchange already closed")
            start = self._now()
            if self.head(timeout) is TIMED_OUT:
                return TIMED_OUT
            timeout -= self._now() - start
            body = self._body
            assert body is not None
        piece = body.pull()
        if piece is not None:
            return piece
        # Nothing buffered: the only place a read waits, and the only clock read on the hot path.
        if self._eof:  # pragma: no cover - the body readers end or raise at EOF
            raise StreamClosedEarly(f"{self.what}: connection already at EOF")
        recv = self._recv_from
        now = self._now
        deadline = now() + timeout
        while True:
            try:
                data = recv(RECV_BYTES, timeout)
            except OSError as exc:
                raise self._failure(exc) from exc
            if data is TIMED_OUT:
                return TIMED_OUT
            if data:
                body.push(data)
            else:
                self._eof = True
                body.eof()
            piece = body.pull()
            if piece is not None:
                return piece
            timeout = deadline - now()

    def close(self) -> None:
        """Close the connection (the server cancels the generation). Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stream.close()
        if self._unwatch is not None:
            self._unwatch()

    def watch(self, cancel: CancelSignal) -> None:
        """Abort this exchange when `cancel` fires (at once if it already has)."""
        self._unwatch = cancel.on_cancel(self.abort)

    def abort(self) -> None:
        """From any thread: shut the connection down, so a `head` or `read` blocked on it returns
        at once and the server sees the close. Never raises; the owner still calls `close`."""
        with self._lock:
            if not self._closed:
                self._stream.shutdown()

    # -- the stream side ------------------------------------------------------------------------

    def _recv(self, timeout: float) -> bytes | TimedOut:
        """The next bytes (`b""` at EOF), or `TIMED_OUT` if none arrived within `timeout`."""
        if self._eof:  # pragma: no cover - the parsers end or raise at EOF
            raise StreamClosedEarly(f"{self.what}: connection already at EOF")
        try:
            return self._recv_from(RECV_BYTES, timeout)
        except OSError as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: OSError) -> StreamClosedEarly:
        if self._closed:
            return StreamClosedEarly(f"{self.what}: exchange already closed")
        return StreamClosedEarly(f"{self.what}: connection failed {self._where()} ({reason(exc)})")

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
                f"{self.what}: response head of {size} bytes is over the {self._header_bytes}-byte limit"
            )
        if event.http_version not in (b"1.1", b"1.0"):
            raise ProtocolError(f"{self.what}: unsupported HTTP version {event.http_version.decode()!r}")
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
            return EmptyBody(self.what, buffered)
        coding = head.header("transfer-encoding")
        length = head.header("content-length")
        if coding is not None:
            if length is not None:
                # RFC 9112 lets Transfer-Encoding win, but the pair is the shape of a smuggling
                # or splitting attempt and no honest server sends it: refuse it.
                raise ProtocolError(f"{self.what}: response has both Transfer-Encoding and Content-Length")
            return ChunkedBody(self.what, self._header_bytes, buffered)
        if length is not None:
            return LengthBody(self.what, int(length), buffered)
        return BodyReader(self.what, buffered)

    def _head_error(self, exc: h11.RemoteProtocolError) -> Exception:
        if self._eof:
            if self._fed == 0:
                return StreamClosedEarly(f"{self.what}: connection closed before any response byte")
            return StreamClosedEarly(f"{self.what}: connection closed inside the response head after {self._fed} bytes")
        if str(exc) == "Receive buffer too long":
            return ProtocolError(f"{self.what}: response head over the {self._header_bytes}-byte limit")
        return ProtocolError(f"{self.what}: malformed response head: {exc}")


def reason(exc: BaseException) -> str:
    """An `OSError` in a few words: `ECONNRESET: Connection reset by peer`."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
    return str(exc) or type(exc).__name__
