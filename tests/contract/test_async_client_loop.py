"""The asyncio client never blocks its event loop: several streams and `/slots` calls at once on
a loop in debug mode, which logs every callback or task step that holds the loop longer than
`slow_callback_duration` ("Executing <Task ...> took 0.031 seconds").

The fake server runs in a process of its own (its command line), so that its threads never hold
this process's GIL while a step of the loop is being timed. The step is timed on the wall clock,
so on a loaded machine another process taking the CPU in the middle of a short step looks the
same as a step that blocked. A step that blocks does so on every run, a step that was preempted
does not: the scenario runs up to five times and must come out clean once; the failure lists
the slow steps of every run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.fake_server import sse_reply
from adapters.fake_server.wire import on_wire
from app.container import Container
from client_support import chunk, config_for
from domain.messages import ChatRequest, UserMessage
from fake_process import served_raw

pytestmark = pytest.mark.timeout(30)

WORDS = 40
PIECE_DELAY_MS = 5
# Runs of each scenario, one of which must be clean (see the module docstring).
RUNS = 5


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    """A fake server in its own process, serving a 40-token answer, one chunk each 5 ms."""
    pieces = [chunk({"content": f" w{n}"}, n=n) for n in range(1, WORDS + 1)]
    wire = on_wire(sse_reply([*pieces, chunk(finish="stop", n=WORDS)]))
    raw = b"".join(data for _, data in wire.writes)
    with served_raw(tmp_path, raw, "--delay-ms", str(PIECE_DELAY_MS)) as path:
        yield path


def test_several_streams_never_block_a_debug_mode_loop(socket_path: str, caplog: pytest.LogCaptureFixture) -> None:
    reqs = [ChatRequest(slot=n % 2, messages=(UserMessage(f"story {n}"),)) for n in range(6)]
    answer = "".join(f" w{n}" for n in range(1, WORDS + 1))

    async def run() -> list[Any]:
        aio = Container(config=config_for(socket_path, liveness_ms=2000, busy_wait_ms=10000)).async_client()
        loop = asyncio.get_running_loop()
        await aio.chat(reqs[0], lambda event: None)  # first-use costs (imports, caches) unwatched
        loop.set_debug(True)
        loop.slow_callback_duration = 0.02
        streams = [aio.chat(req, lambda event: None) for req in reqs]
        return [*await asyncio.gather(*streams), await aio.slots()]

    slow_runs: list[list[str]] = []
    for _ in range(RUNS):
        caplog.clear()
        with caplog.at_level("WARNING", logger="asyncio"):
            results = asyncio.run(run())
        assert [c.content for c in results[:6]] == [answer] * 6
        assert [s.is_processing for s in results[6]] == [False, False]
        slow = [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]
        if not slow:
            return
        slow_runs.append(slow)
    pytest.fail(f"every run had a step that held the loop over 20 ms: {slow_runs}")


@pytest.fixture
def fast_socket_path(tmp_path: Path) -> Iterator[str]:
    """A fake server in its own process, writing a 3000-token answer as fast as it can."""
    pieces = [chunk({"content": f" w{n}"}, n=n) for n in range(1, 3001)]
    wire = on_wire(sse_reply([*pieces, chunk(finish="stop", n=3000)]))
    raw = b"".join(data for _, data in wire.writes)
    with served_raw(tmp_path, raw, "--piece-bytes", "65536") as path:
        yield path


def test_answers_that_arrive_faster_than_they_are_parsed_never_block_the_loop(
    fast_socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Bytes are always there to read: each read lets the loop run, so no step parses more than
    # one read's worth (64 KiB) of the answer.
    reqs = [ChatRequest(slot=n % 2, messages=(UserMessage(f"story {n}"),)) for n in range(4)]

    async def run() -> list[Any]:
        aio = Container(config=config_for(fast_socket_path, liveness_ms=2000, busy_wait_ms=10000)).async_client()
        loop = asyncio.get_running_loop()
        await aio.chat(reqs[0], lambda event: None)
        loop.set_debug(True)
        loop.slow_callback_duration = 0.02
        return await asyncio.gather(*(aio.chat(req, lambda event: None) for req in reqs))

    slow_runs: list[list[str]] = []
    for _ in range(RUNS):
        caplog.clear()
        with caplog.at_level("WARNING", logger="asyncio"):
            results = asyncio.run(run())
        assert [c.timings.predicted_n for c in results] == [3000] * 4
        slow = [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]
        if not slow:
            return
        slow_runs.append(slow)
    pytest.fail(f"every run had a step that held the loop over 20 ms: {slow_runs}")
