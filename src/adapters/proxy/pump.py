"""Byte movers: copy everything from one connected socket to another until EOF.

A mover returns when `src` reports EOF and raises `OSError` when either socket fails. It never
looks at the bytes and holds no timer. Both movers work on blocking sockets and block with the GIL
released, so the two directions of a connection run in parallel.

- `copy_bytes` is the portable loop: `recv_into` a reused buffer, `sendall` what arrived.
- `splice_bytes` moves pages through a pipe with `os.splice` (Linux), so the bytes never enter
  Python. If the kernel refuses to splice these sockets before anything moved, it falls back to
  the copy loop.

`ahead(mover)` makes what a mover needs before it has bytes to move (splice's pipe, about 40 µs
that would otherwise come before a connection's first bytes): it returns the mover to call once,
and a release for one never called. Either way the pipe is closed exactly once.
"""

import errno
import fcntl
import os
import socket
from collections.abc import Callable

Mover = Callable[[socket.socket, socket.socket], None]

COPY_CHUNK = 256 * 1024
PIPE_SIZE = 1024 * 1024
_SPLICE_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


def copy_bytes(src: socket.socket, dst: socket.socket) -> None:
    buf = bytearray(COPY_CHUNK)
    view = memoryview(buf)
    recv_into = src.recv_into
    sendall = dst.sendall
    while True:
        n = recv_into(buf)
        if not n:
            return
        sendall(view[:n])


def splice_bytes(src: socket.socket, dst: socket.socket) -> None:
    _splice(src, dst, _pipe())


def _pipe() -> tuple[int, int, int]:
    """A pipe grown for splicing: (read end, write end, what one splice may move)."""
    read_end, write_end = os.pipe()
    try:
        return read_end, write_end, _grow_pipe(write_end)
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise


def ahead(mover: Mover) -> tuple[Mover, Callable[[], None]]:
    """`mover` with what it needs made now, to be called at most once; and the release of
    what was made, for a mover never called (idempotent, and a no-op once it was called)."""
    if mover is not splice_bytes:
        return mover, _nothing
    try:
        pipe: tuple[int, int, int] | None = _pipe()
    except OSError:
        return mover, _nothing  # made when the bytes come, where its failure is reported

    def spliced(src: socket.socket, dst: socket.socket) -> None:
        nonlocal pipe
        made, pipe = pipe, None
        _splice(src, dst, made if made is not None else _pipe())

    def release() -> None:
        nonlocal pipe
        made, pipe = pipe, None
        if made is not None:
            os.close(made[0])
            os.close(made[1])

    return spliced, release


def _nothing() -> None:
    return None


def _splice(src: socket.socket, dst: socket.socket, pipe: tuple[int, int, int]) -> None:
    read_end, write_end, chunk = pipe
    try:
        src_fd, dst_fd = src.fileno(), dst.fileno()
        moved_any = False
        while True:
            try:
                n = os.splice(src_fd, write_end, chunk, flags=os.SPLICE_F_MOVE)
            except OSError as exc:
                if not moved_any and exc.errno in _SPLICE_UNSUPPORTED:
                    copy_bytes(src, dst)
                    return
                raise
            if not n:
                return
            moved_any = True
            while n:
                try:
                    n -= os.splice(read_end, dst_fd, n, flags=os.SPLICE_F_MOVE)
                except OSError as exc:
                    if exc.errno not in _SPLICE_UNSUPPORTED:
                        raise
                    _drain(read_end, n, dst)
                    copy_bytes(src, dst)
                    return
    finally:
        os.close(read_end)
        os.close(write_end)


def _drain(read_end: int, n: int, dst: socket.socket) -> None:
    while n:
        piece = os.read(read_end, n)
        dst.sendall(piece)
        n -= len(piece)


def _grow_pipe(fd: int) -> int:
    """Ask for a bigger pipe so one splice moves more; keep what the kernel grants."""
    try:
        return int(fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE))
    except OSError:
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))


def default_mover() -> Mover:
    return splice_bytes if hasattr(os, "splice") else copy_bytes
