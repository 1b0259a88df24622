"""The listening socket file: made safely, removed only if it is still ours, never raced for.

Invariants:
- The path must end in a file name: one whose last part is empty (a trailing slash), `.` or `..`
  names a folder and is refused before anything is opened.
- The folder that holds the socket is opened once, with O_NOFOLLOW (a symlink there stops the
  start), and the lock file and the socket file are looked at, made and removed relative to that
  descriptor, never through the path again; only `bind` and the probe below take the path, after
  a check that it still leads to the folder that was opened.
- An exclusive advisory lock (`flock`) on PATH.lock is taken before the socket path is even
  looked at, and held for the proxy's whole life, so two proxies never race for one path: the
  second fails at once, naming the lock. The lock file is opened with O_NOFOLLOW (a symlink there
  stops the start), must be a regular file of our own with no other hard link (its mode is
  tightened, which must not reach another name's file), and is created with mode 0600 so no
  other user can open it to hold the lock against us.
- The lock file is left in place on the way out. Unlinking a lock file that others may have open
  lets a waiting proxy lock the unlinked inode while a third creates and locks a new file at the
  same path, and both believe they hold the path. An empty 0600 file is the price of that safety.
- Only a socket file that is ours (same uid) and that no socket is bound to is ever removed
  before binding. Whether a socket is bound is asked with a datagram connect: the kernel answers
  "refused" only when no socket at all is bound to the file, and "wrong type" for a stream
  socket that is bound, listening or not yet. So a socket that another process has bound but not
  yet put into listen is never taken over, and a live server is never connected to by the probe.
- A live socket, another user's socket, or a path that is not a socket (a regular file, a
  folder, a symlink to anything) stops the start and is left untouched.
- The file is created with mode 0600: `bind` runs under umask 0o177, so there is no moment in
  which another user could connect. The mode is then checked, not fixed up afterwards.
- On the way out, the socket file is unlinked (in the folder opened at the start) only if it is
  still a socket with the inode we bound, and only then is the lock released, so a successor
  never meets our socket file.
"""

import contextlib
import errno
import fcntl
import os
import socket
import stat
from dataclasses import dataclass

_BIND_UMASK = 0o177
_LOCK_SUFFIX = ".lock"
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_A_FILE_NAME = {"": "a slash", ".": "'.'", "..": "'..'"}


class SocketFileError(Exception):
    """The socket file cannot be set up; the message says why in one line."""


class PathLock:
    """The exclusive lock on PATH.lock, and the socket's folder it was taken in.

    `folder` is the descriptor of that folder and `name` the socket file's name in it, for every
    later look at the socket file. `release` closes both, once, whoever calls it how often.
    """

    def __init__(self, path: str, fd: int, *, folder: int, name: str) -> None:
        self.path = path
        self.folder = folder
        self.name = name
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # closing the last descriptor of the open file drops the flock
            os.close(self.folder)


def lock_path_for(path: str) -> str:
    return path + _LOCK_SUFFIX


def folder_ending(path: str) -> str | None:
    """What `path` ends in if its last part names a folder ("a slash", "'.'", "'..'"), else None."""
    return _NOT_A_FILE_NAME.get(os.path.basename(path))


def split_socket_path(path: str) -> tuple[str, str]:
    """The folder and the file name of a socket path; SocketFileError if it names no file."""
    ending = folder_ending(path)
    if ending is not None:
        raise SocketFileError(
            f"{path} ends in {ending}, not a socket file's name; refusing to start"
        )
    folder, name = os.path.split(path)
    return folder or os.curdir, name


def lock_socket_path(path: str) -> PathLock:
    """Take the lock that makes `path` ours to bind; SocketFileError if anyone else holds it."""
    folder_path, name = split_socket_path(path)
    folder = _open_folder(folder_path, path)
    try:
        fd = _lock_in(folder, name, lock_path_for(path))
    except BaseException:
        os.close(folder)
        raise
    return PathLock(lock_path_for(path), fd, folder=folder, name=name)


def _open_folder(folder: str, path: str) -> int:
    try:
        return os.open(folder, _FOLDER_FLAGS)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if exc.errno in (errno.ENOTDIR, errno.ELOOP) and stat.S_ISLNK(os.lstat(folder).st_mode):
                raise SocketFileError(
                    f"the folder {folder} of {path} is a symlink; name the folder itself"
                    f" ({os.path.realpath(folder)}); refusing to start"
                ) from exc
        raise SocketFileError(f"cannot open the folder {folder} of {path}: {exc.strerror}") from exc


def _lock_in(folder: int, name: str, lock_path: str) -> int:
    try:
        fd = os.open(name + _LOCK_SUFFIX, _LOCK_FLAGS, 0o600, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SocketFileError(
                f"{lock_path} is a symlink; refusing to start (left untouched)"
            ) from exc
        raise SocketFileError(f"cannot open the lock file {lock_path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SocketFileError(
                f"{lock_path} exists and is {_describe(st.st_mode)}, not a regular file;"
                " refusing to start"
            )
        if st.st_nlink != 1:
            raise SocketFileError(
                f"{lock_path} has {st.st_nlink} hard links, so it is another file too;"
                " refusing to start (left untouched)"
            )
        if st.st_uid != os.geteuid():
            raise SocketFileError(
                f"{lock_path} belongs to uid {st.st_uid}, not to us (uid {os.geteuid()});"
                " refusing to start"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SocketFileError(
                f"another inferproxy holds {lock_path}; refusing to start"
            ) from exc
        except OSError as exc:
            raise SocketFileError(f"cannot lock {lock_path}: {exc.strerror}") from exc
        if stat.S_IMODE(st.st_mode) & 0o077:
            # Ours and locked: close the door on other users holding it against a later start.
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class BoundSocket:
    sock: socket.socket
    path: str
    dev: int
    ino: int
    lock: PathLock


def bind_socket_file(path: str, backlog: int = socket.SOMAXCONN) -> BoundSocket:
    """Lock `path`, clear a stale socket there, bind a listening Unix socket with mode 0600."""
    lock = lock_socket_path(path)
    try:
        return _bind_locked(path, backlog, lock)
    except BaseException:
        lock.release()
        raise


def _bind_locked(path: str, backlog: int, lock: PathLock) -> BoundSocket:
    _check_folder(path, lock)
    _clear_stale(path, lock)
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
        st = _lstat(lock)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISSOCK(st.st_mode) or mode != 0o600:
            raise SocketFileError(
                f"{path} came out with mode {mode:04o}, not 0600; refusing to listen"
            )
        sock.listen(backlog)
    except BaseException as exc:
        sock.close()
        _unlink_quietly(lock)
        if isinstance(exc, OSError):
            raise SocketFileError(f"cannot listen on {path}: {exc.strerror}") from exc
        raise
    return BoundSocket(sock=sock, path=path, dev=st.st_dev, ino=st.st_ino, lock=lock)


def remove_socket_file(bound: BoundSocket) -> bool:
    """Unlink the socket file if the path still names the inode we bound, then release the lock.

    Returns whether it unlinked. Safe to call again: the lock is released once.
    """
    try:
        return _remove_if_ours(bound)
    finally:
        bound.lock.release()


def _remove_if_ours(bound: BoundSocket) -> bool:
    if not bound.lock.held:
        return False  # removed or left already, and the folder's descriptor is closed
    try:
        st = _lstat(bound.lock)
    except FileNotFoundError:
        return False
    # The inode number alone is not enough: a file made after ours was unlinked may reuse it.
    if not stat.S_ISSOCK(st.st_mode) or (st.st_dev, st.st_ino) != (bound.dev, bound.ino):
        return False
    return _unlink_quietly(bound.lock)


def _check_folder(path: str, lock: PathLock) -> None:
    """`bind` and the probe take the path: it must still lead to the folder the lock is in."""
    folder = split_socket_path(path)[0]
    try:
        now = os.stat(folder)
    except OSError as exc:
        raise SocketFileError(
            f"cannot inspect the folder {folder} of {path}: {exc.strerror}"
        ) from exc
    held = os.fstat(lock.folder)
    if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        raise SocketFileError(
            f"the folder {folder} of {path} changed while starting; refusing to start"
        )


def _lstat(lock: PathLock) -> os.stat_result:
    return os.stat(lock.name, dir_fd=lock.folder, follow_symlinks=False)


def _clear_stale(path: str, lock: PathLock) -> None:
    try:
        st = _lstat(lock)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketFileError(f"cannot inspect {path}: {exc.strerror}") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketFileError(
            f"{path} exists and is {_describe(st.st_mode)}, not a socket;"
            " refusing to start (left untouched)"
        )
    if st.st_uid != os.geteuid():
        raise SocketFileError(
            f"{path} is a socket of uid {st.st_uid}, not ours (uid {os.geteuid()});"
            " refusing to start (left untouched)"
        )
    if _is_bound(path):
        raise SocketFileError(
            f"a process has a socket bound at {path}; refusing to start (left untouched)"
        )
    try:
        again = _lstat(lock)
    except FileNotFoundError:
        return
    # Narrow the window in which the path could have been replaced since the first look.
    if (again.st_dev, again.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISSOCK(again.st_mode):
        try:
            os.unlink(lock.name, dir_fd=lock.folder)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SocketFileError(f"cannot remove the stale socket {path}: {exc.strerror}") from exc
    else:
        raise SocketFileError(f"{path} changed while starting; left untouched")


def _is_bound(path: str) -> bool:
    """Whether any socket is bound to the file at `path`, listening or not."""
    # A datagram probe never reaches a stream server's accept queue, and only "refused" means
    # that no socket is bound: a bound stream socket answers "wrong type" even before listen.
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        if exc.errno == errno.EPROTOTYPE:
            return True
        # A permission problem or similar: cannot tell, so do not touch it.
        reason = exc.strerror or type(exc).__name__
        raise SocketFileError(
            f"cannot tell whether {path} is in use ({reason}); refusing to start"
        ) from exc
    finally:
        probe.close()
    return True  # a datagram socket is bound there


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


def _unlink_quietly(lock: PathLock) -> bool:
    try:
        os.unlink(lock.name, dir_fd=lock.folder)
    except OSError:
        return False
    return True
