"""The socket path and the lock beside it: a path that names a folder is refused before anything is
made, a folder that is a symlink is not followed, a lock file that is also another file is not
taken, and everything after the start happens in the folder opened at the start."""

import os
import re
import socket
import stat
from pathlib import Path

import pytest

from adapters.proxy.socket_file import SocketFileError, bind_socket_file, lock_socket_path, remove_socket_file


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize(("ending", "said"), [("/", "a slash"), ("/.", "'.'"), ("/..", "'..'")])
def test_a_path_whose_last_part_names_a_folder_is_refused_before_anything_is_made(
    tmp_path: Path, ending: str, said: str
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    path = f"{folder}{ending}"
    for attempt in (bind_socket_file, lock_socket_path):
        with pytest.raises(SocketFileError, match=rf"^{re.escape(path)} ends in {said}, not a socket file's name"):
            attempt(path)
    assert listing(folder) == [] and listing(tmp_path) == ["run"]


def test_a_path_through_a_symlink_to_a_folder_is_refused_and_nothing_is_made_in_the_folder(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    for path in (f"{tmp_path / 'link'}/", str(tmp_path / "link" / "infer.sock")):
        with pytest.raises(SocketFileError, match="refusing to start"):
            bind_socket_file(path)
    assert listing(real) == []


def test_a_folder_that_is_a_symlink_is_named_with_the_folder_it_points_to(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    path = tmp_path / "link" / "infer.sock"
    with pytest.raises(SocketFileError) as caught:
        bind_socket_file(str(path))
    assert str(caught.value) == (
        f"the folder {tmp_path / 'link'} of {path} is a symlink; name the folder itself ({real}); refusing to start"
    )


def test_a_lock_file_with_a_second_hard_link_is_refused_and_the_other_file_keeps_its_mode(tmp_path: Path) -> None:
    other = tmp_path / "other-file"
    other.write_bytes(b"someone's data")
    os.chmod(other, 0o644)
    lock = tmp_path / "infer.sock.lock"
    os.link(other, lock)
    with pytest.raises(
        SocketFileError, match=rf"^{re.escape(str(lock))} has 2 hard links, so it is another file too; refusing"
    ):
        bind_socket_file(str(tmp_path / "infer.sock"))
    assert stat.S_IMODE(os.lstat(other).st_mode) == 0o644  # not tightened through the link
    assert other.read_bytes() == b"someone's data"
    assert not os.path.lexists(tmp_path / "infer.sock")


def test_the_socket_file_is_removed_in_the_folder_it_was_made_in_even_after_that_folder_moved(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "infer.sock"
    bound = bind_socket_file(str(path))
    bound.sock.close()
    folder.rename(tmp_path / "moved")
    folder.mkdir()  # a new folder at the old path, holding a socket file of the same name
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(path))
        assert remove_socket_file(bound)
        assert listing(tmp_path / "moved") == ["infer.sock.lock"]  # ours is gone, the lock stays
        assert stat.S_ISSOCK(os.lstat(path).st_mode)  # the newcomer is untouched
    assert not bound.lock.held
