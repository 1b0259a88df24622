"""One forwarded connection: a client on the Unix socket and its own TCP connection upstream.

Two threads per connection, both started before a client arrives (a spare, made by the accept
loop ahead of time, which counts it against `max_conns` from then on: `take` hands it a client,
or an `abort` ends it). The first moves client → upstream; the second keeps the spare's upstream
connection ready, then moves upstream → client. Invariants:
- A spare's second thread connects upstream ahead (`_keep_ready`): one attempt each
  `READY_EVERY_S`, each connection kept until the next attempt or until the upstream drops it
  (llama-server drops a connection that has sent nothing after 5 s; one that has not connected
  waits for the next attempt). A client takes the connection that is ready, if the upstream has
  not closed it (a poll: an idle HTTP server sends nothing unasked); else the first thread
  connects for it, so each client still has one upstream connection of its own.
- `forward_first` runs in the accepting thread, right after `take`: what the client has sent by
  then goes up the ready connection at once (a non-blocking read and write of at most
  `FIRST_READ` bytes, never looked at), so a request that is already in is on its way before the
  threads wake; `wake` looks once more if it found nothing. What could not be written is sent
  by the first thread before anything else. When everything the client had sent was moved,
  neither thread is woken (`wake`): the first waits in an epoll for the client to send more or
  close, the second in its poll of the ready connection for the upstream's answer, so only the
  upstream runs between request and answer.
- Every connect is non-blocking with a poll that an abort ends (the socket is published, under
  the lock `abort` takes, before its connect starts), so a stop is never held up by an upstream
  that does not answer.
- A client that has sent nothing (no byte, no EOF) `first_byte_timeout` seconds after it was
  accepted is closed, with one line, so silent clients cannot hold every place for ever; that
  holds while its upstream connection is still being made, too. That is the only timer: once
  the first byte (or an EOF) has come, nothing is timed.
- EOF from one side becomes `shutdown(SHUT_WR)` towards the other; no timer ever cuts the other
  direction short, so a client that half-closes after its request gets an answer of any length.
- When either side fails, both sockets are shut down, which wakes whichever thread is blocked.
- A client that goes away entirely (not just half-closes) while upstream is silent is noticed:
  after its EOF the first thread waits for the Unix socket to hang up (POLLHUP is raised only when
  both directions are shut), then shuts the upstream connection too.
- Sockets are closed only by their owner: the ready connection by the second thread until a
  client takes it, everything else by the first thread after the second has ended, always under
  the lock that `abort` takes, so no thread ever touches a closed or reused descriptor.
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


class _SilentClient(Exception):
    """The client sent nothing by its first-byte limit while its upstream connection was made."""


def _readable(sock: socket.socket) -> bool:
    """Whether `sock` has something to read (a byte or EOF) or failed, now."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _with_options(sock: socket.socket) -> bool:
    """A connected upstream socket made blocking, Nagle off; False (and closed) if that fails."""
    try:
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        sock.close()
        return False
    return True


