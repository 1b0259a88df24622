"""The accept loop: limits on the way in, a `Connection` per accepted client, a clean stop.

Invariants:
- Every accept attempt takes a token from the bucket first, so a storm of retries is rationed
  even while all slots are busy; then at most `max_conns` connections are open at once. A client
  over either limit is closed at once and one line names the limit.
- `stop()` only sets a flag and writes one byte to a pipe, so it is safe from a signal handler
  and from any thread. `serve()` then stops accepting, shuts every connection, removes the socket
  file (if it is still ours) and waits for the connection threads to end.
- A connection counts against `max_conns` from accept until both its sockets are closed.
"""

import contextlib
import errno
import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable

from adapters.proxy.bucket import TokenBucket
from adapters.proxy.connection import Connection
from adapters.proxy.options import Address, Limits
from adapters.proxy.pump import Mover, default_mover
from adapters.proxy.socket_file import BoundSocket, remove_socket_file

Log = Callable[[str], None]

CONNECT_TIMEOUT_S = 5.0
_JOIN_ON_STOP_S = 2.0
_ACCEPT_RETRY_S = 0.05
_TRANSIENT_ACCEPT = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, errno.ECONNABORTED, errno.EPROTO}


def log_to_stderr(line: str) -> None:
    # A closed or broken stderr must not take the accept loop down with it.
    with contextlib.suppress(OSError, ValueError):
        print(f"inferproxy: {line}", file=sys.stderr, flush=True)


class Proxy:
    def __init__(
        self,
        bound: BoundSocket,
        upstream: Address,
        limits: Limits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        log: Log = log_to_stderr,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        mover: Mover | None = None,
    ) -> None:
        self._bound = bound
        self._upstream = upstream
        self._limits = limits if limits is not None else Limits()
        self._bucket = TokenBucket(self._limits.burst, self._limits.rate, clock)
        self._log = log
        self._connect_timeout = connect_timeout
        self._mover = mover if mover is not None else default_mover()
        self._open: set[Connection] = set()
        self._finished: list[threading.Thread] = []
        self._changed = threading.Condition()
        self._stopping = False
        self._serial = 0
        self._wake_read = self._wake_write = -1  # the wake-up pipe exists while serve() runs

    @property
    def start_line(self) -> str:
        return f"listening on {self._bound.path}, forwarding to {self._upstream}; {self._limits}"

    @property
    def open_connections(self) -> int:
        with self._changed:
            return len(self._open)

    def stop(self) -> None:
        """Ask `serve` to wind down. Signal-safe: takes no lock."""
        self._stopping = True
        wake = self._wake_write
        if wake >= 0:
            # A full pipe means a wake-up is already pending.
            with contextlib.suppress(OSError):
                os.write(wake, b"\0")

    def wait_open_at_most(self, count: int, timeout: float) -> bool:
        """Wait until at most `count` connections are open; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._open) <= count, timeout)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no connection is open and their threads have ended; False on timeout."""
        if not self.wait_open_at_most(0, timeout):
            return False
        self._reap()
        return True

    def serve(self) -> None:
        """Accept and forward until `stop()`; always leaves the socket file removed."""
        listener = self._bound.sock
        listener.setblocking(False)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        selector = selectors.DefaultSelector()
        try:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while not self._stopping:
                for key, _events in selector.select():
                    if key.fileobj is listener and not self._stopping:
                        self._accept_all(listener)
                self._reap()
        finally:
            selector.close()
            listener.close()
            with self._changed:
                current = list(self._open)
            for connection in current:
                connection.abort()
            remove_socket_file(self._bound)
            self.wait_idle(_JOIN_ON_STOP_S)
            wake_read, wake_write = self._wake_read, self._wake_write
            self._wake_read = self._wake_write = -1
            os.close(wake_read)
            os.close(wake_write)

    def _accept_all(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _TRANSIENT_ACCEPT:
                    continue
                # Out of descriptors or similar: say so, and let the backlog wait a moment.
                self._log(f"accept failed: {exc.strerror}")
                time.sleep(_ACCEPT_RETRY_S)
                return
            self._admit(client)

    def _admit(self, client: socket.socket) -> None:
        # Each refusal is logged before the close, so whoever sees the close can see the line.
        if not self._bucket.take():
            self._log(
                f"refused a connection: accept rate limit (burst {self._limits.burst}, refill {self._limits.rate:g}/s)"
            )
            client.close()
            return
        with self._changed:
            full = len(self._open) >= self._limits.max_conns
            if not full:
                self._serial += 1
                client.setblocking(True)
                connection = Connection(
                    client,
                    self._upstream,
                    name=f"inferproxy-{self._serial}",
                    connect_timeout=self._connect_timeout,
                    mover=self._mover,
                    on_connect_failed=self._connect_failed,
                    on_finished=self._finish,
                )
                self._open.add(connection)
        if full:
            self._log(f"refused a connection: {self._limits.max_conns} connections already open")
            client.close()
            return
        try:
            connection.start()
        except RuntimeError as exc:  # cannot start a thread
            with self._changed:
                self._open.discard(connection)
                self._changed.notify_all()
            self._log(f"refused a connection: {exc}")
            client.close()

    def _connect_failed(self, address: Address, exc: OSError) -> None:
        reason = exc.strerror or str(exc) or type(exc).__name__
        self._log(f"closed a connection: upstream {address} unreachable ({reason})")

    def _finish(self, connection: Connection) -> None:
        with self._changed:
            self._open.discard(connection)
            self._finished.append(connection.thread)
            self._changed.notify_all()

    def _reap(self) -> None:
        # A finished thread has nothing left to run but its return, so joining it is immediate.
        with self._changed:
            threads, self._finished = self._finished, []
        for thread in threads:
            thread.join()
