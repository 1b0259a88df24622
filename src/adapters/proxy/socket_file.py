"""The listening socket file: made safely, removed only if it is still ours.

Invariants:
- Only a socket file that nobody listens on is ever removed before binding. A live socket, or a
  path that is not a socket (a regular file, a folder, a symlink to anything), stops the start and
  is left untouched.
- The file is created with mode 0600: `bind` runs under umask 0o177, so there is no moment in
  which another user could connect. The mode is then checked, not fixed up afterwards.
- On the way out, the path is unlinked only if it is still a socket with the inode we bound.
"""

import errno
import os
import socket
import stat
from dataclasses import dataclass

_BIND_UMASK = 0o177
_PROBE_TIMEOUT_S = 1.0


class SocketFileError(Exception):
    """The socket file cannot be set up; the message says why in one line."""


@dataclass(frozen=True)
class BoundSocket:
    sock: socket.socket
    path: str
    dev: int
    ino: int


def bind_socket_file(path: str, backlog: int = socket.SOMAXCONN) -> BoundSocket:
    """Clear a stale socket at `path`, bind a listening Unix socket there with mode 0600."""
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(_BIND_UMASK)
        try:
            sock.bind(path)
        finally:
            os.umask(old_umask)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SocketFileError(f"{path} appeared while starting; left untouched") from exc
        raise SocketFileError(f"cannot bind {path}: {exc.strerror}") from exc
    try:
        st = os.lstat(path)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISSOCK(st.st_mode) or mode != 0o600:
            raise SocketFileError(f"{path} came out with mode {mode:04o}, not 0600; refusing to listen")
        sock.listen(backlog)
    except BaseException as exc:
        sock.close()
        _unlink_quietly(path)
        if isinstance(exc, OSError):
            raise SocketFileError(f"cannot listen on {path}: {exc.strerror}") from exc
        raise
    return BoundSocket(sock=sock, path=path, dev=st.st_dev, ino=st.st_ino)


def remove_socket_file(bound: BoundSocket) -> bool:
    """Unlink the socket file if the path still names the inode we bound; return whether it did."""
    try:
        st = os.lstat(bound.path)
    except FileNotFoundError:
        return False
    # The inode number alone is not enough: a file made after ours was unlinked may reuse it.
    if not stat.S_ISSOCK(st.st_mode) or (st.st_dev, st.st_ino) != (bound.dev, bound.ino):
        return False
    return _unlink_quietly(bound.path)


def _clear_stale(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketFileError(f"cannot inspect {path}: {exc.strerror}") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketFileError(
            f"{path} exists and is {_describe(st.st_mode)}, not a socket; refusing to start (left untouched)"
        )
    if _is_live(path):
        raise SocketFileError(f"a process is listening on {path}; refusing to start")
    try:
        again = os.lstat(path)
    except FileNotFoundError:
        return
    # Narrow the window in which the path could have been replaced since the first look.
    if (again.st_dev, again.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISSOCK(again.st_mode):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SocketFileError(f"cannot remove the stale socket {path}: {exc.strerror}") from exc
    else:
        raise SocketFileError(f"{path} changed while starting; left untouched")


def _is_live(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(_PROBE_TIMEOUT_S)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return False
    except FileNotFoundError:
        return False
    except OSError as exc:
        # A full backlog or a permission problem: cannot tell, so do not touch it.
        reason = exc.strerror or type(exc).__name__
        raise SocketFileError(f"cannot tell whether {path} is in use ({reason}); refusing to start") from exc
    finally:
        probe.close()
    return True


def _describe(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    return "a special file"


def _unlink_quietly(path: str) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
