"""The async client: CPU per streamed chunk against the sync client and openai-python's
`AsyncOpenAI`, and 32 concurrent streams on one event loop against 32 threads of the sync client.

The streams are `client_bench`'s: the recorded `response.raw` under `tests/fixtures/transcripts/`
with the most events (when one is recorded) and the synthetic 604-event stream, each served
verbatim by the fake server in its own process over a Unix socket.

Per chunk, each round reads the whole stream once with each stack, interleaved (`common.interleaved`),
all in this thread; CPU is `time.thread_time` from the request to the final message, divided by
the stream's data events:

    sync         app.Client.chat, as in client_bench
    async        app.AsyncClient.chat, awaited on an event loop of its own (one for all rounds)
    asyncopenai  openai-python's AsyncOpenAI streaming on httpx.AsyncHTTPTransport(uds=...),
                 accumulating the same message, on an event loop of its own

Goals, reported and not asserted: the async client at most 1.5x the sync client's CPU per chunk,
and below 0.1x AsyncOpenAI's. Each run first checks that the async client's Completion equals the
sync client's and what AsyncOpenAI accumulated.

Concurrent: 32 streams of the synthetic stream at once, each on a slot of its own (slots 0-31), so
no call queues behind another: `asyncio.gather` of 32 `AsyncClient.chat` calls on one event loop,
against 32 threads (a pool started once) each running one `Client.chat`. Each round runs both, in
turn; the figures are medians over the rounds of the wall time until the last stream ended and
the CPU of this whole process (`time.process_time`; the server runs in another). The loop is one
thread, on one core at most; the 32 threads take whatever the machine has to spare, so on a busy
machine the wall figure leans towards the threads more than the CPU figure does.

Run: `.venv/bin/python bench/async_bench.py [--quick]`. `run(quick)` returns (name, value) rows
for a combined table. Not a test: nothing here asserts.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from client_bench import (
    MODEL,
    OPENAI_EXTRA_BODY,
    REQUEST,
    TIMEOUT_S,
    Message,
    OpenAIAccumulator,
    client_stack,
    message_of,
    openai_messages,
    synthetic_stream,
)
from common import SRC, StackResult, Stream, cli, fake_server, interleaved, recorded_stream, rounds_for

sys.path.insert(0, str(SRC))

from app.async_client import AsyncClient
from app.client import Client
from app.config import parse_config
from app.container import Container
from domain.completion import Completion
from domain.events import ChatEvent
from domain.messages import ChatRequest

CPU_GOAL_VS_SYNC = 1.5
CPU_GOAL_VS_ASYNCOPENAI = 0.1
STREAMS = 32


def container_for(socket_path: str, total_slots: int = 1) -> Container:
    config = parse_config(
        {
            "proxy": {"burst": 1_000_000, "rate": 1_000_000},  # no accept limit to keep on this path
            "socket": socket_path,
            "model": MODEL,
            "limits": {"poll_ms": int(TIMEOUT_S * 1000), "thinking_cap": 1 << 20},
            "expect": {"chat_template_sha256": "0" * 64, "n_ctx": 4096, "total_slots": total_slots},
        }
    )
    return Container(config=config)


# ---------------------------------------------------------------------------------------------
# CPU per chunk: each stack reads the stream to its end and returns what it accumulated


class OnLoop:
    """An async stack on an event loop of its own, driven from this thread one round at a time:
    each call runs `read()` to its end; `close()` runs `aclose()` (if any), then whatever async
    generators are left, and closes the loop."""

    def __init__(
        self, read: Callable[[], Awaitable[Message]], aclose: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._read = read
        self._aclose = aclose

    def __call__(self) -> Message:
        return self.loop.run_until_complete(self._read())

    def close(self) -> None:
        loop = self.loop
        try:
            if self._aclose is not None:
                loop.run_until_complete(self._aclose())
            # openai-python's streams leave async generators to the loop's finaliser.
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def async_stack(socket_path: str) -> OnLoop:
    client: AsyncClient = container_for(socket_path).async_client()
    sink: list[ChatEvent] = []

    async def read_stream() -> Message:
        sink.clear()
        return message_of(await client.chat(REQUEST, sink.append))

    return OnLoop(read_stream, client.aclose)


def asyncopenai_stack(socket_path: str) -> OnLoop:
    import httpx
    import openai

    http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=socket_path), timeout=TIMEOUT_S)
    client = openai.AsyncOpenAI(base_url="http://localhost/v1", api_key="none", http_client=http, max_retries=0)
    messages = openai_messages()

    async def read_stream() -> Message:
        accumulated = OpenAIAccumulator()
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, extra_body=OPENAI_EXTRA_BODY
        )
        async for chunk in stream:
            accumulated.add(chunk)
        return accumulated.message()

    return OnLoop(read_stream, http.aclose)


def check_same_message(stacks: dict[str, Callable[[], Message]]) -> None:
    answers = {name: read() for name, read in stacks.items()}
    if len({repr(a) for a in answers.values()}) != 1:
        lines = "\n".join(f"  {name} {answer}" for name, answer in answers.items())
        raise RuntimeError(f"the stacks disagree:\n{lines}")


def bench_per_chunk(stream: Stream, quick: bool) -> list[tuple[str, str]]:
    rounds, warmup = rounds_for(quick)
    with fake_server(stream.raw, prefix="async-bench-") as socket_path:
        on_loops = [async_stack(socket_path), asyncopenai_stack(socket_path)]
        try:
            stacks = {"sync": client_stack(socket_path), "async": on_loops[0], "asyncopenai": on_loops[1]}
            check_same_message(stacks)
            timed = interleaved(stacks, rounds, warmup)
        finally:
            for stack in on_loops:
                stack.close()
    results = {name: StackResult(name, stream.events, t.wall_s, t.cpu_s) for name, t in timed.items()}
    return per_chunk_rows(stream, results)


LABELS = {
    "sync": "app.Client.chat",
    "async": "app.AsyncClient.chat",
    "asyncopenai": "openai-python AsyncOpenAI stream, accumulated",
}


def per_chunk_rows(stream: Stream, results: dict[str, StackResult]) -> list[tuple[str, str]]:
    tag = f"async [{stream.events} events]"
    out = [(f"{tag}: stream", f"{stream.source}, {len(stream.raw) / max(stream.events, 1):.0f} bytes/event")]
    for name, r in results.items():
        out.append((f"{tag}: {LABELS[name]} CPU per chunk", f"{r.cpu_us_per_event:.2f} µs ({r.wall_ms:.1f} ms/stream)"))
    ours = results["async"].cpu_us_per_event
    vs_sync = ours / results["sync"].cpu_us_per_event
    vs_openai = ours / results["asyncopenai"].cpu_us_per_event
    out.append(
        (
            f"{tag}: CPU per chunk, async / sync client (goal <= {CPU_GOAL_VS_SYNC})",
            f"{vs_sync:.2f}x ({'met' if vs_sync <= CPU_GOAL_VS_SYNC else 'MISSED'})",
        )
    )
    out.append(
        (
            f"{tag}: CPU per chunk, async / AsyncOpenAI (goal < {CPU_GOAL_VS_ASYNCOPENAI})",
            f"{vs_openai:.3f}x ({'met' if vs_openai < CPU_GOAL_VS_ASYNCOPENAI else 'MISSED'})",
        )
    )
    return out


# ---------------------------------------------------------------------------------------------
# 32 concurrent streams: one event loop against 32 threads


@dataclass
class Rounds:
    wall_s: list[float]
    cpu_s: list[float]

    @property
    def wall_ms(self) -> float:
        return statistics.median(self.wall_s) * 1e3

    @property
    def cpu_ms(self) -> float:
        return statistics.median(self.cpu_s) * 1e3


def requests(count: int) -> list[ChatRequest]:
    return [ChatRequest(slot=i, messages=REQUEST.messages, thinking=True) for i in range(count)]


def concurrent_async(client: AsyncClient, loop: asyncio.AbstractEventLoop, count: int) -> Callable[[], list[Message]]:
    reqs = requests(count)

    async def all_streams() -> list[Completion]:
        sinks: list[list[ChatEvent]] = [[] for _ in reqs]
        return await asyncio.gather(*(client.chat(req, sink.append) for req, sink in zip(reqs, sinks, strict=True)))

    def run_round() -> list[Message]:
        return [message_of(c) for c in loop.run_until_complete(all_streams())]

    return run_round


def concurrent_threads(client: Client, pool: ThreadPoolExecutor, count: int) -> Callable[[], list[Message]]:
    reqs = requests(count)

    def one(req: ChatRequest) -> Message:
        sink: list[ChatEvent] = []
        return message_of(client.chat(req, sink.append))

    def run_round() -> list[Message]:
        futures = [pool.submit(one, req) for req in reqs]
        return [f.result() for f in futures]

    return run_round


def start_threads(pool: ThreadPoolExecutor, count: int) -> None:
    """Every worker of `pool` started before the first round, so no round pays for a thread."""
    barrier = threading.Barrier(count)
    for future in [pool.submit(barrier.wait, 10.0) for _ in range(count)]:
        future.result()


def bench_concurrent(stream: Stream, quick: bool, count: int = STREAMS) -> list[tuple[str, str]]:
    rounds, warmup = (5, 1) if quick else (20, 3)
    loop = asyncio.new_event_loop()
    pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="sync-stream")
    try:
        with fake_server(stream.raw, prefix="async-bench-many-") as socket_path:
            # One container each, as a daemon would have one client of each kind.
            stacks = {
                "loop": concurrent_async(container_for(socket_path, count).async_client(), loop, count),
                "threads": concurrent_threads(container_for(socket_path, count).client(), pool, count),
            }
            start_threads(pool, count)
            timed = {name: Rounds([], []) for name in stacks}
            answers: dict[str, list[Message]] = {}
            for index in range(warmup + rounds):
                for name, run_round in stacks.items():
                    wall = time.perf_counter()
                    cpu = time.process_time()
                    answers[name] = run_round()
                    cpu = time.process_time() - cpu
                    wall = time.perf_counter() - wall
                    if index >= warmup:
                        timed[name].wall_s.append(wall)
                        timed[name].cpu_s.append(cpu)
    finally:
        pool.shutdown(wait=True)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    if answers["loop"] != answers["threads"] or len({repr(m) for m in answers["loop"]}) != 1:
        raise RuntimeError("the concurrent streams did not all end in the same answer")
    return concurrent_rows(stream, count, timed)


def concurrent_rows(stream: Stream, count: int, timed: dict[str, Rounds]) -> list[tuple[str, str]]:
    tag = f"async [{count} streams x {stream.events} events]"
    chunks = count * stream.events
    labels = {"loop": f"AsyncClient, {count} tasks on one event loop", "threads": f"Client, {count} threads"}
    out = []
    for name, r in timed.items():
        per_chunk = statistics.median(r.cpu_s) / chunks * 1e6
        value = f"{r.wall_ms:.0f} ms wall, {r.cpu_ms:.0f} ms CPU ({per_chunk:.2f} µs/chunk)"
        out.append((f"{tag}: {labels[name]}", value))
    loop, threads = timed["loop"], timed["threads"]
    out.append((f"{tag}: wall, one loop / {count} threads", f"{loop.wall_ms / threads.wall_ms:.2f}x"))
    out.append((f"{tag}: CPU, one loop / {count} threads", f"{loop.cpu_ms / threads.cpu_ms:.2f}x"))
    return out


# ---------------------------------------------------------------------------------------------


def run(quick: bool = False) -> list[tuple[str, str]]:
    recorded = recorded_stream()
    synthetic = synthetic_stream()
    rows = [row for stream in [*([recorded] if recorded else []), synthetic] for row in bench_per_chunk(stream, quick)]
    return rows + bench_concurrent(synthetic, quick)


if __name__ == "__main__":
    cli(run, __doc__)
