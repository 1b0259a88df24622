"""One forwarded connection: a client on the Unix socket and its own TCP connection upstream.

Two threads per connection, both started before a client arrives (a spare, made by the accept
loop ahead of time: it counts against no limit until `take` hands it a client, and an `abort`
before that ends it). The first connects upstream once it has its client, then moves client →
upstream; the second moves upstream → client once the first has connected. Invariants:
- No upstream connection exists before a client is taken (llama-server gives an idle connection
  a thread that polls it every 10 ms, and drops it after 5 s). For an upstream given as an
  address (no name to resolve), the spare makes its socket ahead, and `wake` starts the
  non-blocking connect in the accepting thread, so the handshake runs while the first thread
  wakes; a name is resolved by the first thread for every connection.
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
from collections.abc import Callable, Sequence

from adapters.proxy.options import Address
from adapters.proxy.pump import Mover, ahead

SocketAddress = tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]
AddressInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, SocketAddress]


def _nothing() -> None:
    return None


_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL
_LONGEST_POLL_MS = 2**31 - 1  # poll takes a C int of milliseconds


class Connection:
    def __init__(
        self,
        upstream: Address,
        *,
        name: str,
        connect_timeout: float,
        first_byte_timeout: float,
        mover: Mover,
        on_closed: Callable[[str], None],
        on_finished: Callable[["Connection"], None],
        addresses: Sequence[AddressInfo] | None = None,
    ) -> None:
        """`addresses`: what `upstream` resolves to when that cannot change (a numeric host)."""
        self._address = upstream
        self._addresses = addresses
        self._made: socket.socket | None = None  # the spare's socket for addresses[0], unconnected
        self._begun: tuple[socket.socket, int] | None = None  # that socket, its connect started
        self._connect_timeout = connect_timeout
        self._first_byte_by = 0.0
        self._first_byte_timeout = first_byte_timeout
        self._mover = mover
        self._on_closed = on_closed
        self._on_finished = on_finished
        self._client: socket.socket | None = None
        self._upstream: socket.socket | None = None
        self._linked: socket.socket | None = None  # the upstream, connected, for the second thread
        self._lock = threading.Lock()
        self._taken = threading.Event()  # a client was handed over, or the connection aborted
        self._connected = threading.Event()  # the upstream connected, or the connection is ending
        self._aborted = False
        self._closed = False
        # Each direction's mover, with what it needs made ahead by the first thread (`_prepare`).
        self._up = self._down = mover
        self._release_up = self._release_down = _nothing
        self.thread = threading.Thread(target=self._run, name=f"{name}-spare", daemon=True)
        self._back = threading.Thread(target=self._run_back, name=f"{name}-spare-back", daemon=True)
        self._name = name

    def start(self) -> None:
        """Start both threads, which wait for `take`; `RuntimeError` (and nothing left running)
        if a thread cannot be started."""
        self.thread.start()
        try:
            self._back.start()
        except RuntimeError:
            self.abort()
            self.thread.join()
            raise

    def take(self, client: socket.socket, first_byte_by: float) -> bool:
        """Hand the connection its client, whose first byte is due by `first_byte_by` (a
        `time.monotonic()` reading); False if it was aborted first (the client is not taken).
        The threads start at `wake`."""
        with self._lock:
            if self._aborted:
                return False
            self._client = client
            self._first_byte_by = first_byte_by
        self.thread.name = self._name
        self._back.name = f"{self._name}-back"
        return True

    def wake(self) -> None:
        """Let the threads of a taken connection run, and start the upstream connect when the
        spare made its socket ahead; never blocks. The accepting thread calls it just before it
        blocks itself, so the GIL is free for them; the first thread wakes while the handshake
        runs, and takes the connect over under the lock it is started under."""
        with self._lock:
            self._taken.set()
            made, self._made = self._made, None
            if made is not None and self._addresses and not self._aborted:
                self._upstream = made
                self._begun = (made, made.connect_ex(self._addresses[0][4]))
            elif made is not None:
                made.close()

    def abort(self) -> None:
        """Shut both sockets down both ways (a spare without a client ends); safe from any
        thread, any number of times."""
        with self._lock:
            self._aborted = True
            if not self._closed:
                for sock in (self._client, self._upstream):
                    if sock is not None:
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
        self._taken.set()
        self._connected.set()

    def _run(self) -> None:
        try:
            self._prepare()
            self._taken.wait()
            if not self._aborted:
                self._forward()
        finally:
            self._connected.set()  # a second thread still waiting for the upstream ends
            if self._back.ident is not None:
                self._back.join()
            self._release_up()
            self._release_down()
            self._close()
            self._on_finished(self)

    def _prepare(self) -> None:
        """Make the movers' pipes, and the socket for a fixed address, ahead (no socket is made
        once a client was taken)."""
        self._up, self._release_up = ahead(self._mover)
        self._down, self._release_down = ahead(self._mover)
        if not self._addresses:
            return
        family, kind, proto, _name, _sockaddr = self._addresses[0]
        try:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
        except OSError:
            return  # made at the connect instead, where its failure is reported
        with self._lock:
            if self._client is None and not self._aborted:
                self._made = sock
                return
        sock.close()

    def _run_back(self) -> None:
        self._connected.wait()
        with self._lock:
            upstream, client = self._linked, self._client
            if self._aborted or upstream is None or client is None:
                return
        self._pump(upstream, client, self._down)

    def _forward(self) -> None:
        client = self._client
        assert client is not None
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
        self._linked = upstream
        self._connected.set()
        try:
            if not self._first_byte_came(client):
                self._on_closed(f"the client sent no byte within {self._first_byte_timeout:g} s (first-byte limit)")
            elif self._pump(client, upstream, self._up):
                self._wait_for_client_hangup(client)
        finally:
            # Either both directions are done, the client hung up, or something failed: in every
            # case the other direction must stop now.
            self.abort()

    def _connect(self) -> socket.socket | None:
        """The upstream connection, as `socket.create_connection` makes it, or None once aborted.

        Each address the name resolves to gets `connect_timeout`; the last failure is raised.
        """
        infos = self._addresses
        if infos is None:
            infos = socket.getaddrinfo(self._address.host, self._address.port, type=socket.SOCK_STREAM)
        failure: OSError | None = None
        with self._lock:
            begun, self._begun = self._begun, None
        for family, kind, proto, _name, sockaddr in infos:
            if begun is not None:  # the first address's connect, started by `take`
                sock, started = begun
                begun = None
            else:
                sock = socket.socket(family, kind, proto)
                sock.setblocking(False)
                with self._lock:
                    if self._aborted:
                        sock.close()
                        return None
                    self._upstream = sock
                    # Started under the lock, so an abort either comes first (and is seen above)
                    # or finds the connect under way and shuts it down, which ends the poll below.
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

    def _pump(self, src: socket.socket, dst: socket.socket, mover: Mover) -> bool:
        """Move src → dst until EOF, then pass the half-close on. False (and abort) on failure."""
        try:
            mover(src, dst)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            self.abort()
            return False
        return True

    def _first_byte_came(self, client: socket.socket) -> bool:
        """Whether the client has sent something (a byte or EOF) or failed by its deadline.

        An abort shuts the client down, which ends the wait as an EOF would.
        """
        poller = select.poll()
        poller.register(client, select.POLLIN)
        while True:
            left_ms = max(0, math.ceil((self._first_byte_by - time.monotonic()) * 1000))
            if poller.poll(min(left_ms, _LONGEST_POLL_MS)):
                return True
            if left_ms <= _LONGEST_POLL_MS:
                return False

    def _wait_for_client_hangup(self, client: socket.socket) -> None:
        poller = select.poll()
        poller.register(client, select.POLLHUP)
        while True:
            for _fd, events in poller.poll():
                if events & _HANGUP:
                    return

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            if self._made is not None:
                self._made.close()
            if self._client is not None:
                self._client.close()
            if self._upstream is not None:
                self._upstream.close()
