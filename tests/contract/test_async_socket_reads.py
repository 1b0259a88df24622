"""An asyncio read that is cancelled, or runs out of time, takes no byte with it; a write sends
every byte or times out.

The loop's own `sock_recv` reads inside a reader callback and hands the bytes over through a
future: a cancel (a timeout is one) landing in the same turn of the loop, after the callback and
before the task resumes, drops them. `AsyncSocketStream.recv` waits for readiness and reads only
once it runs again, so the bytes stay in the socket for the next read.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from adapters.uds_http.sockets import AsyncSocketStream
from ports.transport import TIMED_OUT

pytestmark = pytest.mark.timeout(10)


async def cancelled_as_the_bytes_arrive(make_read: str) -> tuple[bool, bytes]:
    """Bytes arrive and, in the same turn of the loop, the waiting read is cancelled."""
    ours, peer = socket.socketpair()
    stream = AsyncSocketStream(ours)
    loop = asyncio.get_running_loop()
    try:
        if make_read == "stream":
            reading = asyncio.ensure_future(stream.recv(100, 5.0))
        else:
            reading = asyncio.ensure_future(loop.sock_recv(ours, 100))
        await asyncio.sleep(0)  # the read is waiting
        peer.send(b"x")
        loop.call_at(loop.time(), reading.cancel)  # due with the readiness: the same turn
        cancelled = False
        try:
            await reading
        except asyncio.CancelledError:
            cancelled = True
        later = await stream.recv(100, 0.05)
        return cancelled, later if isinstance(later, bytes) else b""
    finally:
        stream.close()
        peer.close()


def test_a_read_cancelled_as_its_bytes_arrive_leaves_them_for_the_next_read() -> None:
    cancelled, later = asyncio.run(cancelled_as_the_bytes_arrive("stream"))
    assert (cancelled, later) == (True, b"x")


def test_the_loops_own_sock_recv_drops_them_which_is_why_it_is_not_used() -> None:
    # The oracle: the same scene over `loop.sock_recv` loses the byte, so the test above would
    # catch a return to it.
    cancelled, later = asyncio.run(cancelled_as_the_bytes_arrive("loop"))
    assert (cancelled, later) == (True, b"")


def test_a_read_that_times_out_as_its_bytes_arrive_leaves_them_for_the_next_read() -> None:
    async def scene() -> list[bytes]:
        ours, peer = socket.socketpair()
        stream = AsyncSocketStream(ours)
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        try:
            for _ in range(50):
                loop.call_later(0.002, peer.send, b"y")
                first = await stream.recv(100, 0.002)
                if isinstance(first, bytes):
                    got.append(first)
                else:
                    second = await stream.recv(100, 0.1)
                    got.append(second if isinstance(second, bytes) else b"")
        finally:
            stream.close()
            peer.close()
        return got

    assert asyncio.run(scene()) == [b"y"] * 50


def test_bytes_left_unread_after_a_wait_never_keep_the_loop_turning() -> None:
    # The reader stays on the loop after a wait that got its bytes; with nobody waiting, the
    # next readiness takes it off, or the loop would turn flat out on the unread bytes.
    async def scene() -> tuple[float, bytes, bytes]:
        ours, peer = socket.socketpair()
        stream = AsyncSocketStream(ours)
        try:
            reading = asyncio.ensure_future(stream.recv(1, 5.0))
            await asyncio.sleep(0)  # the read is waiting
            peer.send(b"abc")
            first = await reading  # one byte taken, two left unread
            cpu = time.process_time()
            await asyncio.sleep(0.1)
            used = time.process_time() - cpu
            rest = await stream.recv(10, 1.0)
            return used, first if isinstance(first, bytes) else b"", rest if isinstance(rest, bytes) else b""
        finally:
            stream.close()
            peer.close()

    used, first, rest = asyncio.run(scene())
    assert (first, rest) == (b"a", b"bc")
    assert used < 0.05


def test_a_wait_after_a_wait_is_woken_by_the_next_bytes() -> None:
    async def scene() -> list[bytes]:
        ours, peer = socket.socketpair()
        stream = AsyncSocketStream(ours)
        got: list[bytes] = []
        try:
            for piece in (b"x", b"y", b"z"):
                reading = asyncio.ensure_future(stream.recv(10, 2.0))
                await asyncio.sleep(0)  # waiting, the reader kept from the wait before
                peer.send(piece)
                data = await reading
                got.append(data if isinstance(data, bytes) else b"")
            return got
        finally:
            stream.close()
            peer.close()

    assert asyncio.run(scene()) == [b"x", b"y", b"z"]


# -- the read's timer: kept between waits, due by the waiting read's deadline ---------------------


class CountingSocket:
    """A socket whose receives are counted: each is one wake of a waiting read, or its first try."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.receives = 0

    def recv(self, size: int) -> bytes:
        self.receives += 1
        return self.sock.recv(size)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_a_short_read_after_a_long_one_times_out_at_its_own_deadline() -> None:
    # The long read's timer (5 s) is still set when the short one waits: it must not wait for it.
    async def scene() -> tuple[bytes | object, bytes | object, float]:
        ours, peer = socket.socketpair()
        stream = AsyncSocketStream(ours)
        loop = asyncio.get_running_loop()
        try:
            loop.call_later(0.01, peer.send, b"x")
            first = await stream.recv(10, 5.0)
            started = time.monotonic()
            second = await stream.recv(10, 0.1)
            return first, second, time.monotonic() - started
        finally:
            stream.close()
            peer.close()

    first, second, waited = asyncio.run(scene())
    assert (first, second) == (b"x", TIMED_OUT)
    assert 0.1 <= waited < 1.0


