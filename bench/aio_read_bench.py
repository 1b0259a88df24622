"""How the asyncio adapter should wait for a stream of small chunks: the loop's socket API
(`loop.sock_recv`) against asyncio streams, and two variants, in one run.

A server in its own process answers each 1-byte ping with one 500-byte chunk, so every chunk
costs the client one wait on the event loop, as a token of a streamed answer does. Each way reads
with a per-read deadline, as the exchange does:

    sock_recv   a non-blocking socket, `loop.sock_recv` under `asyncio.timeout`: what
                `adapters.uds_http.aio` uses
    add_reader  the same socket, `loop.add_reader` on a future and a `call_at` timer, by hand
    streams     `asyncio.open_unix_connection`, `StreamReader.read` under `asyncio.timeout`
    protocol    a bare `asyncio.Protocol` whose `data_received` wakes a future, with a timer

CPU is `time.process_time` of this process per chunk (the server is another process).

Run: `.venv/bin/python bench/aio_read_bench.py [--quick]`. `run(quick)` returns (name, value) rows
for a combined table. Not a test: nothing here asserts.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from common import cli

CHUNK_BYTES = 500
SERVER = """
import socket, sys
chunk = b"x" * int(sys.argv[2])
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(8)
print("ready", flush=True)
while True:
    conn, _ = listener.accept()
    while True:
        ping = conn.recv(16)
        if not ping:
            break
        conn.sendall(chunk * len(ping))
    conn.close()
"""

Reader = Callable[[float], Awaitable[bytes]]


def _settle(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


async def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, path)
    return sock


async def via_sock_recv(path: str, chunks: int) -> float:
    loop = asyncio.get_running_loop()
    sock = await _connect(path)

    async def read(timeout: float) -> bytes:
        async with asyncio.timeout(timeout):
            return await loop.sock_recv(sock, 65536)

    try:
        return await _pingpong(sock.send, read, chunks)
    finally:
        sock.close()


async def via_add_reader(path: str, chunks: int) -> float:
    loop = asyncio.get_running_loop()
    sock = await _connect(path)
    fd = sock.fileno()

    async def read(timeout: float) -> bytes:
        try:
            return sock.recv(65536)
        except BlockingIOError:
            pass
        fut: asyncio.Future[bool] = loop.create_future()
        loop.add_reader(fd, _settle, fut, True)
        timer = loop.call_at(loop.time() + timeout, _settle, fut, False)
        try:
            await fut
        finally:
            loop.remove_reader(fd)
            timer.cancel()
        return sock.recv(65536)

    try:
        return await _pingpong(sock.send, read, chunks)
    finally:
        sock.close()


async def via_streams(path: str, chunks: int) -> float:
    reader, writer = await asyncio.open_unix_connection(path)

    async def read(timeout: float) -> bytes:
        async with asyncio.timeout(timeout):
            return await reader.read(65536)

    try:
        return await _pingpong(lambda data: writer.write(data), read, chunks)
    finally:
        writer.close()


class _Chunks(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer: list[bytes] = []
        self.waiter: asyncio.Future[bool] | None = None

    def data_received(self, data: bytes) -> None:
        self.buffer.append(data)
        if self.waiter is not None:
            _settle(self.waiter, True)


async def via_protocol(path: str, chunks: int) -> float:
    loop = asyncio.get_running_loop()
    sock = await _connect(path)
    transport, proto = await loop.create_unix_connection(_Chunks, sock=sock)

    async def read(timeout: float) -> bytes:
        if not proto.buffer:
            fut = proto.waiter = loop.create_future()
            timer = loop.call_at(loop.time() + timeout, _settle, fut, False)
            try:
                await fut
            finally:
                timer.cancel()
                proto.waiter = None
        data = b"".join(proto.buffer)
        proto.buffer.clear()
        return data

    try:
        return await _pingpong(lambda data: transport.write(data), read, chunks)
    finally:
        transport.close()


async def _pingpong(send: Callable[[bytes], object], read: Reader, chunks: int) -> float:
    started = time.process_time()
    for _ in range(chunks):
        send(b"1")
        got = 0
        while got < CHUNK_BYTES:
            got += len(await read(5.0))
    return (time.process_time() - started) / chunks


WAYS = {
    "sock_recv": via_sock_recv,
    "add_reader": via_add_reader,
    "streams": via_streams,
    "protocol": via_protocol,
}


def run(quick: bool = False) -> list[tuple[str, str]]:
    chunks, rounds = (3000, 3) if quick else (20000, 5)
    with tempfile.TemporaryDirectory(prefix="aio-read-") as folder:
        path = os.path.join(folder, "s.sock")
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, path, str(CHUNK_BYTES)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "ready":
                raise RuntimeError("the ping server did not start")

            async def measure() -> dict[str, float]:
                best: dict[str, float] = {}
                for _ in range(rounds):  # interleaved, so every way sees the same machine
                    for name, way in WAYS.items():
                        per_chunk = await way(path, chunks)
                        best[name] = min(best.get(name, per_chunk), per_chunk)
                return best

            best = asyncio.run(measure())
        finally:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
    base = best["sock_recv"]
    return [
        (f"asyncio read of a {CHUNK_BYTES}-byte chunk: {name} CPU", f"{value * 1e6:.1f} µs ({value / base:.2f}x)")
        for name, value in best.items()
    ]


if __name__ == "__main__":
    cli(run, __doc__, "fewer chunks and rounds")
