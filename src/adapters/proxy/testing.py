"""Test support for the proxy: a scripted TCP upstream on loopback, an in-process proxy, a clock.

Shipped beside the adapter so that tests (and later tiers) can play the upstream without opening
TCP themselves. Everything here is a context manager that joins every thread it started and
closes every descriptor it opened before it returns.
"""

import contextlib
import errno
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Self

from adapters.proxy.options import Address, ProxyLimits
from adapters.proxy.pump import Mover
from adapters.proxy.server import Proxy
from adapters.proxy.socket_file import bind_socket_file

Handler = Callable[[socket.socket], None]
LOOPBACK = "127.0.0.1"
_JOIN_S = 5.0
_SYN_SENT = "02"  # the state's number in /proc/net/tcp


class ManualClock:
    """Seconds that move only when told to; refuses to go backwards."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self.now += seconds


def echo(conn: socket.socket) -> None:
    """Send back everything received; pass the half-close on."""
    buf = bytearray(256 * 1024)
    while n := conn.recv_into(buf):
        conn.sendall(memoryview(buf)[:n])
    conn.shutdown(socket.SHUT_WR)


def reset(conn: socket.socket) -> None:
    """Close with SO_LINGER 0, so the peer gets a TCP reset instead of a FIN."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class LoopbackUpstream:
    """A TCP server on 127.0.0.1 whose every connection runs `handler` on its own thread.

    A handler that raises records the exception in `failures` (tests assert it stays empty). On
    exit, the listener is closed, live connections are shut down and every thread is joined.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._listener: socket.socket | None = None
        self._wake_read = self._wake_write = -1
        self._acceptor: threading.Thread | None = None
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.accepted = 0
        self.failures: list[BaseException] = []

    @property
    def address(self) -> Address:
        if self._listener is None:
            raise RuntimeError("the upstream is not running")
        host, port = self._listener.getsockname()[:2]
        return Address(host, port)

    @property
    def live(self) -> int:
        """Connections whose handler is still running."""
        with self._lock:
            return len(self._live)

    def __enter__(self) -> Self:
        self._listener = socket.create_server((LOOPBACK, 0), backlog=128)
        self._wake_read, self._wake_write = os.pipe()
        self._acceptor = threading.Thread(target=self._accept_loop, name="upstream-accept")
        self._acceptor.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        os.write(self._wake_write, b"\0")
        if self._acceptor is not None:
            self._acceptor.join(_JOIN_S)
        with self._lock:
            for conn in self._live:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self.join_handlers(_JOIN_S)
        if self._listener is not None:
            self._listener.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def join_handlers(self, timeout: float) -> None:
        """Join every handler thread started so far; raise if one is still running."""
        with self._lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout)
        stuck = [thread.name for thread in threads if thread.is_alive()]
        if stuck:
            raise RuntimeError(f"upstream handlers still running: {stuck}")

    def _accept_loop(self) -> None:
        assert self._listener is not None
        self._listener.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while True:
                for key, _events in selector.select():
                    if key.fileobj is not self._listener:
                        return
                    self._accept_ready()

    def _accept_ready(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            conn.setblocking(True)
            thread = threading.Thread(target=self._serve, args=(conn,), name="upstream-conn")
            with self._lock:
                self.accepted += 1
                self._live.add(conn)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handler(conn)
        except BaseException as exc:
            self.failures.append(exc)
        finally:
            with self._lock:
                self._live.discard(conn)
                conn.close()


@contextlib.contextmanager
def black_hole() -> Iterator[Address]:
    """An address on loopback where a TCP connect hangs until its timeout.

    A listener with backlog 0 that never accepts, its one queue place taken: the kernel drops
    further SYNs, so the connect neither succeeds nor is refused.
    """
    listener = socket.create_server((LOOPBACK, 0), backlog=0)
    holders: list[socket.socket] = []
    try:
        host, port = listener.getsockname()[:2]
        for _ in range(4):
            holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holders.append(holder)
            holder.setblocking(False)
            err = holder.connect_ex((host, port))
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, os.strerror(err))
        yield Address(host, port)
    finally:
        for holder in holders:
            holder.close()
        listener.close()


def pending_connects(address: Address) -> set[int]:
    """Local ports of this network namespace's TCP sockets still connecting to `address` (IPv4).

    Read from /proc/net/tcp: the sockets in SYN_SENT whose remote end is `address`. A test can
    tell from it that a connect towards a `black_hole` is under way, whoever made it.
    """
    remote = f"{socket.inet_aton(address.host)[::-1].hex().upper()}:{address.port:04X}"
    ports: set[int] = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for row in table:
            fields = row.split()
            if fields[2] == remote and fields[3] == _SYN_SENT:
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def knock(path: str) -> bool:
    """One client into the backlog of the Unix socket at `path` without waiting, closed at once.

    False when the backlog is full; FileNotFoundError or ConnectionRefusedError once nothing is
    there to knock on. The proxy still accepts the client (and sees it gone).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.setblocking(False)
        try:
            client.connect(path)
        except BlockingIOError:
            return False
    return True


