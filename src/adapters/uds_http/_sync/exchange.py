# Generated from src/adapters/uds_http/_async/exchange.py by scripts/unasync.py: do not edit.
"""One HTTP/1.1 request and its response over a byte stream, written once for both flavours.

Written once: the asyncio flavour under `_async/` is the source, and the blocking one under
`_sync/` is generated from it by `scripts/unasync.py` (drop `async`, `await` and the `Async`
prefix). The parsing is
`adapters.uds_http.response` (sans-IO: h11 for the head and its size cap, the body readers for
the framing, the wording of every error); this module owns the waits and the mapping of every
stream failure onto `domain.errors`. Under it is a Unix socket (`adapters.uds_http.sockets`) or a
script replayed on a fake clock (`adapters.fake_server.memory`): both run this same code.

Invariants:
- Parser state changes only when bytes (or EOF) are handed to it. A read that times out hands
  over nothing, so a timeout leaves the exchange exactly as it was: bytes already received stay
  buffered and the next read continues from them.
- No `OSError` leaves this module: failures while writing or reading are `StreamClosedEarly`
  (or `Stalled` for a write timeout), saying where in the response they happened.
- A call's cancellation is tied to the exchange before the first byte of the request is written
  (`send(..., cancel=)`), so a cancel while a large request is written, or while the server reads
  it slowly, shuts the connection down at once. The first write never waits (`send_now`: the
  socket's buffer nearly always takes a request whole); only what it left waits, within the timeout.
- A close (EOF or reset) before any response byte within `REFUSED_WITHIN_S` of the request's
  last byte written, or while it was written, is a refusal (`ProxyRefused`, retried after the
  proxy's refill time): what inferproxy does over its limits. Later, or after any response
  byte, the server may have started on it: `StreamClosedEarly`.
- One wait loop per purpose: the head's in `head`, the body's in `read`. `read` hands out each
  chunk as soon as it is buffered, as one `bytes`; the hot path is one `pull` on the body reader
  and, when it runs dry, one 64 KiB recv.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from adapters.uds_http.body import BodyReader
from adapters.uds_http.response import Request, ResponseParser, write_failed, write_stalled
from domain.errors import InferError, StreamClosedEarly
from domain.retry import REFILL_S
from ports.stream import ByteStream
from ports.transport import TIMED_OUT, CancelSignal, ResponseHead, TimedOut

__all__ = ["RECV_BYTES", "HttpExchange", "send"]

RECV_BYTES: Final = 65536
# Pieces handed out from what one receive buffered before the reader lets the loop run once: a
# server that sends a body in one-byte chunks packs 10,000 of them into one receive, and parsing
# them all at once would hold an event loop for tens of milliseconds.
PIECES_PER_PAUSE: Final = 64
# How soon after the request's last byte a close with no response byte is still a refusal: the
# proxy closes what it refuses as it accepts it, a few ms at most on a busy host; no server that
# took a request closes it unanswered that soon but one that is down (the bytes are the same).
REFUSED_WITHIN_S: Final = 0.25


def send(
    stream: ByteStream,
    request: Request,
    *,
    timeout: float,
    now: Callable[[], float],
    peer: str,
    cancel: CancelSignal | None = None,
    refill_s: float = REFILL_S,
    refused: Callable[[], None] | None = None,
) -> HttpExchange:
    """Write the whole request and return the exchange, which owns the stream from then on
    (closed on failure). `now` is the clock the waits are measured on; `peer` names the other
    end in errors; `cancel` aborts the exchange when it fires, from the first byte written on;
    `refill_s` is the wait a refusal asks for (`ProxyRefused`), `refused` is told of one.
    Raises `Stalled` if writing takes longer than `timeout` and `ProxyRefused` if the
    connection breaks meanwhile."""
    exchange = HttpExchange(stream, request, now, refill_s, refused)
    if cancel is not None:
        exchange.watch(cancel)
    data = request.data
    try:
        sent = stream.send_now(data)  # nearly always the whole request: one write, no wait
        if sent < len(data):
            stream.send_all(data[sent:] if sent else data, max(timeout, 0.0))
    except TimeoutError as exc:
        if _answered_early(exchange):  # it stopped reading, its answer sent
            return exchange
        exchange.close()
        raise write_stalled(request, peer, timeout) from exc
    except OSError as exc:
        if _answered_early(exchange):
            return exchange
        exchange.close()
        if refused is not None:
            refused()
        raise write_failed(request, peer, exc, refill_s) from exc
    except BaseException:
        exchange.close()
        raise
    exchange.sent_at = now()
    return exchange


def _answered_early(exchange: HttpExchange) -> bool:
    """Whether a server that broke off the request had answered it first (an error, such as 413
    for a body too large, sent before it closes, or stops reading, without the rest): a whole
    head already received is the answer, read on as any other."""
    try:
        return not isinstance(exchange.head(0.0), TimedOut)
    except (OSError, InferError):
        return False


class HttpExchange:
    """One request's response on its own connection. See `ports.transport` for the contract."""

    __slots__ = (
        "_body",
        "_closed",
        "_eof",
        "_head",
        "_lock",
        "_now",
        "_parser",
        "_pieces",
        "_recv_from",
        "_refill_s",
        "_refusal",
        "_stream",
        "_unwatch",
        "sent_at",
        "what",
    )

    def __init__(
        self,
        stream: ByteStream,
        request: Request,
        now: Callable[[], float],
        refill_s: float = REFILL_S,
        refused: Callable[[], None] | None = None,
    ) -> None:
        self._stream = stream
        self._refill_s = refill_s
        self._refusal = refused
        self.sent_at: float | None = None  # when the request's last byte was written
        self._recv_from = stream.recv
        self._now = now
        self._parser = ResponseParser(request)
        self.what = request.what
        self._head: ResponseHead | None = None
        self._body: BodyReader | None = None  # the parser's, once the head is parsed
        self._eof = False
        self._closed = False
        self._pieces = 0  # handed out since the last wait or pause
        # close() and abort() may come from two threads, or abort() from a signal handler that
        # interrupted close() in the same thread: re-entrant.
        self._lock = threading.RLock()
        self._unwatch: Callable[[], None] | None = None

    def __enter__(self) -> HttpExchange:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def head(self, timeout: float) -> ResponseHead | TimedOut:
        """The status and headers, or `TIMED_OUT` if they did not arrive within `timeout`."""
        if self._head is not None:
            return self._head
        parser = self._parser
        if self._closed:
            raise parser.closed()
        now = self._now
        deadline = now() + timeout
        head = parser.next_head()
        while head is None:
            data = self._recv(deadline - now())
            if data is TIMED_OUT:
                return TIMED_OUT
            parser.receive_data(data)
            head = parser.next_head()
            if (
                head is None and now() >= deadline
            ):  # bytes that keep coming are no head (a flood of 1xx)
                return TIMED_OUT
        self._eof = parser.eof
        self._body = parser.body
        self._head = head
        return head

    def read(self, timeout: float) -> bytes | TimedOut:
        """The next piece of the body; `b""` once it ended cleanly; `TIMED_OUT` after `timeout`."""
        body = self._body
        if body is None or self._closed:
            if self._closed:
                raise self._parser.closed()
            start = self._now()
            if self.head(timeout) is TIMED_OUT:
                return TIMED_OUT
            timeout -= self._now() - start
            body = self._body
            assert body is not None
        piece = body.pull()
        if piece is not None:
            self._pieces += 1
            if self._pieces >= PIECES_PER_PAUSE:
                self._pieces = 0
                self._stream.pause()
            return piece
        # Nothing buffered: the only place a read waits, and the only clock read on the hot path.
        self._pieces = 0
        if self._eof:  # pragma: no cover - the body readers end or raise at EOF
            raise self._parser.at_eof()
        now = self._now
        deadline = now() + timeout
        while True:
            data = self._recv(timeout)
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
            if timeout <= 0:  # framing bytes that keep coming are no piece
                return TIMED_OUT

    def close(self) -> None:
        """Close the connection (the server cancels the generation). Idempotent; never raises;
        safe in the `finally` of a cancelled task."""
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
        """From any thread: shut the connection down, so a `head` or `read` waiting on it returns
        at once and the server sees the close. Never raises; the owner still calls `close`."""
        with self._lock:
            if not self._closed:
                self._stream.shutdown()

    def _recv(self, timeout: float) -> bytes | TimedOut:
        """The next bytes (`b""` at EOF), or `TIMED_OUT` if none arrived within `timeout`."""
        if self._parser.eof:  # pragma: no cover - the parsers end or raise at EOF
            raise self._parser.at_eof()
        try:
            data = self._recv_from(RECV_BYTES, timeout)
        except OSError as exc:
            raise self._failure(exc) from exc
        if not data and self._refused():
            raise self._refused_now(None)
        return data

    def _refused_now(self, exc: OSError | None) -> StreamClosedEarly:
        if self._refusal is not None:
            self._refusal()
        return self._parser.refused(exc, self._refill_s)

    def _failure(self, exc: OSError) -> StreamClosedEarly:
        if self._closed:
            return self._parser.closed()
        if self._refused():
            return self._refused_now(exc)
        return self._parser.failure(exc)

    def _refused(self) -> bool:
        """Whether a close now, before any response byte, is a refusal (see the module)."""
        sent = self.sent_at
        if sent is None or not self._parser.untouched:
            return False
        return self._now() - sent <= REFUSED_WITHIN_S
