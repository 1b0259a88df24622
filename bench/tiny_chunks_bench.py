"""The whole client's CPU is linear in the bytes received, however the server splits them: a
long SSE line sent one body byte per HTTP chunk costs what the same number of bytes of short
events costs in the same chunks, side by side in one run.

In process, no sockets: the sync `Client` on the in-memory transport (the real HTTP exchange,
body reader, SSE decoder and assembler) replays each body written at once, as a socket delivers
a fast sender's bytes, 64 KiB per receive. Two answers of the same body size: short content
events, and one event whose content is one long SSE line. Each is timed in llama-server's
chunks (one event per chunk) and in one-byte chunks; the ratio that says linear is the long line
against the short events, both in one-byte chunks (1.0 when linear). The cost of tiny chunks
themselves (five bytes of framing per body byte, each parsed) is reported beside it. CPU is
`time.thread_time` of the call.

Run: `.venv/bin/python bench/tiny_chunks_bench.py [--quick]`. `run(quick)` returns (name, value)
rows for a combined table. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time

import orjson

from common import SRC, report

sys.path.insert(0, str(SRC))

from adapters.fake_server import FakeClock, FakeSlotProbe, Piece, ScriptedTransport, chunk
from adapters.fake_server.script import End, Raw
from app.config import parse_config
from app.container import Container
from domain.messages import ChatRequest, UserMessage
from ports import SlotState

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
REQ = ChatRequest(slot=0, messages=(UserMessage("hi"),))


def sse(chunks: list[dict[str, object]]) -> list[bytes]:
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def answers(body_bytes: int) -> tuple[list[bytes], list[bytes]]:
    """Short events and one long line, both about `body_bytes` of body."""
    short = [chunk({"content": f" w{n}"}, n=n) for n in range(1, 100_000)]
    events: list[bytes] = []
    size = 0
    for c in short:
        event = sse([c])[0]
        if size + len(event) > body_bytes:
            break
        events.append(event)
        size += len(event)
    events += sse([chunk(finish="stop", n=len(events))])
    long = sse([chunk({"content": "x" * (body_bytes - 1024)}, n=1), chunk(finish="stop", n=1)])
    return events, long


def framed(events: list[bytes], tiny: bool) -> bytes:
    if tiny:
        body = b"".join(events)
        pieces = [body[i : i + 1] for i in range(len(body))]
    else:
        pieces = events
    return HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def one_call(raw: bytes) -> float:
    clock = FakeClock()
    transport = ScriptedTransport(clock, {("POST", "/v1/chat/completions"): Raw((Piece(0.0, raw),), End.CLOSE)})
    config = parse_config(
        {
            "socket": "/fake.sock",
            "expect": {"chat_template_sha256": "0" * 64, "n_ctx": 4096, "total_slots": 2},
            "proxy": {"burst": 1_000_000, "rate": 1_000_000},  # no accept limit to keep on this path
        }
    )
    container = Container(config=config)
    with container.override_providers(clock=clock, transport=transport, probe=FakeSlotProbe({0: SlotState.IDLE})):
        client = container.client()
        started = time.thread_time()
        client.chat(REQ, lambda event: None)
        return time.thread_time() - started


def run(quick: bool = False) -> list[tuple[str, str]]:
    repeats = 2 if quick else 5
    body_bytes = (1 << 18) if quick else (1 << 20) - 4096
    short, long = answers(body_bytes)
    cases = {
        "short events, llama-server chunks": framed(short, tiny=False),
        "short events, one-byte chunks": framed(short, tiny=True),
        "one long line, llama-server chunks": framed(long, tiny=False),
        "one long line, one-byte chunks": framed(long, tiny=True),
    }
    cpu = dict.fromkeys(cases, 0.0)
    for _ in range(repeats):  # alternate, so a burst of load falls on all of them
        for name, raw in cases.items():
            cpu[name] += one_call(raw) / repeats
    rows = [(f"tiny chunks: {name}, client CPU", f"{cpu[name] * 1e3:,.1f} ms") for name in cases]
    linear = cpu["one long line, one-byte chunks"] / cpu["short events, one-byte chunks"]
    tiny = cpu["short events, one-byte chunks"] / cpu["short events, llama-server chunks"]
    return [
        ("tiny chunks: body bytes per answer", f"{body_bytes:,}"),
        *rows,
        ("tiny chunks: long line / short events, both one-byte chunks (1.0: linear)", f"{linear:.2f}x"),
        ("tiny chunks: one-byte / llama-server chunks (the framing's own cost)", f"{tiny:.1f}x"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    report(lambda: run(args.quick))


if __name__ == "__main__":
    main()
