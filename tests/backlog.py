"""A Unix socket whose accept backlog is full: the one wait a connect to a Unix socket can have.
Imported by name (`tests/` is on the path), also by the child processes some tests start."""

from __future__ import annotations

import socket


def full_backlog(path: str) -> tuple[socket.socket, list[socket.socket]]:
    """A socket listening at `path` that accepts nothing, and the idle clients that fill its
    backlog (the caller closes them all)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    fillers: list[socket.socket] = []
    while True:
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(path)
        except BlockingIOError:
            filler.close()
            return listener, fillers
        fillers.append(filler)
