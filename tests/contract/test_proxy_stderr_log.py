"""The proxy's stderr log against real pipes and sockets: it never blocks, drops and reports drops,
and never leaves the shared descriptor non-blocking.

Each test makes its own pipe or socket pair as "stderr" and closes every descriptor it opened.
"""

import fcntl
import os
import resource
import select
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from adapters.proxy.stderr_log import DrainableLog, StderrLog
from adapters.proxy.testing import fill_pipe


@contextmanager
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    try:
        yield read_end, write_end
    finally:
        os.close(read_end)
        os.close(write_end)


@contextmanager
def log_on(fd: int, **kwargs: int) -> Iterator[StderrLog]:
    log = StderrLog(fd, **kwargs)
    try:
        yield log
    finally:
        log.close()


def fill(fd: int) -> int:
    return fill_pipe(f"/proc/self/fd/{fd}")


def read_all(fd: int) -> bytes:
    """Everything the pipe holds now, without waiting for more."""
    chunks = []
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)
    try:
        while True:
            chunks.append(os.read(fd, 1 << 16))
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, blocking)
    return b"".join(chunks)


def test_a_line_goes_out_at_once_with_the_prefix_and_a_newline() -> None:
    with pipe() as (r, w), log_on(w) as log:
        log("listening on /run/x.sock")
        assert read_all(r) == b"inferproxy: listening on /run/x.sock\n"
        assert not log.pending


def test_it_is_the_kind_of_log_a_select_loop_can_drain() -> None:
    with pipe() as (_r, w), log_on(w) as log:
        assert isinstance(log, DrainableLog)
    assert not isinstance([].append, DrainableLog)


def test_ten_thousand_lines_into_a_full_pipe_nobody_reads_return_at_once() -> None:
    with pipe() as (_r, w), log_on(w) as log:
        fill(w)
        started = time.monotonic()
        for i in range(10_000):
            log(f"refused a connection: {i}")
        elapsed = time.monotonic() - started
        assert log.pending
        assert log.dropped > 8_000  # the 64 KiB queue keeps the first 1800 or so
    assert elapsed < 0.2


def test_the_shared_descriptor_is_never_left_non_blocking() -> None:
    # Whoever else holds stderr (a shell, a supervisor) must not find it changed.
    with pipe() as (_r, w), log_on(w) as log:
        fill(w)
        log("a line that cannot go out")
        log.drain()
        assert os.get_blocking(w)


def test_lines_queued_while_full_come_out_whole_and_in_order_once_the_reader_catches_up() -> None:
    with pipe() as (r, w), log_on(w) as log:
        filler = fill(w)
        for i in range(100):
            log(f"line {i}")
        assert log.pending and log.dropped == 0
        got = b""
        while log.pending or len(got) < filler:
            got += read_all(r)
            log.drain()
        got += read_all(r)
    assert got[:filler] == b"." * filler
    assert got[filler:].decode().splitlines() == [f"inferproxy: line {i}" for i in range(100)]


def test_lines_dropped_while_full_are_counted_in_one_line_once_the_pipe_drains() -> None:
    with pipe() as (r, w), log_on(w, capacity=100) as log:
        filler = fill(w)
        for i in range(50):
            log(f"line {i:02}")  # 20 bytes each: 5 fit in the queue
        assert log.dropped == 45
        assert len(read_all(r)) == filler
        log.drain()
        assert read_all(r).decode().splitlines() == [
            "inferproxy: line 00",
            "inferproxy: line 01",
            "inferproxy: line 02",
            "inferproxy: line 03",
            "inferproxy: line 04",
            "inferproxy: dropped 45 log lines while stderr was full",
        ]
        assert log.dropped == 0 and not log.pending
        log("after")
        assert read_all(r) == b"inferproxy: after\n"


def test_the_descriptor_to_watch_becomes_writable_when_the_reader_catches_up() -> None:
    with pipe() as (r, w), log_on(w) as log:
        fill(w)
        log("waiting")
        watched = log.fileno()
        assert watched != w  # a description of its own, not the shared one
        assert select.select([], [watched], [], 0)[1] == []
        read_all(r)
        assert select.select([], [watched], [], 0.2)[1] == [watched]
        log.drain()
        assert read_all(r) == b"inferproxy: waiting\n"


def test_finish_waits_a_bounded_time_for_a_reader() -> None:
    with pipe() as (r, w), log_on(w) as log:
        filler = fill(w)
        log("last words")
        started = time.monotonic()
        assert not log.finish(0.05)
        assert 0.04 < time.monotonic() - started < 0.5
        assert not log.finish(0)  # once, no waiting

        def reader() -> None:
            time.sleep(0.05)
            left = filler
            while left:
                left -= len(os.read(r, left))

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert log.finish(2.0)
        finally:
            thread.join()
        assert read_all(r) == b"inferproxy: last words\n"


def test_a_socket_as_stderr_is_written_without_blocking_and_left_blocking() -> None:
    # A journald stream is a socket: MSG_DONTWAIT keeps the write from blocking.
    ours, theirs = socket.socketpair()
    with ours, theirs, log_on(ours.fileno()) as log:
        ours.setblocking(False)
        try:
            while True:
                ours.send(b"." * 4096)
        except BlockingIOError:
            pass
        ours.setblocking(True)
        started = time.monotonic()
        for i in range(10_000):
            log(f"line {i}")
        assert time.monotonic() - started < 0.2
        assert log.pending and log.dropped > 0
        assert ours.getblocking() and not fcntl.fcntl(ours.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK


def test_a_regular_file_as_stderr_is_appended_to() -> None:
    with tempfile.TemporaryFile() as file, log_on(file.fileno()) as log:
        log("one")
        log("two")
        file.seek(0)
        assert file.read() == b"inferproxy: one\ninferproxy: two\n"
        assert os.get_blocking(file.fileno())


@pytest.mark.parametrize("how", ["reader gone", "descriptor closed"])
def test_a_broken_stderr_is_given_up_on_quietly(how: str) -> None:
    read_end, write_end = os.pipe()
    still_open = {read_end, write_end}
    try:
        if how == "reader gone":
            os.close(read_end)
            still_open.discard(read_end)
            fd = write_end
        else:
            fd = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1  # the last number: surely unused
            with pytest.raises(OSError):
                fcntl.fcntl(fd, fcntl.F_GETFD)
        log = StderrLog(fd)
        try:
            log("nobody hears this")
            log("nor this")
            assert not log.pending and log.dropped == 0
            assert log.fileno() == -1  # nothing for a select loop to watch any more
        finally:
            log.close()
    finally:
        for leftover in still_open:
            os.close(leftover)
