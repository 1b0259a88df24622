"""An asyncio read that is cancelled, or runs out of time, takes no byte with it.

The loop's own `sock_recv` reads inside a reader callback and hands the bytes over through a
future: a cancel (a timeout is one) landing in the same turn of the loop, after the callback and
before the task resumes, drops them. `AsyncSocketStream.recv` waits for readiness and reads only
once it runs again, so the bytes stay in the socket for the next read.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from adapters.uds_http.sockets import AsyncSocketStream

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
