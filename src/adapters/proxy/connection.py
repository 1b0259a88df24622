"""One forwarded connection: a client on the Unix socket and its own TCP connection upstream.

Two threads per connection. The first connects upstream, starts the second for upstream → client,
then moves client → upstream itself. Invariants:
- The connect never blocks: the socket is non-blocking and published (under the lock `abort`
  takes) before its connect starts, and the wait for it is a poll that `abort`'s shutdown ends.
  So a stop is never held up by an upstream that does not answer the connect.
- A client that has sent nothing (no byte, no EOF) `first_byte_timeout` seconds after it was
  accepted is closed, with one line, so silent clients cannot hold every place for ever. That
  is the only timer: once the first byte (or an EOF) has come, nothing is timed.
- EOF from one side becomes `shutdown(SHUT_WR)` towards the other; no timer ever cuts the other
  direction short, so a client that half-closes after its request gets an answer of any length.
- When either side fails, both sockets are shut down, which wakes whichever thread is blocked.
- A client that goes away entirely (not just half-closes) while upstream is silent is noticed:
  after its EOF the first thread waits for the Unix socket to hang up (POLLHUP is raised only when
  both directions are shut), then shuts the upstream connection too.
- Sockets are closed only by the first thread, after the second has ended, and under the lock that
  `abort` takes, so no thread ever touches a closed or reused descriptor.
"""

import contextlib
import errno
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from adapters.proxy.options import Address
from adapters.proxy.pump import Mover

_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL
_LONGEST_POLL_MS = 2**31 - 1  # poll takes a C int of milliseconds


class Connection:
    def __init__(
        self,
        client: socket.socket,
        upstream: Address,
        *,
        name: str,
        connect_timeout: float,
        first_byte_by: float,
        first_byte_timeout: float,
        mover: Mover,
        on_closed: Callable[[str], None],
        on_finished: Callable[["Connection"], None],
    ) -> None:
        """`first_byte_by` is the `time.monotonic()` reading by which the client's first byte is due."""
        self._client = client
        self._address = upstream
        self._name = name
        self._connect_timeout = connect_timeout
        self._first_byte_by = first_byte_by
        self._first_byte_timeout = first_byte_timeout
        self._mover = mover
        self._on_closed = on_closed
        self._on_finished = on_finished
        self._upstream: socket.socket | None = None
        self._lock = threading.Lock()
        self._aborted = False
        self._closed = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def abort(self) -> None:
        """Shut both sockets down both ways; safe from any thread, any number of times."""
        with self._lock:
            self._aborted = True
            if self._closed:
                return
            for sock in (self._client, self._upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

    def _run(self) -> None:
        try:
            self._forward()
        finally:
            self._close()
            self._on_finished(self)

    def _forward(self) -> None:
        try:
            upstream = self._connect()
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            self._on_closed(f"upstream {self._address} unreachable ({reason})")
            return
        if upstream is None:
            return  # aborted while connecting
        try:
            upstream.setblocking(True)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            return
        back = threading.Thread(
            target=self._pump, args=(upstream, self._client), name=f"{self._name}-back", daemon=True
        )
        back.start()
        try:
            if not self._first_byte_came():
                self._on_closed(f"the client sent no byte within {self._first_byte_timeout:g} s (first-byte limit)")
            elif self._pump(self._client, upstream):
                self._wait_for_client_hangup()
        finally:
            # Either both directions are done, the client hung up, or something failed: in every
            # case the other direction must stop now.
            self.abort()
            back.join()

    def _connect(self) -> socket.socket | None:
        """The upstream connection, as `socket.create_connection` makes it, or None once aborted.

        Each address the name resolves to gets `connect_timeout`; the last failure is raised.
        """
        infos = socket.getaddrinfo(self._address.host, self._address.port, type=socket.SOCK_STREAM)
        failure: OSError | None = None
        for family, kind, proto, _name, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            with self._lock:
                if self._aborted:
                    sock.close()
                    return None
                self._upstream = sock
                # Started under the lock, so an abort either comes first (and is seen above) or
                # finds the connect under way and shuts it down, which ends the poll below.
                started = sock.connect_ex(sockaddr)
            try:
                if started not in (0, errno.EINPROGRESS):
                    raise OSError(started, os.strerror(started))
                if started:
                    self._wait_connected(sock)
                with self._lock:
                    if self._aborted:
                        return None
                return sock
            except OSError as exc:
                failure = exc
                with self._lock:
                    self._upstream = None
                    sock.close()
                if self._aborted:
                    return None
        raise failure if failure is not None else OSError(f"no address for {self._address.host}")

    def _wait_connected(self, sock: socket.socket) -> None:
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        if not poller.poll(math.ceil(self._connect_timeout * 1000)):
            raise TimeoutError("timed out")
        if self._aborted:
            return
        failed = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if failed:
            raise OSError(failed, os.strerror(failed))

    def _pump(self, src: socket.socket, dst: socket.socket) -> bool:
        """Move src → dst until EOF, then pass the half-close on. False (and abort) on failure."""
        try:
            self._mover(src, dst)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            self.abort()
            return False
        return True

    def _first_byte_came(self) -> bool:
        """Whether the client has sent something (a byte or EOF) or failed by its deadline.

        An abort shuts the client down, which ends the wait as an EOF would.
        """
        poller = select.poll()
        poller.register(self._client, select.POLLIN)
        while True:
            left_ms = max(0, math.ceil((self._first_byte_by - time.monotonic()) * 1000))
            if poller.poll(min(left_ms, _LONGEST_POLL_MS)):
                return True
            if left_ms <= _LONGEST_POLL_MS:
                return False

    def _wait_for_client_hangup(self) -> None:
        poller = select.poll()
        poller.register(self._client, select.POLLHUP)
        while True:
            for _fd, events in poller.poll():
                if events & _HANGUP:
                    return

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            self._client.close()
            if self._upstream is not None:
                self._upstream.close()
