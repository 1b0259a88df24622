"""The accept loop: limits on the way in, a `Connection` per accepted client, a clean stop.

Invariants:
- Every accept attempt takes a token from the bucket first, so a storm of retries is rationed
  even while all slots are busy; then at most `max_conns` connections are open at once. A client
  over either limit is closed at once; the first refusals get a line each that names the limit,
  a flood gets one summary line a second (`RefusalLines`).
- `stop()` only sets a flag and writes one byte to a pipe, so it is safe from a signal handler
  and from any thread. `serve()` then stops accepting, shuts every connection, removes the socket
  file (if it is still ours), releases its lock and waits for the connection threads to end.
- A flood cannot delay the stop: each wake-up accepts at most `ACCEPT_BATCH` clients and the stop
  flag is looked at before every one of them.
- Nothing in the loop blocks but its select. A log that can be drained (`DrainableLog`, the
  process's stderr) is written without blocking; the loop watches its descriptor while lines wait.
  Out of descriptors, accepting pauses briefly by leaving the listener out of the select, not by
  sleeping.
- A connection counts against `max_conns` from accept (a spare: from when it is made) until both
  its sockets are closed; a client that sends nothing gives its place back after
  `first_byte_timeout` (`Connection`). A client that finds every place taken while one of them
  is ending (its client has hung up; its threads deliver what is in flight, then close) waits
  for that place, at most `ENDING_WAIT_S`, before it is refused: a client that closes and
  connects again at once never meets its own old connection, however late its threads run.
- One spare connection (its two threads started, its upstream connection made ahead, no client)
  waits for the next client, so an accept hands a client over instead of starting threads and
  connecting, and what the client has sent by then goes up at once (`Connection.forward_first`).
  It counts against `max_conns` (not the bucket: it was never accepted), as its connection ahead
  holds one of the upstream's HTTP threads like a client's: the spare and the open connections
  are never more than `max_conns` together, so none is made while every place is in use, and a
  connection that ends wakes the loop to make one. A client takes the spare whenever there is
  one (the spare held its place); one that finds none gets a connection made there and then. The
  next spare is made `SPARE_AFTER_S` after a client took the last one, not at once: starting
  threads holds the GIL, which the connection just taken needs for its first bytes. The spare is
  aborted and joined when `serve()` ends.
"""

import contextlib
import errno
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence

from adapters.proxy.bucket import TokenBucket
from adapters.proxy.connection import READY_EVERY_S, AddressInfo, Connection
from adapters.proxy.options import Address, ProxyLimits
from adapters.proxy.pump import Mover, default_mover
from adapters.proxy.refusals import RefusalLines
from adapters.proxy.socket_file import BoundSocket, remove_socket_file
from adapters.proxy.stderr_log import DrainableLog, StderrLog

Log = Callable[[str], None]

CONNECT_TIMEOUT_S = 5.0
ACCEPT_BATCH = 64
SPARE_AFTER_S = 0.002
ENDING_WAIT_S = 0.1  # how long a client may wait for the place of a connection that is ending
_JOIN_ON_STOP_S = 2.0
_ACCEPT_PAUSE_S = 0.05
# An accept that fails (out of descriptors) says so at most once a second, with how many failed
# since: the backlog is tried again every `_ACCEPT_PAUSE_S`, and each try would be a line.
_ACCEPT_FAILURE_LINE_S = 1.0
_TRANSIENT_ACCEPT = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, errno.ECONNABORTED, errno.EPROTO}
_ACCEPT, _WAKE, _LOG = "accept", "wake", "log"


