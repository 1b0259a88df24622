"""A server that sends a long SSE line one byte per HTTP chunk cannot hold the asyncio client's
event loop: the exchange lets the loop run after a bounded number of pieces taken from one
receive, and the SSE decoder's cost stays linear in the bytes (`domain.sse`).

The fake server runs in a process of its own and writes the whole body as fast as it can, so one
receive brings some ten thousand one-byte chunks; the loop runs in debug mode and logs any step
longer than 50 ms. As in `test_async_client_loop`, a step preempted by another process is not a
step that blocked: the scenario runs up to five times and must come out clean once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from app.container import Container
from client_support import chunk, config_for
from domain.messages import ChatRequest, UserMessage
from fake_process import served_raw

pytestmark = pytest.mark.timeout(120)

TEXT_BYTES = (1 << 20) - 4096  # one SSE line of about 1 MiB, under the default line limit
RUNS = 5


def one_byte_chunks(data: bytes) -> bytes:
    return b"".join(b"1\r\n" + data[i : i + 1] + b"\r\n" for i in range(len(data)))


def body_in_one_byte_chunks(text: str) -> bytes:
    """A 200 event stream whose every body byte is an HTTP chunk of its own."""
    events = [chunk({"content": text}, n=1), chunk(finish="stop", n=1)]
    sse = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + one_byte_chunks(sse) + b"0\r\n\r\n"


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    with served_raw(tmp_path, body_in_one_byte_chunks("x" * TEXT_BYTES), "--piece-bytes", "65536") as path:
        yield path


def test_a_long_line_in_one_byte_chunks_never_holds_the_loop_over_50_ms(
    socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    req = ChatRequest(slot=0, messages=(UserMessage("a long answer"),))

    async def run() -> tuple[int, int]:
        aio = Container(
            config=config_for(socket_path, liveness_ms=5000, poll_ms=2000, idle_grace_ms=10000)
        ).async_client()
        loop = asyncio.get_running_loop()
        ticks = 0

        async def ticker() -> None:  # another task on the loop, which must keep getting turns
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(ticker())
        loop.set_debug(True)
        loop.slow_callback_duration = 0.05
        try:
            completion = await aio.chat(req, lambda event: None)
        finally:
            other.cancel()
        return len(completion.content), ticks

    slow_runs: list[list[str]] = []
    for _ in range(RUNS):
        caplog.clear()
        with caplog.at_level("WARNING", logger="asyncio"):
            length, ticks = asyncio.run(run())
        assert length == TEXT_BYTES
        assert ticks > 100, "the other task got turns while the answer was parsed"
        slow = [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]
        if not slow:
            return
        slow_runs.append(slow[:5])
    pytest.fail(f"every run had a step that held the loop over 50 ms: {slow_runs}")
