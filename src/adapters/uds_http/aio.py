"""HTTP/1.1 over a Unix socket for asyncio: the real `AsyncTransport`, one request per connection.

The parsing is the blocking exchange's own (`adapters.uds_http.response`: h11 for the head and
its size cap, the body readers, the wording of every error); this module only waits, on the
event loop's socket API: a non-blocking socket, `loop.sock_recv` and `loop.sock_sendall`. That
API costs a half to a quarter of the CPU of asyncio streams per small chunk (no protocol
callback, no buffer copy per read; `bench/aio_read_bench.py`), and a socket closes at once, so a
cancelled task's `finally` ends the connection without awaiting anything.

Invariants:
- Nothing blocks the loop: connecting a Unix socket never waits (a full accept backlog fails at
  once, as it does for the blocking transport), every wait is an `await` with a deadline, and a
  read that finds bytes already there still lets the loop run once, so a fast sender never
  keeps one task running for more than one read's worth of parsing.
- A timeout hands nothing over: the parser is as it was, the next read continues.
- Cancelling the awaiting task raises `asyncio.CancelledError` out of `head`, `read` or `open`;
  `open` closes its socket first, and the exchange's owner calls `close()`, which takes the
  socket off the loop and closes it at once (the server sees the close and stops generating).
- No `OSError` leaves this module: connect failures are `ConnectError` naming the socket path,
  everything after it `StreamClosedEarly` or `Stalled`, worded as the blocking exchange words them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable

from adapters.uds_http.body import BodyReader
from adapters.uds_http.exchange import RECV_BYTES, write_failed, write_stalled
from adapters.uds_http.response import Request, ResponseParser, reason, render
from adapters.uds_http.transport import connect_reason
from domain.errors import ConnectError
from ports.stream import AsyncByteStream
from ports.transport import TIMED_OUT, ResponseHead, TimedOut

__all__ = ["AsyncHttpExchange", "AsyncSocketStream", "AsyncUdsTransport"]


class AsyncSocketStream:
    """The `AsyncByteStream` port over a connected socket, which it owns and makes non-blocking.
    Made and used inside one running event loop."""

    __slots__ = ("_fd", "_loop", "_sock")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()

    async def send_all(self, data: bytes, timeout: float) -> None:
        async with asyncio.timeout(max(timeout, 0.0)):
            await self._loop.sock_sendall(self._sock, data)

    async def recv(self, max_bytes: int, timeout: float) -> bytes | TimedOut:
        try:
            data = self._sock.recv(max_bytes)  # bytes already there: no future, no timer
        except (BlockingIOError, InterruptedError):
            if timeout <= 0.0:
                return TIMED_OUT
        else:
            # The reader is behind a fast sender: let the loop run once per read, so a long
            # answer is parsed in steps of one read each and never holds the loop for long.
            await asyncio.sleep(0)
            return data
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._loop.sock_recv(self._sock, max_bytes)
        except TimeoutError:
            if deadline.expired():
                return TIMED_OUT
            raise

    def close(self) -> None:
        # Off the loop first: a read or write future the task left behind (cancelled) would
        # otherwise unregister the descriptor later, when its number may belong to a new socket.
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
        with contextlib.suppress(OSError):
            self._sock.close()


class AsyncHttpExchange:
    """One request's response on its own connection; the `AsyncExchange` port (see
    `ports.transport`)."""

    __slots__ = ("_body", "_closed", "_eof", "_head", "_now", "_parser", "_stream", "what")

    def __init__(self, stream: AsyncByteStream, request: Request, now: Callable[[], float]) -> None:
        self._stream = stream
        self._now = now
        self._parser = ResponseParser(request)
        self.what = request.what
        self._head: ResponseHead | None = None
        self._body: BodyReader | None = None
        self._eof = False
        self._closed = False

    async def head(self, timeout: float) -> ResponseHead | TimedOut:
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
            data = await self._recv(deadline - now())
            if data is TIMED_OUT:
                return TIMED_OUT
            parser.receive_data(data)
            head = parser.next_head()
        self._eof = parser.eof
        self._body = parser.body
        self._head = head
        return head

    async def read(self, timeout: float) -> bytes | TimedOut:
        """The next piece of the body; `b""` once it ended cleanly; `TIMED_OUT` after `timeout`."""
        body = self._body
        if body is None or self._closed:
            if self._closed:
                raise self._parser.closed()
            start = self._now()
            if await self.head(timeout) is TIMED_OUT:
                return TIMED_OUT
            timeout -= self._now() - start
            body = self._body
            assert body is not None
        piece = body.pull()
        if piece is not None:
            return piece
        if self._eof:  # pragma: no cover - the body readers end or raise at EOF
            raise self._parser.at_eof()
        now = self._now
        deadline = now() + timeout
        while True:
            data = await self._recv(timeout)
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
        """Close the connection at once (the server cancels the generation). Idempotent; never
        raises; safe in a cancelled task's `finally`."""
        if not self._closed:
            self._closed = True
            self._stream.close()

    async def _recv(self, timeout: float) -> bytes | TimedOut:
        if self._parser.eof:  # pragma: no cover - the parsers end or raise at EOF
            raise self._parser.at_eof()
        try:
            return await self._stream.recv(RECV_BYTES, timeout)
        except OSError as exc:
            if self._closed:
                raise self._parser.closed() from exc
            raise self._parser.failure(exc) from exc


async def send_async(
    stream: AsyncByteStream, request: Request, *, timeout: float, now: Callable[[], float], peer: str
) -> AsyncHttpExchange:
    """Write the whole request and return the exchange, which owns the stream from then on
    (closed on failure and on cancellation)."""
    try:
        await stream.send_all(request.data, max(timeout, 0.0))
    except TimeoutError as exc:
        stream.close()
        raise write_stalled(request, peer, timeout) from exc
    except OSError as exc:
        stream.close()
        raise write_failed(request, peer, exc) from exc
    except BaseException:
        stream.close()
        raise
    return AsyncHttpExchange(stream, request, now)


class AsyncUdsTransport:
    """Opens one connection per exchange to `socket_path` (nothing happens at construction; a
    transport may serve several event loops, each exchange belongs to the loop that opened it)."""

    __slots__ = ("_header_bytes", "socket_path")

    def __init__(self, socket_path: str, *, header_bytes: int) -> None:
        self.socket_path = socket_path
        self._header_bytes = header_bytes

    def __repr__(self) -> str:
        return f"AsyncUdsTransport({self.socket_path!r})"

    async def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
    ) -> AsyncHttpExchange:
        """Connect, send the whole request and return the exchange. Raises as
        `UdsTransport.open` does."""
        request = render(method, path, body, self._header_bytes)  # fails before connecting
        stream = AsyncSocketStream(self._connect())
        return await send_async(stream, request, timeout=timeout, now=time.monotonic, peer=self.socket_path)

    def _connect(self) -> socket.socket:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.socket_path}: no socket ({reason(exc)})") from exc
        try:
            sock.setblocking(False)
            sock.connect(self.socket_path)  # a Unix socket connects at once or fails at once
        except (OSError, ValueError) as exc:
            sock.close()
            raise ConnectError(
                f"cannot connect to {self.socket_path}: {connect_reason(exc, 0.0, self.socket_path)}"
            ) from exc
        return sock
