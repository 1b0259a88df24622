"""One forwarded connection: a client on the Unix socket and its own TCP connection upstream.

Two threads per connection. The first connects upstream, starts the second for upstream → client,
then moves client → upstream itself. Invariants:
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
import select
import socket
import threading
from collections.abc import Callable

from adapters.proxy.options import Address
from adapters.proxy.pump import Mover

_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL


class Connection:
    def __init__(
        self,
        client: socket.socket,
        upstream: Address,
        *,
        name: str,
        connect_timeout: float,
        mover: Mover,
        on_connect_failed: Callable[[Address, OSError], None],
        on_finished: Callable[["Connection"], None],
    ) -> None:
        self._client = client
        self._address = upstream
        self._name = name
        self._connect_timeout = connect_timeout
        self._mover = mover
        self._on_connect_failed = on_connect_failed
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
            upstream = socket.create_connection((self._address.host, self._address.port), timeout=self._connect_timeout)
        except OSError as exc:
            self._on_connect_failed(self._address, exc)
            return
        with self._lock:
            self._upstream = upstream
            aborted = self._aborted
        if aborted:
            return
        try:
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            return
        back = threading.Thread(
            target=self._pump, args=(upstream, self._client), name=f"{self._name}-back", daemon=True
        )
        back.start()
        try:
            if self._pump(self._client, upstream):
                self._wait_for_client_hangup()
        finally:
            # Either both directions are done, the client hung up, or something failed: in every
            # case the other direction must stop now.
            self.abort()
            back.join()

    def _pump(self, src: socket.socket, dst: socket.socket) -> bool:
        """Move src → dst until EOF, then pass the half-close on. False (and abort) on failure."""
        try:
            self._mover(src, dst)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            self.abort()
            return False
        return True

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
