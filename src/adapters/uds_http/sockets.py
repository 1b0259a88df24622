"""A connected Unix socket as a byte stream, in both flavours: the I/O primitives under the one
exchange (`adapters.uds_http._async.exchange` and its generated blocking twin).

`SocketStream` and `AsyncSocketStream` meet the `ByteStream` and `AsyncByteStream` contracts
(`ports.stream`) with the same signatures; only how they wait differs: a blocking socket with
its timeout, or a non-blocking one on the event loop (a reader callback for readiness and
`loop.sock_sendall`, which cost a half to a quarter of the CPU of asyncio streams per small
chunk, see `bench/aio_read_bench.py`). `connect(path, timeout)` makes either, or raises
`ConnectError` naming the socket path and what is wrong with it.

Invariants:
- The blocking socket's timeout is set only when a call's timeout differs from the last one, so a
  stream read with one timeout throughout costs one `recv` per call and nothing more.
- `send_now` is one non-blocking `send`. A write that the socket's buffer takes whole is one
  `send`, with no timer (a request, nearly always); only the rest waits, within the timeout.
- A non-blocking read that finds bytes waiting still lets the loop run once, so a fast sender
  never keeps one task running for more than one read's worth of parsing.
- A read that times out or is cancelled has taken no byte: it waits for the socket to be
  readable and only then reads, itself, so nothing received is ever dropped.
- A stream made under `places` holds its place until `close()` (or until it is collected
  unclosed): a connect that fails gives the place back before it raises.
- `shutdown()` may come from any thread while another (or the loop) waits in `recv`: the wait
  ends (EOF) and the peer sees the close. `close()` is idempotent; neither raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import time
import weakref
from collections.abc import Callable

from adapters.system import sleep_unless_cancelled
from adapters.uds_http.places import Place, Places
from adapters.uds_http.response import reason
from domain.connect_budget import ConnectBudget
from domain.errors import ConnectError
from ports.transport import TIMED_OUT, CancelSignal, TimedOut

__all__ = [
    "AsyncSocketStream",
    "BacklogWait",
    "SocketAhead",
    "SocketStream",
    "connect_reason",
    "turn_in",
    "unix_socket",
]

# The longest a connect may wait (a Unix socket connects at once or is refused; a full accept
# backlog is the only wait), and the pauses between its attempts meanwhile.
CONNECT_TIMEOUT_S = 5.0
# The longest a connect waits for its turn under the proxy's accept limit (`ConnectBudget`): far
# past any queue of one process's own requests (tens, at 2 a second), and still a bound.
TURN_WAIT_S = 60.0
_FIRST_PAUSE_S, _LAST_PAUSE_S = 0.001, 0.05


class SocketStream:
    """The `ByteStream` port over a connected blocking socket, which it owns, and the place it
    holds under the proxy's concurrency limit (`Places`), if any, given back at `close`."""

    __slots__ = ("_place", "_sock", "_timeout")

    def __init__(self, sock: socket.socket, place: Place | None = None) -> None:
        self._sock = sock
        self._timeout: float | None = None
        self._place = place

    @classmethod
    def connect(
        cls,
        path: str,
        timeout: float,
        cancel: CancelSignal | None = None,
        ahead: SocketAhead | None = None,
        budget: ConnectBudget | None = None,
        places: Places | None = None,
        *,
        at_once: bool = False,
    ) -> SocketStream:
        """A Unix socket connects at once or fails at once, but for a full accept backlog: that
        is waited out within the limit (`BacklogWait`), and `cancel` ends the wait. The first
        attempt takes the socket made `ahead`, if there is one. Under `places`, the connect
        first waits for a place (within `timeout`; `at_once`: only one free now, else
        `ConnectError`); under a `budget`, then for its turn (`cancel` ends either wait)."""
        place = None if places is None else places.take(timeout, cancel, path, at_once=at_once)
        try:
            delay = 0.0 if budget is None else turn_in(budget, path)
            if delay > 0.0 and sleep_unless_cancelled(delay, cancel):
                why = f"cancelled while waiting its turn under {budget}"
                raise ConnectError(f"cannot connect to {path}: {why}")
            sock = BacklogWait.first(path, timeout, ahead)
            if sock is None:  # the accept backlog is full: waited out
                wait = BacklogWait(path, timeout, time.monotonic)
                while (sock := wait.attempt()) is None:
                    if sleep_unless_cancelled(wait.pause(time.monotonic()), cancel):
                        raise wait.cancelled()
        except BaseException:
            if place is not None:
                place.release()
            raise
        stream = cls(sock, place)
        stream._timeout = 0.0  # connected non-blocking: a zero-timeout write sets nothing
        return stream

    def send_now(self, data: bytes) -> int:
        try:
            if (
                self._timeout
            ):  # a positive timeout: the descriptor is non-blocking, and `send` polls first
                return os.write(self._sock.fileno(), data)
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0

    def send_all(self, data: bytes, timeout: float) -> None:
        timeout = max(timeout, 0.0)
        if timeout != self._timeout:
            self._settimeout(timeout)
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

    def pause(self) -> None:
        return None

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._place is not None:
            self._place.release()

    def _settimeout(self, timeout: float) -> None:
        self._sock.settimeout(timeout)
        self._timeout = timeout