def test_a_long_read_after_a_short_one_is_not_woken_by_the_short_ones_timer() -> None:
    # The short read's timer (due at 50 ms) fires while the long one waits: it is set again,
    # for the long read's deadline, and the read sleeps on, trying the socket only at its end.
    async def scene() -> tuple[bytes | object, bytes | object, float, int]:
        ours, peer = socket.socketpair()
        counted = CountingSocket(ours)
        stream = AsyncSocketStream(counted)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        try:
            loop.call_later(0.01, peer.send, b"x")
            first = await stream.recv(10, 0.05)
            await asyncio.sleep(0)  # one turn: the readiness seen with the byte still unread passes
            counted.receives = 0
            started = time.monotonic()
            second = await stream.recv(10, 0.15)
            return first, second, time.monotonic() - started, counted.receives
        finally:
            stream.close()
            peer.close()

    first, second, waited, receives = asyncio.run(scene())
    assert (first, second) == (b"x", TIMED_OUT)
    assert 0.15 <= waited < 1.0
    assert receives == 2  # the first try, and the one at the deadline


# -- writes: what the socket's buffer takes at once needs no timer; the rest waits, within the
# timeout ------------------------------------------------------------------------------------


def _buffered_pair() -> tuple[socket.socket, socket.socket]:
    ours, peer = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return ours, peer


def test_a_write_the_buffer_takes_whole_returns_without_waiting_even_with_no_time_left() -> None:
    async def scene() -> bytes:
        ours, peer = socket.socketpair()
        stream = AsyncSocketStream(ours)
        try:
            await stream.send_all(b"GET / HTTP/1.1\r\n\r\n", 0.0)
            return peer.recv(100)
        finally:
            stream.close()
            peer.close()

    assert asyncio.run(scene()) == b"GET / HTTP/1.1\r\n\r\n"


def test_a_write_larger_than_the_buffer_arrives_whole_and_in_order() -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: many times what the buffers hold

    async def scene() -> bytes:
        ours, peer = _buffered_pair()
        stream = AsyncSocketStream(ours)
        got = bytearray()

        def drain() -> None:
            while len(got) < len(data):
                piece = peer.recv(65536)
                if not piece:
                    return
                got.extend(piece)

        try:
            reader = asyncio.get_running_loop().run_in_executor(None, drain)
            await stream.send_all(data, 5.0)
            await reader
            return bytes(got)
        finally:
            stream.close()
            peer.close()

    assert asyncio.run(scene()) == data


def test_a_write_the_peer_never_reads_times_out_within_its_limit() -> None:
    async def scene() -> float:
        ours, peer = _buffered_pair()
        stream = AsyncSocketStream(ours)
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            with pytest.raises(TimeoutError):
                await stream.send_all(b"x" * (1 << 20), 0.05)
            return loop.time() - started
        finally:
            stream.close()
            peer.close()

    assert 0.04 <= asyncio.run(scene()) < 1.0
