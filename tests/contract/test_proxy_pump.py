"""The byte movers on socket pairs: exact bytes, EOF, failures, and splice's fallback to copying."""

import errno
import os
import random
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from adapters.proxy.pump import Mover, ahead, copy_bytes, splice_bytes

MOVERS = [pytest.param(splice_bytes, id="splice"), pytest.param(copy_bytes, id="copy")]


@contextmanager
def moving(mover: Mover) -> Iterator[tuple[socket.socket, socket.socket, list[BaseException]]]:
    """writer -> [src | mover | dst] -> reader, with the mover on a thread joined on exit."""
    writer, src = socket.socketpair()
    dst, reader = socket.socketpair()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            mover(src, dst)
            dst.shutdown(socket.SHUT_WR)
        except BaseException as exc:
            failures.append(exc)
            dst.shutdown(socket.SHUT_RDWR)

    thread = threading.Thread(target=run, name="test-mover")
    thread.start()
    try:
        yield writer, reader, failures
    finally:
        writer.close()
        thread.join(5)
        for sock in (src, dst, reader):
            sock.close()
    assert not thread.is_alive()


def send_then_read(writer: socket.socket, reader: socket.socket, data: bytes) -> bytes:
    def send() -> None:
        writer.sendall(data)
        writer.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, name="test-writer")
    sender.start()
    try:
        reader.settimeout(5)
        chunks = []
        while chunk := reader.recv(1 << 20):
            chunks.append(chunk)
    finally:
        sender.join(5)
    return b"".join(chunks)


@pytest.mark.parametrize("mover", MOVERS)
def test_a_mover_delivers_every_byte_and_returns_at_eof(mover: Mover) -> None:
    data = random.Random(1).randbytes(3 * 1024 * 1024 + 7)
    with moving(mover) as (writer, reader, failures):
        assert send_then_read(writer, reader, data) == data
    assert failures == []


@pytest.mark.parametrize("mover", MOVERS)
def test_a_mover_raises_when_the_destination_is_gone(mover: Mover) -> None:
    with moving(mover) as (writer, reader, failures):
        reader.close()
        writer.sendall(b"x" * 1024)
        writer.shutdown(socket.SHUT_WR)
    assert len(failures) == 1 and isinstance(failures[0], OSError)


def refusing_splice(*_args: object, **_kwargs: object) -> int:
    raise OSError(errno.EINVAL, "Invalid argument")


def test_splice_copies_instead_when_the_kernel_refuses_to_splice_these_sockets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "splice", refusing_splice)
    data = random.Random(2).randbytes(300_000)
    with moving(splice_bytes) as (writer, reader, failures):
        assert send_then_read(writer, reader, data) == data
    assert failures == []


def test_splice_hands_on_what_is_already_in_the_pipe_when_only_the_way_out_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_splice = os.splice
    read_ends: list[int] = []

    def splice_in_only(src: int, dst: int, count: int, *args: object, **kwargs: int) -> int:
        if read_ends and src == read_ends[0]:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_splice(src, dst, count, **kwargs)

    real_pipe = os.pipe

    def recording_pipe() -> tuple[int, int]:
        r, w = real_pipe()
        read_ends.append(r)
        return r, w

    monkeypatch.setattr(os, "splice", splice_in_only)
    monkeypatch.setattr(os, "pipe", recording_pipe)
    data = random.Random(3).randbytes(500_000)
    with moving(splice_bytes) as (writer, reader, failures):
        assert send_then_read(writer, reader, data) == data
    assert failures == []


def test_splice_does_not_hide_a_real_failure_behind_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def resetting_splice(*_args: object, **_kwargs: object) -> int:
        raise OSError(errno.ECONNRESET, "Connection reset by peer")

    monkeypatch.setattr(os, "splice", resetting_splice)
    with moving(splice_bytes) as (writer, _reader, failures):
        writer.sendall(b"x")
    assert len(failures) == 1 and isinstance(failures[0], ConnectionResetError)


def pipes_open() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
        except OSError:
            continue
    return count


def test_a_splice_made_ahead_holds_its_pipe_until_it_moves_and_then_closes_it() -> None:
    before = pipes_open()
    spliced, release = ahead(splice_bytes)
    assert pipes_open() == before + 2  # the pipe is made now, not when the bytes come
    data = random.Random(4).randbytes(400_000)
    with moving(spliced) as (writer, reader, failures):
        assert send_then_read(writer, reader, data) == data
    assert failures == []
    release()  # after the move: nothing left to release
    assert pipes_open() == before


def test_a_splice_made_ahead_and_never_called_gives_its_pipe_back_once() -> None:
    before = pipes_open()
    _spliced, release = ahead(splice_bytes)
    release()
    release()
    assert pipes_open() == before


def test_a_mover_that_needs_nothing_ahead_is_handed_back_as_it_is() -> None:
    mover, release = ahead(copy_bytes)
    assert mover is copy_bytes
    release()
