"""SSE decoding cost by chunking: is it linear in the bytes received, however they are split?

Pure domain, no sockets: `SseDecoder.feed` is called directly, and CPU is `time.thread_time`.

    long line, 1-byte chunks    one event whose data line is `--line-bytes` long (default
                                1 MiB - 64, under the default 1 MiB line cap), one byte per feed
    short lines, 1-byte chunks  the same number of bytes as 64-byte events, one byte per feed:
                                the same number of feed calls, so the ratio of the two is the
                                cost of a long unfinished line (1.0 when linear)
    long line, 64 KiB chunks    the long line in 64 KiB feeds: the cost per byte without the
                                per-call overhead
    whole events                llama-server's shape, one whole `data: ...` event per feed (the
                                fast path), and 8 events per feed (the general path): CPU per event
    many data lines             one event of 300,000 `data: x` lines in 64 KiB feeds: a run of
                                data lines is taken at once, so it costs about what one line does

`--src PATH` imports the decoder from another source tree (to compare with an older version).
Run: `.venv/bin/python bench/sse_cost_bench.py [--quick] [--src PATH] [--line-bytes N]`.
`run(quick)` returns (name, value) rows for a combined table. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import SRC, report

DEFAULT_LINE = (1 << 20) - 64
SHORT_LINE = 64
MANY_LINES = 300_000
EVENT = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" word"}}],"created":1758100000,'
    b'"id":"chatcmpl-Q7x2Q7x2Q7x2Q7x2Q7x2Q7x2Q7x2Q7x2","model":"test-model","object":"chat.completion.chunk",'
    b'"timings":{"cache_n":12,"prompt_n":31,"predicted_n":7,"predicted_ms":49.875}}\n\n'
)


def decoder_class(src: Path) -> Any:
    sys.path.insert(0, str(src))
    from domain.sse import SseDecoder

    return SseDecoder


def cpu(work: Callable[[], object], repeats: int) -> float:
    """The least CPU seconds of `repeats` runs of `work`."""
    best = []
    for _ in range(repeats):
        started = time.thread_time()
        work()
        best.append(time.thread_time() - started)
    return min(best)


def feeder(decoder_cls: Any, data: bytes, piece: int, max_line: int) -> Callable[[], int]:
    pieces = [data[i : i + piece] for i in range(0, len(data), piece)]

    def work() -> int:
        decoder = decoder_cls(max_line=max_line)
        count = 0
        for chunk in pieces:
            count += len(decoder.feed(chunk))
        return count

    return work


def long_line(size: int) -> bytes:
    return b"data: " + b"x" * (size - 6) + b"\n\n"


def short_lines(total: int) -> bytes:
    line = b"data: " + b"x" * (SHORT_LINE - 8) + b"\n\n"
    return line * (total // len(line)) + b"\n" * (total % len(line))


def run(quick: bool = False, src: Path = SRC, line_bytes: int = DEFAULT_LINE) -> list[tuple[str, str]]:
    cls = decoder_class(src)
    repeats = 2 if quick else 5
    max_line = max(line_bytes, 1 << 20)
    longest = long_line(line_bytes)
    shorts = short_lines(len(longest))
    long_tiny = cpu(feeder(cls, longest, 1, max_line), repeats)
    short_tiny = cpu(feeder(cls, shorts, 1, max_line), repeats)
    long_big = cpu(feeder(cls, longest, 65536, max_line), repeats)
    events = 5000
    whole = cpu(feeder(cls, EVENT * events, len(EVENT), max_line), repeats * 4)
    eight = cpu(feeder(cls, EVENT * events, len(EVENT) * 8, max_line), repeats * 4)
    many = b"data: x\n" * MANY_LINES + b"\n"
    many_lines = cpu(feeder(cls, many, 65536, max(max_line, 2 * MANY_LINES)), repeats)
    n = len(longest)
    return [
        ("sse cost: source", str(src)),
        ("sse cost: long line, 1-byte chunks", f"{n:,} bytes, {long_tiny * 1e3:,.1f} ms CPU"),
        ("sse cost: short lines, 1-byte chunks", f"{len(shorts):,} bytes, {short_tiny * 1e3:,.1f} ms CPU"),
        ("sse cost: long line / short lines, both 1-byte chunks", f"{long_tiny / short_tiny:.2f}x"),
        ("sse cost: long line, 64 KiB chunks", f"{long_big * 1e3:,.2f} ms CPU"),
        ("sse cost: long line, 1-byte / 64 KiB chunks, per byte", f"{long_tiny / max(long_big, 1e-9):,.0f}x"),
        ("sse cost: whole events, one per feed, CPU per event", f"{whole / events * 1e6:.3f} µs"),
        ("sse cost: whole events, 8 per feed, CPU per event", f"{eight / events * 1e6:.3f} µs"),
        (f"sse cost: one event of {MANY_LINES:,} data lines, 64 KiB chunks", f"{many_lines * 1e3:,.1f} ms CPU"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--src", type=Path, default=SRC, help="the source tree to import the decoder from")
    parser.add_argument("--line-bytes", type=int, default=DEFAULT_LINE, help="length of the long line")
    args = parser.parse_args()
    report(lambda: run(quick=args.quick, src=args.src, line_bytes=args.line_bytes))


if __name__ == "__main__":
    main()