class Proxy:
    def __init__(
        self,
        bound: BoundSocket,
        upstream: Address,
        limits: ProxyLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        log: Log | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        mover: Mover | None = None,
        ready_every: float | None = READY_EVERY_S,
    ) -> None:
        """`ready_every`: how often a spare connects upstream ahead (`Connection`); None: never."""
        self._bound = bound
        self._ready_every = ready_every
        self._upstream = upstream
        self._limits = limits if limits is not None else ProxyLimits()
        self._bucket = TokenBucket(self._limits.burst, self._limits.rate, clock)
        self._refusals = RefusalLines(clock)
        self._clock = clock
        self._log: Log = log if log is not None else StderrLog()
        self._drainable = self._log if isinstance(self._log, DrainableLog) else None
        self._connect_timeout = connect_timeout
        self._mover = mover if mover is not None else default_mover()
        self._addresses = fixed_addresses(upstream)
        self._open: set[Connection] = set()
        self._spare: Connection | None = None
        self._taken: list[
            Connection
        ] = []  # taken by a client in this turn, to wake before the select
        self._spare_at: float | None = (
            time.monotonic()
        )  # when to make the next spare, while there is none
        self._finished: list[threading.Thread] = []
        self._changed = threading.Condition()
        self._stopping = False
        self._serial = 0
        self._accepted = 0
        self._resume_accept_at: float | None = None  # set while accept pauses, out of descriptors
        self._accept_failures = 0  # since the last line that said so
        self._accept_failure_line_at = -_ACCEPT_FAILURE_LINE_S
        self._wake_read = self._wake_write = -1  # the wake-up pipe exists while serve() runs
        self._log_fd = -1  # the log's descriptor while the selector watches it
        self._wake_lock = threading.Lock()

    @property
    def start_line(self) -> str:
        return f"listening on {self._bound.path}, forwarding to {self._upstream}; {self._limits}"

    @property
    def open_connections(self) -> int:
        with self._changed:
            return len(self._open)

    @property
    def accepted(self) -> int:
        """Clients accepted so far, refused ones included (read by the serving thread, or after)."""
        return self._accepted

    def stop(self) -> None:
        """Ask `serve` to wind down. Signal-safe: takes no lock."""
        self._stopping = True
        self._wake()

    def wait_open_at_most(self, count: int, timeout: float) -> bool:
        """Wait until at most `count` connections are open; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._open) <= count, timeout)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no connection is open, their threads have ended and the next spare is
        made, with what it makes ahead (or none is due); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            if not self._changed.wait_for(
                lambda: not self._open and not self._spare_due(), timeout
            ):
                return False
            spare = self._spare
        if spare is not None and not spare.prepared.wait(max(0.0, deadline - time.monotonic())):
            return False
        self._reap()
        return True

    def serve(self) -> None:
        """Accept and forward until `stop()`; always leaves the socket file removed and unlocked."""
        listener = self._bound.sock
        listener.setblocking(False)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        selector = selectors.DefaultSelector()
        try:
            selector.register(listener, selectors.EVENT_READ, _ACCEPT)
            selector.register(self._wake_read, selectors.EVENT_READ, _WAKE)
            while not self._stopping:
                self._make_spare()
                self._watch_log(selector)
                timeout = self._select_timeout()
                # Woken just before the select, which frees the GIL for their first bytes.
                for taken in self._taken:
                    taken.wake()
                self._taken.clear()
                for key, _events in selector.select(timeout):
                    if self._stopping:
                        break
                    if key.data == _ACCEPT:
                        self._accept_batch(listener, selector)
                    elif key.data == _WAKE:
                        _empty_pipe(self._wake_read)
                    elif self._drainable is not None:
                        self._drainable.drain()
                if self._taken:
                    continue  # the rest waits for the next wake-up (the spare's, at the latest)
                self._say(self._refusals.due())
                self._resume_accepting(listener, selector)
                self._reap()
        finally:
            selector.close()
            self._log_fd = -1
            listener.close()
            with self._changed:
                current = list(self._open)
            for connection in current:
                connection.abort()
            with self._changed:
                spare, self._spare, self._spare_at = self._spare, None, None
            if spare is not None:
                spare.abort()
            remove_socket_file(self._bound)
            self._say(self._refusals.flush())
            self.wait_idle(_JOIN_ON_STOP_S)
            if spare is not None:
                spare.thread.join(_JOIN_ON_STOP_S)
                self._reap()
            with self._wake_lock:
                wake_read, wake_write = self._wake_read, self._wake_write
                self._wake_read = self._wake_write = -1
                os.close(wake_read)
                os.close(wake_write)

    def _select_timeout(self) -> float | None:
        timeouts = [self._refusals.seconds_until_due()]
        # A spare that waits for a place is not timed: the connection that frees one wakes the loop.
        for due in (self._resume_accept_at, self._spare_at if self._room() else None):
            if due is not None:
                timeouts.append(max(0.0, due - time.monotonic()))
        known = [t for t in timeouts if t is not None]
        return min(known) if known else None

    def _watch_log(self, selector: selectors.BaseSelector) -> None:
        """Watch the log's descriptor for writing exactly while it has lines waiting."""
        log = self._drainable
        if log is None:
            return
        watched = self._log_fd >= 0
        fd = log.fileno() if log.pending else -1
        if fd == self._log_fd:
            return
        if watched:
            selector.unregister(self._log_fd)
            self._log_fd = -1
        if fd >= 0:
            try:
                selector.register(fd, selectors.EVENT_WRITE, _LOG)
            except (OSError, ValueError):
                return  # a descriptor the selector cannot watch: lines go out on later calls
            self._log_fd = fd

    def _accept_batch(self, listener: socket.socket, selector: selectors.BaseSelector) -> None:
        # Bounded, and the stop flag is read before each accept: a flood that outpaces the loop
        # must neither delay a stop nor starve the log and the refusal summaries.
        for _ in range(ACCEPT_BATCH):
            if self._stopping:
                return
            try:
                client, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _TRANSIENT_ACCEPT:
                    continue
                # Out of descriptors or similar: say so (once a second), and let the backlog
                # wait a moment.
                self._accept_failed(exc)
                selector.unregister(listener)
                self._resume_accept_at = time.monotonic() + _ACCEPT_PAUSE_S
                return
            self._accepted += 1
            if self._admit(client):
                # Back to the select at once: the connection just taken needs the GIL for its
                # first bytes, and the next wake-up accepts whoever else is waiting.
                return

    def _resume_accepting(self, listener: socket.socket, selector: selectors.BaseSelector) -> None:
        if self._resume_accept_at is not None and time.monotonic() >= self._resume_accept_at:
            self._resume_accept_at = None
            selector.register(listener, selectors.EVENT_READ, _ACCEPT)

    def _accept_failed(self, exc: OSError) -> None:
        self._accept_failures += 1
        now = self._clock()
        if now - self._accept_failure_line_at < _ACCEPT_FAILURE_LINE_S:
            return
        more = self._accept_failures - 1
        self._log(
            f"accept failed: {exc.strerror}"
            + (f" ({more} more since the last such line)" if more else "")
        )
        self._accept_failures, self._accept_failure_line_at = 0, now

    def _admit(self, client: socket.socket) -> bool:
        """Hand `client` a connection, or refuse it; whether it was handed one."""
        if not self._bucket.take():
            self._refuse(
                client,
                f"accept rate limit (burst {self._limits.burst}, refill {self._limits.rate:g}/s)",
            )
            return False
        if self.open_connections >= self._limits.max_conns:
            self._wait_for_an_ending_one()
        with self._changed:  # one look at the state, on the way to the client's first bytes
            full = len(self._open) >= self._limits.max_conns
            connection = None
            if not full:
                connection, self._spare = self._spare, None
                if connection is not None:
                    self._open.add(connection)
        if full:
            self._refuse(client, f"{self._limits.max_conns} connections already open")
            return False
        if connection is None:
            connection = self._new_connection(spare=False)
            if connection is None:
                self._refuse(client, "cannot start a thread")
                return False
            with self._changed:
                self._open.add(connection)
        client.setblocking(True)
        if not connection.take(
            client, time.monotonic() + self._limits.first_byte_timeout
        ):  # pragma: no cover
            with self._changed:
                self._open.discard(connection)
                self._changed.notify_all()
            self._refuse(client, "the proxy is stopping")
            return False
        connection.forward_first()
        self._taken.append(connection)
        with self._changed:
            if self._spare_at is None:
                self._spare_at = time.monotonic() + SPARE_AFTER_S
        return True

    def _wait_for_an_ending_one(self) -> None:
        """Every place taken: if a connection's client has hung up, that connection is ending;
        its place is waited for, `ENDING_WAIT_S` at most (`stop` cannot wake this wait, being
        signal-safe: it is seen when the wait ends)."""
        with self._changed:
            current = list(self._open)
        if not any(connection.client_gone() for connection in current):
            return
        limit = self._limits.max_conns
        with self._changed:
            self._changed.wait_for(lambda: len(self._open) < limit or self._stopping, ENDING_WAIT_S)

    def _spare_due(self) -> bool:
        return self._spare is None and self._spare_at is not None

    def _room(self) -> bool:
        """Whether a place is free for a spare: the open connections leave one."""
        with self._changed:
            return len(self._open) < self._limits.max_conns

    def _make_spare(self) -> None:
        due = (
            self._spare_due() and self._spare_at is not None and time.monotonic() >= self._spare_at
        )
        if due and self._room():
            spare = self._new_connection(spare=True)
            with self._changed:
                self._spare = spare
                self._spare_at = None if spare is not None else time.monotonic() + _ACCEPT_PAUSE_S
                self._changed.notify_all()

    def _new_connection(self, *, spare: bool) -> Connection | None:
        """A connection, its threads started, waiting for a client (a spare connects upstream
        ahead, one made for a client at hand does not); None if a thread cannot start."""
        self._serial += 1
        connection = Connection(
            self._upstream,
            name=f"inferproxy-{self._serial}",
            connect_timeout=self._connect_timeout,
            first_byte_timeout=self._limits.first_byte_timeout,
            mover=self._mover,
            on_closed=self._closed,
            on_finished=self._finish,
            addresses=self._addresses,
            ready_every=self._ready_every if spare else None,
        )
        try:
            connection.start()
        except RuntimeError:  # cannot start a thread
            return None
        return connection

    def _refuse(self, client: socket.socket, reason: str) -> None:
        # The line (if this refusal gets one) goes out before the close, so whoever sees the
        # close can see the line.
        self._say(self._refusals.refused(reason))
        client.close()

    def _say(self, lines: list[str]) -> None:
        for line in lines:
            self._log(line)

    def _wake(self) -> None:
        wake = self._wake_write
        if wake >= 0:
            # A full pipe means a wake-up is already pending.
            with contextlib.suppress(OSError):
                os.write(wake, b"\0")

    def _closed(self, reason: str) -> None:
        """A connection gave up after it was admitted (upstream unreachable, a silent client)."""
        self._log(f"closed a connection: {reason}")
        if self._drainable is not None and self._drainable.pending:
            # Written from a connection thread: the accept loop must learn that lines wait. The
            # lock keeps this write off a wake-up pipe that `serve` is closing (its number could
            # already belong to someone else); `stop` cannot take it, being signal-safe, and
            # needs none, as it runs on the serving thread or before the pipe is closed.
            with self._wake_lock:
                self._wake()

    def _finish(self, connection: Connection) -> None:
        with self._changed:
            self._open.discard(connection)
            self._finished.append(connection.thread)
            self._changed.notify_all()
            spare_waits = self._spare_due()
        if spare_waits:  # perhaps for the place this connection held: the loop sleeps until told
            with self._wake_lock:  # (as in `_closed`: never a write to a pipe being closed)
                self._wake()

    def _reap(self) -> None:
        # A finished thread has nothing left to run but its return, so joining it is immediate.
        with self._changed:
            threads, self._finished = self._finished, []
        for thread in threads:
            thread.join()


def fixed_addresses(upstream: Address) -> Sequence[AddressInfo] | None:
    """What `upstream` resolves to, when that cannot change: a numeric host; else None (a name is
    resolved at every connect)."""
    try:
        return socket.getaddrinfo(
            upstream.host, upstream.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    except (socket.gaierror, UnicodeError):
        return None


def _empty_pipe(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass
