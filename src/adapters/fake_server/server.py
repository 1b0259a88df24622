"""A scripted HTTP/1.1 server on a Unix socket in a temporary folder, for tests.

    with FakeServer({("POST", "/v1/chat/completions"): sse_reply(chunks)}) as server:
        transport = UdsTransport(server.socket_path, header_bytes=16384)
        ...
        assert server.requests[0].json()["stream"] is True

Invariants:
- Ready on entry: the socket is bound and listening before `__enter__` returns (a client that
  connects before the accept thread runs waits in the backlog).
- Always shuts down and joins: `__exit__` wakes every thread (a pipe they all select on), shuts
  down live connections so a blocked write returns, joins every thread and removes the folder.
  A thread that fails to join is an error, not a leak.
- One request per connection; the reply is chosen by (method, path without query) when the whole
  request has arrived, and written as `adapters.fake_server.wire` schedules it (the in-memory
  stream replays the same schedule on a fake clock). Every request is recorded with its exact
  body bytes and arrival time.
- Waits between pieces watch the client: a client that closes is noticed at once
  (`RecordedRequest.client_closed`), and the rest of the script is dropped.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType

import h11

from adapters.fake_server.script import (
    End,
    RecordedRequest,
    RouteItem,
    Routes,
    RouteSpec,
    Script,
    error_reply,
)
from adapters.fake_server.wire import RequestReader, on_wire

_RECV = 65536
_LINGER_S = 30.0  # after a clean end, how long to wait for the client to close its side


class _ClientGone(Exception):
    """The client closed its end, or the server is stopping: stop serving this connection."""


class FakeServer:
    def __init__(
        self,
        routes: Mapping[tuple[str, str], RouteSpec] | None = None,
        *,
        socket_path: str | None = None,
        default: RouteItem | None = None,
    ) -> None:
        self.routes = Routes(routes)
        if default is not None:
            self.routes.set_default(default)
        self.requests: list[RecordedRequest] = []
        self.errors: list[BaseException] = []
        self.accepted = 0  # connections accepted so far, with a request or without
        self._wanted_path = socket_path
        self._socket_path: str | None = None
        self._folder: str | None = None
        self._listener: socket.socket | None = None
        self._wake_r = -1
        self._wake_w = -1
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._live: set[socket.socket] = set()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def socket_path(self) -> str:
        if self._socket_path is None:
            raise RuntimeError("FakeServer is not running (use it as a context manager)")
        return self._socket_path

    def route(self, method: str, path: str, *replies: RouteItem) -> None:
        self.routes.set(method, path, *replies)

    def __enter__(self) -> FakeServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if exc_type is None and self.errors:
            raise RuntimeError(
                f"fake server failed while serving: {self.errors[0]!r}"
            ) from self.errors[0]

    def start(self) -> None:
        if self._listener is not None:
            raise RuntimeError("FakeServer already started")
        try:
            if self._wanted_path is None:
                self._folder = tempfile.mkdtemp(prefix="fake-llama-")
                path = os.path.join(self._folder, "llama.sock")
            else:
                path = self._wanted_path
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # a stale socket from an earlier run
            self._wake_r, self._wake_w = os.pipe()
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener = listener
            listener.bind(path)
            listener.listen(64)
            self._socket_path = path
            self._spawn(self._accept_loop, name="fake-server-accept")
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        with self._lock:
            live = list(self._live)
        for conn in live:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        stuck: list[str] = []
        while True:
            with self._lock:
                threads = [t for t in self._threads if t.is_alive()]
            if not threads:
                break
            for thread in threads:
                thread.join(max(deadline - time.monotonic(), 0.0))
                if thread.is_alive():
                    stuck.append(thread.name)
            if stuck:
                break
        if self._listener is not None:
            self._listener.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._socket_path)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        if stuck:
            raise RuntimeError(f"fake server threads did not stop within {timeout} s: {stuck}")

    def _spawn(self, target: Callable[..., None], *args: object, name: str) -> None:
        thread = threading.Thread(target=self._guard, args=(target, *args), name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]  # a long-lived server
            self._threads.append(thread)
        thread.start()

    def _guard(self, target: Callable[..., None], *args: object) -> None:
        try:
            target(*args)
        except _ClientGone:
            pass
        except BaseException as exc:
            self.errors.append(exc)

    @property
    def live(self) -> int:
        """Connections open now (a client's, until the server has closed its end)."""
        with self._lock:
            return len(self._live)

    # -- accepting ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        count = 0
        while not self._stopping.is_set():
            ready, _, _ = select.select([listener.fileno(), self._wake_r], [], [])
            if self._wake_r in ready or self._stopping.is_set():
                return
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            count += 1
            with self._lock:
                self.accepted = count
                self._live.add(conn)
            self._spawn(self._serve, conn, name=f"fake-server-conn-{count}")

    # -- one connection -------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        request: RecordedRequest | None = None
        try:
            request = self._read_request(conn)
            if request is None:
                return
            with self._lock:
                self.requests.append(request)
            script = self.routes.reply_for(request)
            self._play(conn, request, script)
        except (_ClientGone, OSError):
            # A client that goes away (EOF, reset, broken pipe) ends the script; that is a
            # scenario the tests create on purpose, not a server failure.
            if request is not None and not self._stopping.is_set():
                request.mark_closed(time.monotonic())
        except Exception as exc:
            # A script that fails (a handler raising): recorded before the connection closes,
            # so the test that sees the close also sees the failure at exit.
            self.errors.append(exc)
        finally:
            with self._lock:
                self._live.discard(conn)
            conn.close()

    def _read_request(self, conn: socket.socket) -> RecordedRequest | None:
        reader = RequestReader()
        while True:
            self._wait_readable(conn)
            data = conn.recv(_RECV)
            if not data:
                return None
            try:
                request = reader.feed(data, time.monotonic())
            except h11.RemoteProtocolError as exc:
                self._send(conn, None, error_reply(400, f"bad request: {exc}").wire_head())
                return None
            if request is not None:
                return request

    def _play(self, conn: socket.socket, request: RecordedRequest, script: Script) -> None:
        wire = on_wire(script)
        for after_s, data in wire.writes:
            self._pause(conn, request, after_s)
            self._send(conn, request, data)
        self._pause(conn, request, wire.end_after_s)
        if wire.end is End.SILENCE:
            self._pause(conn, request, None)
        elif wire.end is End.RESET:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        else:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            self._pause(conn, request, _LINGER_S)  # see the client close its side

    # -- waiting and writing --------------------------------------------------------------------

    def _send(self, conn: socket.socket, request: RecordedRequest | None, data: bytes) -> None:
        if not data:
            return
        try:
            conn.sendall(data)
        except OSError as exc:
            if request is not None and not self._stopping.is_set():
                request.mark_closed(time.monotonic())
            raise _ClientGone from exc

    def _wait_readable(self, conn: socket.socket) -> None:
        ready, _, _ = select.select([conn.fileno(), self._wake_r], [], [])
        if self._wake_r in ready:
            raise _ClientGone

    def _pause(self, conn: socket.socket, request: RecordedRequest, seconds: float | None) -> None:
        """Wait `seconds` (None or inf: until the client closes), watching for its close."""
        if seconds is not None and seconds <= 0:
            return
        forever = seconds is None or seconds == float("inf")
        deadline = 0.0 if forever else time.monotonic() + (seconds or 0.0)
        while True:
            remaining = None if forever else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            fd = conn.fileno()
            ready, _, _ = select.select([fd, self._wake_r], [], [], remaining)
            if self._wake_r in ready:
                raise _ClientGone
            if fd in ready:
                try:
                    data = conn.recv(_RECV)
                except OSError:
                    data = b""
                if not data:
                    if not self._stopping.is_set():
                        request.mark_closed(time.monotonic())
                    raise _ClientGone
                # Bytes after the request are ignored: the client sent Connection: close.