def fill_pipe(link: str) -> int:
    """Fill the pipe that `link` names (a /proc/PID/fd/N path) to the last byte; return how many.

    Written through a non-blocking description of our own, so the pipe's other holders keep
    their own (blocking) descriptions unchanged: this is a stderr that nobody has read for a while.
    """
    fd = os.open(link, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    written = 0
    try:
        for size in (4096, 1):  # then byte by byte, so not even a short line fits
            with contextlib.suppress(BlockingIOError):
                while True:
                    written += os.write(fd, b"." * size)
    finally:
        os.close(fd)
    return written


def unused_port() -> Address:
    """An address on loopback where nothing listens (connects are refused)."""
    with socket.create_server((LOOPBACK, 0)) as probe:
        host, port = probe.getsockname()[:2]
    return Address(host, port)


@dataclass
class RunningProxy:
    proxy: Proxy
    path: str
    lines: list[str] = field(default_factory=list)

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        return sock


@contextlib.contextmanager
def running_proxy(
    path: str,
    upstream: Address,
    limits: ProxyLimits | None = None,
    *,
    clock: Callable[[], float] | None = None,
    connect_timeout: float = 2.0,
    mover: Mover | None = None,
    ready_every: float | None = None,
) -> Iterator[RunningProxy]:
    """The proxy serving on its own thread, as `main` would run it, with its log lines collected.

    Its spares connect upstream ahead only when `ready_every` is given (as `main` does, every
    `READY_EVERY_S`): without, every upstream connection a test sees is a client's own."""
    lines: list[str] = []
    bound = bind_socket_file(path)
    proxy = Proxy(
        bound,
        upstream,
        limits,
        clock=time.monotonic if clock is None else clock,
        log=lines.append,
        connect_timeout=connect_timeout,
        mover=mover,
        ready_every=ready_every,
    )
    serving = threading.Thread(target=proxy.serve, name="inferproxy-serve")
    serving.start()
    try:
        yield RunningProxy(proxy, path, lines)
    finally:
        proxy.stop()
        serving.join(_JOIN_S)
        if serving.is_alive():
            raise RuntimeError("the proxy did not stop")


def eventually(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Whether `condition` holds within `timeout` seconds (looked at every millisecond)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def round_trip(client: socket.socket, message: bytes) -> bytes:
    """Send `message` and read back as many bytes (fewer if the connection ends first)."""
    client.settimeout(2)
    client.sendall(message)
    got = b""
    while len(got) < len(message) and (chunk := client.recv(len(message) - len(got))):
        got += chunk
    return got


def closed(client: socket.socket) -> bool:
    """Whether the proxy has closed this client: EOF, or a reset for the request it never read."""
    client.settimeout(2)
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True
