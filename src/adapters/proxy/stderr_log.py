"""Log lines on stderr without ever blocking the caller.

A stderr pipe that nobody reads fills after some 64 KiB; a blocking write would then stop the
accept loop (nothing is served) and the shutdown (a stop signal does nothing). Invariants:
- `__call__` never blocks. It writes what the descriptor takes now and keeps the rest in a
  bounded queue (64 KiB). A line that does not fit is dropped whole and counted.
- Lines leave in the order they came, each whole: a partial write keeps its tail at the head of
  the queue, and no queued line is ever dropped.
- Once the queue has drained after drops, one line says how many were dropped.
- Non-blocking applies to our writes only. The descriptor's file status flags are shared with
  whoever else holds it (a shell's terminal, a supervisor's pipe), so they are never left
  changed: a pipe or terminal is reopened through /proc/self/fd as a description of our own that
  is non-blocking; a socket is written with MSG_DONTWAIT; anything else (a regular file, or a
  reopen that failed) gets O_NONBLOCK only for the length of each write.
- Thread-safe: one lock, held only around non-blocking system calls.
- A broken stderr (a closed descriptor, a reader gone) is given up on quietly: logging must not
  take the proxy down.
- No I/O at construction; the descriptor is looked at on the first line.

The owner of a select loop (the proxy's accept loop) watches `fileno()` for writing while
`pending` and calls `drain()` when it may write; a caller on another thread that leaves lines
pending wakes that loop itself.
"""

import collections
import contextlib
import fcntl
import os
import select
import socket
import stat
import threading
import time
from typing import Protocol, runtime_checkable

QUEUE_BYTES = 64 * 1024
PREFIX = "inferproxy: "


@runtime_checkable
class DrainableLog(Protocol):
    """A log whose unwritten lines a select loop can drain."""

    def __call__(self, line: str) -> None: ...

    @property
    def pending(self) -> bool: ...

    def fileno(self) -> int: ...

    def drain(self) -> None: ...


class _Writer(Protocol):
    fd: int

    def write(self, data: bytes) -> int:
        """Write some of `data` without blocking; BlockingIOError if none can go now."""
        ...

    def close(self) -> None: ...


class _OwnDescription:
    """A pipe or terminal reopened as a non-blocking description of our own."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> int:
        return os.write(self.fd, data)

    def close(self) -> None:
        os.close(self.fd)


class _SocketWriter:
    """A socket written with MSG_DONTWAIT, so its shared flags are never touched."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=os.dup(fd))
        self.fd = self._sock.fileno()

    def write(self, data: bytes) -> int:
        return self._sock.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)

    def close(self) -> None:
        self._sock.close()


class _NonBlockingPerWrite:
    """The shared descriptor itself, made non-blocking only while each write lasts."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> int:
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        if flags & os.O_NONBLOCK:
            return os.write(self.fd, data)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            return os.write(self.fd, data)
        finally:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags)

    def close(self) -> None:
        pass  # not ours to close


def _open_writer(fd: int) -> _Writer:
    mode = os.fstat(fd).st_mode
    if stat.S_ISSOCK(mode):
        return _SocketWriter(fd)
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            return _OwnDescription(os.open(f"/proc/self/fd/{fd}", flags))
        except OSError:
            pass  # no /proc, or a FIFO without a reader: fall back to flags around each write
    return _NonBlockingPerWrite(fd)


class StderrLog:
    """`log(line)` writes "inferproxy: line" to a descriptor (stderr by default), never blocking."""

    def __init__(self, fd: int = 2, *, capacity: int = QUEUE_BYTES, prefix: str = PREFIX) -> None:
        self._fd = fd
        self._capacity = capacity
        self._prefix = prefix
        self._lock = threading.Lock()
        self._writer: _Writer | None = None
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._dropped = 0
        self._broken = False

    def __call__(self, line: str) -> None:
        data = f"{self._prefix}{line}\n".encode("utf-8", "backslashreplace")
        with self._lock:
            if self._broken:
                return
            if self._queued + len(data) > self._capacity:
                self._dropped += 1
                return
            self._queue.append(data)
            self._queued += len(data)
            self._write_what_fits()

    @property
    def pending(self) -> bool:
        """Whether lines wait for the descriptor to take them."""
        with self._lock:
            return bool(self._queue)

    @property
    def dropped(self) -> int:
        """Lines dropped since the last report of drops."""
        with self._lock:
            return self._dropped

    def fileno(self) -> int:
        """The descriptor to watch for writing; -1 once stderr is given up on."""
        with self._lock:
            writer = self._ensure_writer()
            return -1 if writer is None else writer.fd

    def drain(self) -> None:
        """Write whatever the descriptor takes now."""
        with self._lock:
            self._write_what_fits()

    def finish(self, timeout: float) -> bool:
        """Drain for at most `timeout` seconds (0: once, without waiting); True if all went out."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            if not self.pending:
                return True
            left = deadline - time.monotonic()
            fd = self.fileno()
            if left <= 0 or fd < 0:
                return False
            with contextlib.suppress(OSError, ValueError):
                select.select([], [fd], [], left)

    def close(self) -> None:
        """Close what this log opened; later lines are dropped."""
        with self._lock:
            self._give_up()

    def _ensure_writer(self) -> _Writer | None:
        if self._writer is None and not self._broken:
            try:
                self._writer = _open_writer(self._fd)
            except OSError:
                self._give_up()
        return self._writer

    def _write_what_fits(self) -> None:
        writer = self._ensure_writer()
        if writer is None:
            return
        while self._queue:
            head = self._queue[0]
            try:
                written = writer.write(head)
            except BlockingIOError:
                return
            except OSError:
                self._give_up()
                return
            if written <= 0:
                return  # took nothing without saying why: try again when the loop says writable
            self._queued -= written
            if written < len(head):
                self._queue[0] = head[written:]
                continue
            self._queue.popleft()
            if not self._queue and self._dropped:
                report = f"{self._prefix}dropped {self._dropped} log lines while stderr was full\n"
                self._dropped = 0
                self._queue.append(report.encode())
                self._queued += len(self._queue[0])

    def _give_up(self) -> None:
        self._broken = True
        self._queue.clear()
        self._queued = 0
        self._dropped = 0
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()
            self._writer = None