class AsyncSocketStream:
    """The `AsyncByteStream` port over a connected socket, which it owns and makes non-blocking.
    Made and used inside one running event loop."""

    __slots__ = ("_deadline", "_fd", "_loop", "_place", "_sock", "_timer", "_waiter", "_watching")

    def __init__(self, sock: socket.socket, place: Place | None = None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._place = place
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None  # the read waiting for readiness
        self._deadline = 0.0  # that read's, on the loop's clock
        self._watching = False  # the loop has `_readable` as the socket's reader
        self._timer: asyncio.TimerHandle | None = None  # due by the waiting read's deadline

    @classmethod
    async def connect(
        cls,
        path: str,
        timeout: float,
        cancel: CancelSignal | None = None,
        ahead: SocketAhead | None = None,
        budget: ConnectBudget | None = None,
        places: Places | None = None,
        *,
        at_once: bool = False,
    ) -> AsyncSocketStream:
        """`SocketStream.connect` on the loop: a full accept backlog is waited out within the
        limit (`BacklogWait`), a place and a `budget`'s turn first; cancelling the task ends
        each wait (`cancel` is the blocking flavour's way to, here the task's)."""
        place = None if places is None else await places.take_async(timeout, path, at_once=at_once)
        try:
            if budget is not None and (delay := turn_in(budget, path)) > 0.0:
                await asyncio.sleep(delay)
            sock = BacklogWait.first(path, timeout, ahead)
            if sock is None:  # the accept backlog is full: waited out
                loop = asyncio.get_running_loop()
                wait = BacklogWait(path, timeout, loop.time)
                while (sock := wait.attempt()) is None:
                    await asyncio.sleep(wait.pause(loop.time()))
        except BaseException:
            if place is not None:
                place.release()
            raise
        return cls(sock, place)

    def send_now(self, data: bytes) -> int:
        try:
            return self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0

    async def send_all(self, data: bytes, timeout: float) -> None:
        sent = self.send_now(data)  # what the socket's buffer takes whole: no timer
        if sent == len(data):
            return
        async with asyncio.timeout(max(timeout, 0.0)):
            await self._loop.sock_sendall(self._sock, memoryview(data)[sent:])

    async def recv(self, max_bytes: int, timeout: float) -> bytes | TimedOut:
        sock = self._sock
        try:
            data = sock.recv(max_bytes)  # bytes already there: no future, no timer
        except (BlockingIOError, InterruptedError):
            pass
        else:
            await asyncio.sleep(0)  # behind a fast sender: let the loop run once per read
            return data
        # Wait for readiness, then read ourselves: a read the loop made for us (`sock_recv`) and
        # a timeout or cancel landing in the same turn would drop the bytes it had taken.
        # The reader stays on the loop after a wait (`_readable` takes it off when it fires with
        # nobody waiting), so a read that got its bytes returns without a call to the selector;
        # so does the timer, while it is due no later than the deadline (`_expire`): a wait
        # sets one only when there is none that early, and none is cancelled when bytes come.
        loop = self._loop
        deadline = loop.time() + timeout
        while True:
            if deadline <= loop.time():
                return TIMED_OUT
            ready = self._waiter = loop.create_future()
            self._deadline = deadline
            if not self._watching:
                loop.add_reader(self._fd, self._readable)
                self._watching = True
            timer = self._timer
            if timer is None or timer.when() > deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_at(deadline, self._expire, deadline)
            try:
                await ready
            finally:
                self._waiter = None
            try:
                return sock.recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                continue  # woken by the timer, or readable for nothing: the deadline decides

    def _readable(self) -> None:
        """The socket's reader: wakes the read that waits; with none waiting (the bytes are
        being read, or nobody reads now), it stops watching, so bytes left unread never keep
        the loop turning."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        elif self._watching:
            self._watching = False
            self._loop.remove_reader(self._fd)

    def _expire(self, due: float) -> None:
        """The timer, set for `due`: wakes the read waiting if its deadline has come by then;
        one that waits longer gets the timer again, for its own deadline."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._deadline <= due:
            waiter.set_result(None)
        else:
            self._timer = self._loop.call_at(self._deadline, self._expire, self._deadline)

    async def pause(self) -> None:
        await asyncio.sleep(0)

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        # Off the loop first: a read or write future the task left behind (cancelled) would
        # otherwise unregister the descriptor later, when its number may belong to a new socket.
        self._watching = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._place is not None:
            self._place.release()


def turn_in(budget: ConnectBudget, path: str) -> float:
    """Book this connect's turn under `budget`: the seconds to wait for it (0: now), or
    `ConnectError` when it would come later than `TURN_WAIT_S`."""
    now = time.monotonic()
    turn = budget.reserve(now, now + TURN_WAIT_S)
    if turn is None:
        raise ConnectError(
            f"cannot connect to {path}: no turn within {TURN_WAIT_S:.0f} s under {budget}"
        )
    return turn - now


class BacklogWait:
    """The one rule of a connect, for both flavours: each attempt is a non-blocking connect that
    succeeds or fails at once, but for a full accept backlog, which is tried again after a pause
    doubling from 1 ms to 50 ms, until `timeout` (at most `CONNECT_TIMEOUT_S`) has passed; then
    it is a `ConnectError` saying so."""

    __slots__ = ("_deadline", "_limit", "_next", "_path")

    def __init__(self, path: str, timeout: float, now: Callable[[], float]) -> None:
        self._path = path
        self._limit = _limit(timeout)
        self._deadline = now() + self._limit
        self._next = _FIRST_PAUSE_S

    @staticmethod
    def first(path: str, timeout: float, ahead: SocketAhead | None = None) -> socket.socket | None:
        """The first attempt, which takes the socket made `ahead` (if there is one); nothing of
        the wait is set up unless it finds the backlog full (None)."""
        return _attempt(path, _limit(timeout), ahead.take() if ahead is not None else None)

    def attempt(self) -> socket.socket | None:
        """A connected non-blocking socket, or None while the backlog is full; `ConnectError`
        naming the path and what is wrong with it otherwise."""
        return _attempt(self._path, self._limit, None)

    def pause(self, now: float) -> float:
        """How long to wait before the next attempt; `ConnectError` once the limit has passed."""
        left = self._deadline - now
        if left <= 0.0:
            raise ConnectError(
                f"cannot connect to {self._path}: the server's accept backlog is full"
            )
        pause, self._next = min(self._next, left), min(self._next * 2, _LAST_PAUSE_S)
        return pause

    def cancelled(self) -> ConnectError:
        return ConnectError(
            f"cannot connect to {self._path}: cancelled while the server's accept backlog was full"
        )


class SocketAhead:
    """One unconnected Unix socket made ahead for a transport's next connect. Making a socket
    costs tens of µs once the process has sat idle for a few ms (56 µs, against 5 µs warm, on a
    2-core host), all on the way to the request's first byte; made just after a request is
    written (`refill`), while its answer is awaited, it costs the next request nothing. Nothing
    at the other end knows of it: it holds a descriptor, no connection, until `close` (or until
    it is collected). A socket made in another process (before a fork) is never taken, only
    closed. Safe to share between threads, and lock-free, so a fork at any moment leaves the
    child nothing held."""

    __slots__ = ("__weakref__", "_closed", "_ready")

    def __init__(self) -> None:
        # (the process that made it, the socket): one at most, but for an instant when two
        # threads refill at once. A list, as its `pop` and `append` are atomic.
        self._ready: list[tuple[int, socket.socket]] = []
        self._closed = False
        # Closed when this is collected, before the socket's own finalizer could find it open
        # (the two may be garbage in one cycle, whose finalizers run in no set order).
        weakref.finalize(self, _close_all, self._ready)

    def take(self) -> socket.socket | None:
        """The socket made ahead (the caller owns it), or None."""
        try:
            pid, sock = self._ready.pop()
        except IndexError:
            return None
        if pid != os.getpid():
            sock.close()  # the parent's (or a sibling's) too: this process makes its own
            return None
        return sock

    def refill(self) -> None:
        """Make the next socket, if none is waiting and `close` has not come. A failure (out of
        descriptors) is left to the next connect, which makes its own and says why it cannot."""
        if self._ready or self._closed:
            return
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            return
        sock.setblocking(False)  # as a connect wants it: one system call fewer on its way
        ready = self._ready
        ready.append((os.getpid(), sock))
        while len(ready) > 1:  # another thread refilled at once: one is enough
            with contextlib.suppress(IndexError):
                ready.pop()[1].close()
        if self._closed:  # a close that came meanwhile
            _close_all(ready)

    def close(self) -> None:
        """Close the socket waiting, if any, and make none from now on. Idempotent."""
        self._closed = True
        _close_all(self._ready)


def _limit(timeout: float) -> float:
    return max(min(timeout, CONNECT_TIMEOUT_S), 0.0)


def _attempt(path: str, limit: float, sock: socket.socket | None) -> socket.socket | None:
    """One non-blocking connect, on `sock` (made ahead, non-blocking already) or a new socket
    (see `BacklogWait.attempt`)."""
    if sock is None:
        sock = unix_socket(path)
    try:
        if sock.getblocking():
            sock.setblocking(False)
        sock.connect(path)
    except BlockingIOError:
        sock.close()
        return None
    except (OSError, ValueError) as exc:
        sock.close()
        raise ConnectError(f"cannot connect to {path}: {connect_reason(exc, limit, path)}") from exc
    return sock


def _close_all(ready: list[tuple[int, socket.socket]]) -> None:
    while ready:
        with contextlib.suppress(IndexError):
            ready.pop()[1].close()


def unix_socket(path: str) -> socket.socket:
    try:
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConnectError(f"cannot connect to {path}: no socket ({reason(exc)})") from exc


def connect_reason(exc: BaseException, limit: float, path: str | None = None) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such socket file (is the server or proxy running?)"
    if isinstance(exc, ConnectionRefusedError):
        kind = _not_a_socket(path)
        if kind is not None:
            why = "the config's socket must name the proxy's socket file"
            return f"it is {kind}, not a socket ({why})"
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
