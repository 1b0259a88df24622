"""The listening socket file: what is removed, what is refused and left alone, its mode, and the
lock beside it that keeps two proxies from racing for one path."""

import os
import re
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.proxy.socket_file import (
    BoundSocket,
    SocketFileError,
    bind_socket_file,
    lock_socket_path,
    remove_socket_file,
)


@contextmanager
def bound(path: Path) -> Iterator[BoundSocket]:
    result = bind_socket_file(str(path))
    try:
        yield result
    finally:
        result.sock.close()
        remove_socket_file(result)


def make_stale_socket(path: Path) -> None:
    """A socket file that nobody listens on any more, as a killed process leaves behind."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_binds_a_listening_socket_file_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with bound(path) as result:
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert mode_of(path) == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
        assert (result.dev, result.ino) == (os.lstat(path).st_dev, os.lstat(path).st_ino)


def test_the_mode_is_0600_from_bind_even_under_a_permissive_umask(tmp_path: Path) -> None:
    # No chmod follows the bind, so 0600 here can only come from binding under a tight umask.
    previous = os.umask(0)
    try:
        with bound(tmp_path / "infer.sock"):
            assert mode_of(tmp_path / "infer.sock") == 0o600
            assert os.umask(0) == 0  # the caller's umask is back
    finally:
        os.umask(previous)


def test_a_stale_socket_is_removed_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    make_stale_socket(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client, pytest.raises(ConnectionRefusedError):
        client.connect(str(path))
    with bound(path):
        assert mode_of(path) == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # now someone listens


def test_a_socket_a_live_process_listens_on_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen()
        before = os.lstat(path)
        with pytest.raises(SocketFileError, match=r"a process has a socket bound at .*; refusing to start"):
            bind_socket_file(str(path))
        after = os.lstat(path)
        assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # the live listener still answers


def test_a_regular_file_at_the_path_survives_untouched(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    path.write_bytes(b"precious data")
    os.chmod(path, 0o644)
    before = os.lstat(path)
    with pytest.raises(SocketFileError, match="is a regular file, not a socket; refusing to start"):
        bind_socket_file(str(path))
    after = os.lstat(path)
    assert path.read_bytes() == b"precious data"
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (before.st_ino, before.st_mode, before.st_mtime_ns)


def test_a_folder_at_the_path_survives_untouched(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    path.mkdir()
    (path / "inside").write_text("x")
    with pytest.raises(SocketFileError, match="is a folder, not a socket"):
        bind_socket_file(str(path))
    assert (path / "inside").read_text() == "x"


@pytest.mark.parametrize("target", ["stale socket", "regular file", "nothing"])
def test_a_symlink_at_the_path_survives_untouched_whatever_it_points_to(tmp_path: Path, target: str) -> None:
    path = tmp_path / "infer.sock"
    pointee = tmp_path / "pointee"
    if target == "stale socket":
        make_stale_socket(pointee)
    elif target == "regular file":
        pointee.write_text("x")
    path.symlink_to(pointee)
    with pytest.raises(SocketFileError, match="is a symlink, not a socket"):
        bind_socket_file(str(path))
    assert path.is_symlink() and os.readlink(path) == str(pointee)
    assert pointee.exists() == (target != "nothing")


def test_a_named_pipe_at_the_path_survives_untouched(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    os.mkfifo(path)
    with pytest.raises(SocketFileError, match="is a named pipe, not a socket"):
        bind_socket_file(str(path))
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def test_removing_takes_away_our_socket_file(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    result = bind_socket_file(str(path))
    result.sock.close()
    assert remove_socket_file(result)
    assert not os.path.lexists(path)
    assert not remove_socket_file(result)  # already gone: nothing to do


def test_removing_leaves_a_file_that_replaced_ours(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    result = bind_socket_file(str(path))
    result.sock.close()
    os.unlink(path)
    path.write_text("someone else's")
    assert not remove_socket_file(result)
    assert path.read_text() == "someone else's"


def test_a_path_under_a_regular_file_is_reported_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    # The socket's folder is the first thing opened, so it is the one named.
    with pytest.raises(
        SocketFileError, match=r"^cannot open the folder .*/file of .*/file/infer\.sock: Not a directory$"
    ):
        bind_socket_file(str(tmp_path / "file" / "infer.sock"))


# -- the lock beside the socket, and sockets that are not ours to remove -----------------------------

NOBODY = 65534


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")


def test_a_second_bind_on_a_locked_path_fails_naming_the_lock_and_the_first_keeps_its_socket(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with bound(path) as first:
        with pytest.raises(SocketFileError, match=rf"^another inferproxy holds {re.escape(str(path))}\.lock; refusing"):
            bind_socket_file(str(path))
        st = os.lstat(path)
        assert (st.st_dev, st.st_ino) == (first.dev, first.ino)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))


def test_the_lock_is_taken_before_the_socket_path_is_looked_at(tmp_path: Path) -> None:
    # A stale socket would be removed by anyone who got past the lock: the holder of the lock is
    # mid-start, so its path is not to be touched.
    path = tmp_path / "infer.sock"
    make_stale_socket(path)
    before = os.lstat(path)
    lock = lock_socket_path(str(path))
    try:
        with pytest.raises(SocketFileError, match="another inferproxy holds"):
            bind_socket_file(str(path))
    finally:
        lock.release()
    assert os.lstat(path).st_ino == before.st_ino
    with bound(path):
        pass  # released: the next start takes the path


def test_a_socket_bound_but_not_yet_listening_is_left_alone(tmp_path: Path) -> None:
    # Its owner is between bind and listen; a stream connect would be refused as if it were stale.
    path = tmp_path / "infer.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as owner:
        owner.bind(str(path))
        before = os.lstat(path)
        with pytest.raises(SocketFileError, match=r"a process has a socket bound at .*; refusing to start"):
            bind_socket_file(str(path))
        assert os.lstat(path).st_ino == before.st_ino
        owner.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # still the owner's socket


def test_a_bound_datagram_socket_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as owner:
        owner.bind(str(path))
        with pytest.raises(SocketFileError, match="a process has a socket bound at"):
            bind_socket_file(str(path))
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_a_stale_socket_of_another_user_is_left_alone(tmp_path: Path) -> None:
    needs_root()
    path = tmp_path / "infer.sock"
    make_stale_socket(path)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(
        SocketFileError, match=rf"is a socket of uid {NOBODY}, not ours \(uid {os.geteuid()}\); refusing to start"
    ):
        bind_socket_file(str(path))
    assert os.lstat(path).st_uid == NOBODY


def test_a_lock_file_of_another_user_stops_the_start(tmp_path: Path) -> None:
    needs_root()
    path = tmp_path / "infer.sock"
    lock = tmp_path / "infer.sock.lock"
    lock.write_bytes(b"")
    os.chown(lock, NOBODY, NOBODY)
    with pytest.raises(SocketFileError, match=rf"infer\.sock\.lock belongs to uid {NOBODY}"):
        bind_socket_file(str(path))
    assert not os.path.lexists(path)


def test_a_symlink_at_the_lock_path_stops_the_start_and_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    target = tmp_path / "elsewhere"
    (tmp_path / "infer.sock.lock").symlink_to(target)
    with pytest.raises(SocketFileError, match=r"infer\.sock\.lock is a symlink; refusing to start"):
        bind_socket_file(str(path))
    assert not os.path.lexists(target)  # nothing was created through the link
    assert not os.path.lexists(path)


def test_a_folder_at_the_lock_path_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    (tmp_path / "infer.sock.lock").mkdir()
    with pytest.raises(SocketFileError, match=r"^cannot open the lock file .*infer\.sock\.lock: Is a directory$"):
        bind_socket_file(str(path))


def test_the_lock_file_is_made_0600_even_under_a_permissive_umask_and_stays_after_removal(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    lock = tmp_path / "infer.sock.lock"
    previous = os.umask(0)
    try:
        result = bind_socket_file(str(path))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o600
    result.sock.close()
    assert remove_socket_file(result)
    assert not result.lock.held
    assert stat.S_ISREG(os.lstat(lock).st_mode)
    with bound(path):
        pass  # the lock was released with the socket file


def test_a_lock_file_left_with_a_loose_mode_is_tightened_to_0600(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    lock = tmp_path / "infer.sock.lock"
    lock.write_bytes(b"")
    os.chmod(lock, 0o644)
    with bound(path):
        assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o600


def test_a_failed_start_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    path.write_bytes(b"not a socket")
    with pytest.raises(SocketFileError, match="is a regular file"):
        bind_socket_file(str(path))
    lock_socket_path(str(path)).release()  # nobody holds it any more
