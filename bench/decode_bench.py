"""Streaming decode throughput: our HTTP + SSE stack against httpx + httpx-sse, in one run.

One recorded llama-server stream (the longest `response.raw` under
`tests/fixtures/transcripts/`; a synthetic 604-event stream of the same shape with `--synthetic`
or when none is recorded) is served verbatim by the fake server in its own process, over a Unix socket.
Each round reads the whole stream once with each stack, interleaved so both see the same machine:

    ours    UdsTransport + SseDecoder + parse_chunk (orjson)
    httpx   httpx.Client(HTTPTransport(uds=...)) + httpx_sse.connect_sse + json.loads

Reported per stack: events per second (wall clock, connect to `[DONE]`) and CPU per event
(`time.thread_time` of the reading thread). Goal: ours at least 1.5x the events per second of
httpx + httpx-sse.

Run: `.venv/bin/python bench/decode_bench.py [--quick] [--synthetic]`. `run(quick)` returns (name, value) rows
for a combined table. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from common import (
    SRC,
    StackResult,
    Stream,
    chunked_response,
    fake_server,
    interleaved,
    recorded_stream,
    report,
    rounds_for,
)

sys.path.insert(0, str(SRC))

from adapters.fake_server import ROLE, chunk, chunk_timings, sse_event
from adapters.uds_http._sync.transport import UdsTransport
from app.config import Limits
from domain.sse import SseData, SseDecoder, SseDone, parse_chunk
from ports.transport import TIMED_OUT

HEADER_BYTES = Limits().header_bytes

CHAT_PATH = "/v1/chat/completions"
REQUEST = b'{"model":"test-model","stream":true,"messages":[{"role":"user","content":"hi"}]}'
TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------------------------
# The stream


def synthetic_stream(events: int = 604) -> Stream:
    """Chunks shaped like llama-server's with per-token timings on: a role chunk, content
    deltas, a finish chunk, `[DONE]`; one chunk per event, chunked framing."""
    this = partial(chunk, cid="chatcmpl-" + "Q7x2" * 8, created=1758100000, fingerprint="b11434-5f2a9c1e")

    def timings(n: int) -> dict[str, Any]:
        """After `n` tokens, the rates written to 3 and 2 places (ms, per second)."""
        full = chunk_timings(n, cache_n=12, prompt_n=31, prompt_ms=104.512, token_ms=7.125, rates=True)
        return {key: round(value, 2 if key.endswith("_per_second") else 3) for key, value in full.items()}

    payloads = [sse_event(this(ROLE))]
    payloads += [sse_event(this({"content": f" word{n}"}, timings=timings(n))) for n in range(1, events - 1)]
    payloads.append(sse_event(this(finish="stop", timings=timings(events - 1))))
    payloads.append(b"data: [DONE]\n\n")
    head = (
        b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: \r\nContent-Type: text/event-stream\r\n"
        b"Keep-Alive: timeout=5, max=100\r\nServer: llama.cpp\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return Stream(f"synthetic ({events} events)", chunked_response(head, payloads), events)


# ---------------------------------------------------------------------------------------------
# The two stacks: each reads the stream to [DONE] and returns the number of data events


def ours(socket_path: str) -> Callable[[], int]:
    transport = UdsTransport(socket_path, header_bytes=HEADER_BYTES)

    def read_stream() -> int:
        exchange = transport.open("POST", CHAT_PATH, REQUEST, timeout=TIMEOUT_S)
        try:
            head = exchange.head(TIMEOUT_S)
            if head is TIMED_OUT or head.status != 200:  # type: ignore[union-attr]
                raise RuntimeError(f"bad head: {head!r}")
            decoder = SseDecoder()
            count = 0
            while True:
                data = exchange.read(TIMEOUT_S)
                if data is TIMED_OUT:
                    raise RuntimeError("timed out")
                if not data:
                    decoder.end()
                    return count
                for event in decoder.feed(data):  # type: ignore[arg-type]
                    if type(event) is SseData:
                        parse_chunk(event.data)
                        count += 1
                    elif type(event) is SseDone:
                        return count
        finally:
            exchange.close()

    return read_stream


def httpx_stack(socket_path: str) -> Callable[[], int]:
    import httpx
    import httpx_sse

    client = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), timeout=TIMEOUT_S)
    url = "http://localhost" + CHAT_PATH
    headers = {"content-type": "application/json"}

    def read_stream() -> int:
        count = 0
        with httpx_sse.connect_sse(client, "POST", url, content=REQUEST, headers=headers) as source:
            for sse in source.iter_sse():
                if sse.data == "[DONE]":
                    break
                json.loads(sse.data)
                count += 1
        return count

    return read_stream


def measure(stacks: dict[str, Callable[[], int]], rounds: int, warmup: int) -> list[StackResult]:
    timed = interleaved(stacks, rounds, warmup)
    counts = {name: t.last for name, t in timed.items()}
    if len(set(counts.values())) != 1:
        raise RuntimeError(f"the stacks saw different numbers of events: {counts}")
    return [StackResult(name, t.last or 0, t.wall_s, t.cpu_s) for name, t in timed.items()]


def run(quick: bool = False, synthetic: bool = False) -> list[tuple[str, str]]:
    stream = (None if synthetic else recorded_stream()) or synthetic_stream()
    rounds, warmup = rounds_for(quick)
    with fake_server(stream.raw, prefix="decode-bench-") as socket_path:
        results = measure({"ours": ours(socket_path), "httpx": httpx_stack(socket_path)}, rounds, warmup)
    return rows(stream, results)


def rows(stream: Stream, results: list[StackResult]) -> list[tuple[str, str]]:
    ours_result, httpx_result = results
    per_event = len(stream.raw) / max(ours_result.events, 1)
    out = [("decode: stream", f"{stream.source}, {ours_result.events} events, {per_event:.0f} bytes/event")]
    for r in results:
        label = "ours (UdsTransport + SseDecoder + orjson)" if r.name == "ours" else "httpx + httpx-sse + json"
        out.append((f"decode: {label} events/s", f"{r.events_per_s:,.0f}"))
        out.append((f"decode: {label} CPU per event", f"{r.cpu_us_per_event:.2f} µs"))
    out.append(
        (
            "decode: events/s, ours / httpx+httpx-sse (goal >= 1.5)",
            f"{ours_result.events_per_s / httpx_result.events_per_s:.2f}x",
        )
    )
    out.append(
        (
            "decode: CPU per event, httpx+httpx-sse / ours",
            f"{httpx_result.cpu_us_per_event / ours_result.cpu_us_per_event:.2f}x",
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10 rounds instead of 40")
    parser.add_argument("--synthetic", action="store_true", help="the synthetic 604-event stream, not a recording")
    args = parser.parse_args()
    report(lambda: run(quick=args.quick, synthetic=args.synthetic))


if __name__ == "__main__":
    main()
