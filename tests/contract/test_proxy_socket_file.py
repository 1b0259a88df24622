"""The listening socket file: what is removed, what is refused and left alone, and its mode."""

import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.proxy.socket_file import BoundSocket, SocketFileError, bind_socket_file, remove_socket_file


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
        with pytest.raises(SocketFileError, match=r"a process is listening on .*refusing to start"):
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
    with pytest.raises(SocketFileError, match=r"^cannot inspect .*: Not a directory$"):
        bind_socket_file(str(tmp_path / "file" / "infer.sock"))