_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL
_LONGEST_POLL_MS = 2**31 - 1  # poll takes a C int of milliseconds
READY_EVERY_S = 4.0  # below llama-server's 5 s for a connection that has sent nothing
FIRST_READ = 64 * 1024  # what `forward_first` moves at most; the first thread moves the rest


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
        ready_every: float | None = READY_EVERY_S,
    ) -> None:
        """`addresses`: what `upstream` resolves to when that cannot change (a numeric host).
        `ready_every`: the period of the spare's connections ahead; None makes none."""
        self._address = upstream
        self._addresses = addresses
        self._ready_every = ready_every
        self._ready: socket.socket | None = None  # the spare's upstream connection, made ahead
        self._ready_check: select.poll | None = None  # a poll of `_ready` alone, made with it
        self._connecting: socket.socket | None = None  # the attempt ahead under way
        self._ahead = threading.Event()  # no attempt ahead is under way
        if ready_every is None:
            self._ahead.set()
        self._pending = b""  # the client's first bytes that `forward_first` could not write
        self._moved = False  # `forward_first` moved bytes: the first byte came
        # `forward_first`'s buffer, made by `start` for a spare.
        self._first: bytearray | None = None
        self._wake_read = self._wake_write = -1  # ends the second thread's wait as a spare
        # The first thread's wait, while its client says nothing.
        self._watch: select.epoll | None = None
        # Taken with its request moved: each thread wakes when it has bytes to move.
        self._lazy = False
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
        self.prepared = threading.Event()  # its first thread made what it makes ahead (or ended)
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
        if self._ready_every is not None:
            self._first = bytearray(FIRST_READ)
            with contextlib.suppress(OSError):  # without it, nothing is connected ahead
                self._wake_read, self._wake_write = os.pipe()
            if self._wake_read >= 0 and hasattr(select, "epoll"):
                try:
                    self._watch = select.epoll()
                    self._watch.register(self._wake_read, select.EPOLLIN)
                except OSError:
                    self._watch = None
        try:
            self.thread.start()
        except RuntimeError:
            self._close()
            raise
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
        return True

    def client_gone(self) -> bool:
        """Whether its client has closed its end (a hang-up, not a half-close), so the
        connection is over but for its threads noticing; safe from any thread."""
        with self._lock:
            client = self._client
            if client is None or self._closed:
                return False
            poller = select.poll()
            poller.register(client, select.POLLIN)  # a hang-up is always reported
            return any(events & select.POLLHUP for _fd, events in poller.poll(0))

    def forward_first(self) -> None:
        """After `take`, in the accepting thread: what the client has sent so far goes up the
        connection made ahead, if there is one the upstream has kept. Never blocks."""
        client, buf = self._client, self._first
        upstream = self._take_ready()
        if client is None or upstream is None or buf is None:
            return
        if not self._move_first(client, upstream, buf):  # the upstream dropped it after all:
            with self._lock:  # the first thread connects anew, and sends what is pending
                self._upstream = None
                upstream.close()
            return
        self._linked = upstream
        self._connected.set()

    def _move_first(self, client: socket.socket, upstream: socket.socket, buf: bytearray) -> bool:
        """What the client has sent so far, up `upstream`, without blocking; what could not be
        written is pending. False if the write failed (all of it pending)."""
        try:
            got = client.recv_into(buf, FIRST_READ, socket.MSG_DONTWAIT)
        except OSError:  # nothing yet (the first thread waits for it), or a failure it will see
            return True
        if got:
            try:
                sent = upstream.send(memoryview(buf)[:got], socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._pending, self._moved = bytes(buf[:got]), True
                return False
            self._pending, self._moved = bytes(buf[sent:got]), True
        return True

    def wake(self) -> None:
        """Let the threads of a taken connection run; never blocks. The accepting thread calls
        it just before it blocks itself, so the GIL is free for them. A request that came since
        `forward_first` found nothing goes up here, the same way. A connection whose request
        was moved whole, so far, wakes neither thread: the first wakes when the client sends
        more (or closes), the second when the upstream answers, so nothing but the upstream
        runs between the request and its answer."""
        self.thread.name = (
            self._name
        )  # named as a client's now that its first bytes are on their way
        self._back.name = f"{self._name}-back"
        client, watch, upstream, buf = self._client, self._watch, self._linked, self._first
        if not self._moved and client is not None and upstream is not None and buf is not None:
            # A second look: a request that came since `forward_first` goes up now, and no
            # thread wakes for it. (A failed write leaves it pending on the dropped connection,
            # as the first thread would have found it.)
            self._move_first(client, upstream, buf)
        if (
            watch is not None
            and client is not None
            and self._moved
            and not self._pending
            and self._linked is not None
        ):
            self._lazy = True
            try:
                watch.register(client, select.EPOLLIN | select.EPOLLRDHUP)
                return
            except OSError:
                self._lazy = False
        self._taken.set()
        self._poke()

    def abort(self) -> None:
        """Shut both sockets down both ways (a spare without a client ends); safe from any
        thread, any number of times."""
        with self._lock:
            self._aborted = True
            if not self._closed:
                for sock in (self._client, self._upstream, self._connecting):
                    if sock is not None:
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
        self._poke()
        self._taken.set()
        self._connected.set()
        self._ahead.set()

    def _poke(self) -> None:
        """End the second thread's wait as a spare (under the lock `_close` closes the pipe
        under, so this write never lands on a reused descriptor)."""
        with self._lock:
            if self._wake_write >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._wake_write, b"\0")

    def _run(self) -> None:
        try:
            try:
                self._prepare()
            finally:
                self.prepared.set()
            self._wait_taken()
            if not self._aborted:
                self._forward()
        finally:
            self._connected.set()  # a second thread still waiting for the upstream ends
            self._poke()
            if self._back.ident is not None:
                self._back.join()
            self._release_up()
            self._release_down()
            self._close()
            self._on_finished(self)

    def _wait_taken(self) -> None:
        """Until `wake` (or an abort); for a lazy take, until the client has more to say."""
        watch = self._watch
        if watch is None:
            self._taken.wait()
            return
        while not (self._taken.is_set() or self._aborted):
            if watch.poll() and self._lazy:
                return  # the client sent more, or closed: the first thread's to move

    def _prepare(self) -> None:
        """Make the movers' pipes ahead."""
        self._up, self._release_up = ahead(self._mover)
        self._down, self._release_down = ahead(self._mover)

    def _run_back(self) -> None:
        self._keep_ready()
        if not self._connected.is_set():  # (set, for a lazy take: `Event.wait` is several calls)
            self._connected.wait()
        with self._lock:
            upstream, client = self._linked, self._client
            if self._aborted or upstream is None or client is None:
                return
        self._pump(upstream, client, self._down)

    def _keep_ready(self) -> None:
        """While the connection is a spare: an upstream connection made ahead, one attempt each
        `ready_every` seconds, each kept until the next (or until the upstream drops it). A client
        taken while an attempt is under way waits for it (`_ahead`)."""
        every = self._ready_every
        if every is None or self._wake_read < 0:
            self._ahead.set()
            return
        try:
            while True:
                began = time.monotonic()
                ready = self._connect_ahead()
                with self._lock:
                    taken = self._client is not None or self._aborted
                    if ready is not None and not self._aborted:
                        self._ready, self._ready_check = ready, select.poll()
                        self._ready_check.register(ready, select.POLLIN)
                    elif ready is not None:
                        ready.close()
                        ready = None
                self._ahead.set()
                if taken or not self._wait_ready(ready, began + every):
                    return
                with self._lock:
                    if self._client is not None or self._aborted:
                        return
                    self._ahead.clear()  # the next attempt is under way
                    if self._ready is not None:
                        self._ready.close()
                    self._ready = self._ready_check = None
        finally:
            if not self._ahead.is_set():
                self._ahead.set()

    def _wait_ready(self, ready: socket.socket | None, until: float) -> bool:
        """Hold `ready` until `until`, or until the upstream drops it (then hold nothing): True;
        False once taken or aborted (a taken connection belongs to the client now)."""
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        if ready is not None:
            poller.register(ready, select.POLLIN)
        while (left := until - time.monotonic()) > 0:
            events = poller.poll(math.ceil(left * 1000))
            for fd, _ in events:
                if fd == self._wake_read:
                    return False
            if events and ready is not None:
                with self._lock:
                    if self._client is not None:
                        # Taken (lazily), and the upstream answers: the second thread's to move.
                        return False
                    dropped = self._ready is ready  # none until the next attempt
                    if dropped:
                        self._ready = self._ready_check = None
                poller.unregister(ready)
                if dropped:
                    ready.close()  # unpublished above: this thread's alone
                ready = None
        return True

    def _connect_ahead(self) -> socket.socket | None:
        """A connection upstream for the next client, or None (a failure, or an abort, whose
        shutdown of the connecting socket ends the wait)."""
        try:
            ready = self._connect()
        except OSError:
            return None
        if ready is not None and not _with_options(ready):
            return None
        return ready

    def _take_ready(self) -> socket.socket | None:
        """The connection made ahead, now the client's upstream, if the upstream has kept it."""
        with self._lock:
            ready, self._ready = self._ready, None
            check, self._ready_check = self._ready_check, None
            if ready is None or check is None or self._aborted:
                return None
            if check.poll(0):  # an idle HTTP server sends nothing unasked: closed, or not ours
                ready.close()
                return None
            self._upstream = ready
            return ready

    def _forward(self) -> None:
        client = self._client
        assert client is not None
        upstream = self._linked or self._take_ready()  # connected ahead, with its options set
        first_by = (
            time.monotonic() + self._connect_timeout
        )  # the client waits no longer for its first try
        silent = (
            None if self._moved or self._pending else client
        )  # watched for its first byte meanwhile
        if upstream is None and not self._ahead.is_set():
            # One is on its way: sooner than a new one.
            if not self._wait_ahead(silent, first_by):
                return
            upstream = self._take_ready()
        if upstream is None:
            upstream = self._connect_for_client(first_by, silent)
            if upstream is None:
                return
        self._linked = upstream
        self._connected.set()
        try:
            if self._pending:
                self._send_pending(upstream)
            if not self._moved and not self._first_byte_came(client):
                self._on_closed(self._silent_line())
            elif self._pump(client, upstream, self._up):
                self._wait_for_client_hangup(client)
        finally:
            # Either both directions are done, the client hung up, or something failed: in every
            # case the other direction must stop now.
            self.abort()

    def _wait_ahead(self, silent: socket.socket | None, until: float) -> bool:
        """Wait, until `until`, for the connection a spare is making ahead; False (with its line)
        if the client `silent` so far sends nothing by its first-byte limit meanwhile."""
        if silent is not None and self._first_byte_by < until and not self._ahead_or_spoke(silent):
            self._on_closed(self._silent_line())
            self.abort()  # the client sees its close now, and the attempt ahead ends
            return False
        self._ahead.wait(max(0.0, until - time.monotonic()))
        return True

    def _ahead_or_spoke(self, silent: socket.socket) -> bool:
        """By the first-byte limit: whether the connection ahead came, or the client spoke."""
        return self._ahead.wait(max(0.0, self._first_byte_by - time.monotonic())) or _readable(
            silent
        )

    def _silent_line(self) -> str:
        return f"the client sent no byte within {self._first_byte_timeout:g} s (first-byte limit)"

    def _connect_for_client(
        self, first_by: float, silent: socket.socket | None
    ) -> socket.socket | None:
        """A connection made now (none was ready), or None (unreachable, or the client `silent`
        so far stayed so past its first-byte limit, with its line; aborted); the first address
        tried gets until `first_by`, what a wait for the attempt ahead left."""
        try:
            upstream = self._connect(first_by, silent)
        except _SilentClient:
            self._on_closed(self._silent_line())
            return None
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            self._on_closed(f"upstream {self._address} unreachable ({reason})")
            return None
        if upstream is None:
            return None
        with self._lock:
            if self._aborted:
                upstream.close()
                return None
            self._upstream = upstream  # shut by an abort, closed by `_close`
        return upstream if _with_options(upstream) else None

    def _send_pending(self, upstream: socket.socket) -> None:
        pending, self._pending = self._pending, b""
        try:
            upstream.sendall(pending)
        except OSError:
            self.abort()

    def _connect(
        self, first_by: float | None = None, silent: socket.socket | None = None
    ) -> socket.socket | None:
        """A connection upstream, as `socket.create_connection` makes it (still non-blocking),
        now the caller's; None once aborted. Each address the name resolves to gets
        `connect_timeout` (the first, until `first_by` when given); the last failure is raised.
        The attempt under way is `_connecting`, which an abort shuts down, ending its wait."""
        infos = self._addresses
        if infos is None:
            try:
                infos = socket.getaddrinfo(
                    self._address.host, self._address.port, type=socket.SOCK_STREAM
                )
            except UnicodeError as exc:  # a name the lookup cannot encode: it cannot be reached
                raise OSError(f"{self._address.host!r} is not a host name ({exc})") from exc
        failure: OSError | None = None
        for family, kind, proto, _name, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            with self._lock:
                if self._aborted:
                    sock.close()
                    return None
                self._connecting = sock
                # Started under the lock, so an abort either comes first (and is seen above)
                # or finds the connect under way and shuts it down, which ends the poll below.
                started = sock.connect_ex(sockaddr)
            by, first_by = first_by, None
            try:
                if started not in (0, errno.EINPROGRESS):
                    raise OSError(started, os.strerror(started))
                if started:
                    silent = self._wait_connected(sock, by, silent)
            except OSError as exc:
                failure = exc
            except _SilentClient:
                with self._lock:
                    self._connecting = None
                    sock.close()
                raise
            with self._lock:
                self._connecting = None
                if failure is None and not self._aborted:
                    return sock
                sock.close()
                if self._aborted:
                    return None
        raise failure if failure is not None else OSError(f"no address for {self._address.host}")

    def _wait_connected(
        self, sock: socket.socket, by: float | None, silent: socket.socket | None
    ) -> socket.socket | None:
        """Wait for `sock`'s connect (until `by`, else `connect_timeout`); meanwhile,
        `_SilentClient` if the client `silent` so far sends nothing by its first-byte limit.
        Returns it while it is silent still (None once it has sent), for the next address's wait."""
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        end = time.monotonic() + self._connect_timeout if by is None else by
        if silent is not None:
            poller.register(silent, select.POLLIN)
        while True:
            silent_by = self._first_byte_by if silent is not None else end
            wait = min(end, silent_by) - time.monotonic()
            ready = {fd for fd, _ in poller.poll(math.ceil(wait * 1000))} if wait > 0 else set()
            if sock.fileno() in ready:
                break
            if silent is not None and silent.fileno() in ready:
                # It spoke: only the connect is waited for.
                poller.unregister(silent)
                silent = None
            elif silent is not None and time.monotonic() >= silent_by:
                raise _SilentClient
            elif time.monotonic() >= end:
                raise TimeoutError("timed out")
        if self._aborted:
            return silent
        failed = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if failed:
            raise OSError(failed, os.strerror(failed))
        return silent

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
            if self._ready is not None:
                self._ready.close()
                self._ready = None
            if self._client is not None:
                self._client.close()
            if self._upstream is not None:
                self._upstream.close()
            if self._watch is not None:
                self._watch.close()
            for fd in (self._wake_read, self._wake_write):
                if fd >= 0:
                    os.close(fd)
            self._wake_read = self._wake_write = -1
