"""Peak memory of one stream under a hostile server's floods, each in a child process of its own.

Each flood is a chat-completions stream fed to `domain.chat_stream.ChatStream` (SSE decoding,
JSON, assembler, liveness) in 64 KiB reads, built as it goes so the bytes on the wire are never
held whole. The limits are the config's defaults (`answer_bytes` 16 MiB). Reported per flood: the
peak RSS above the child's baseline (`ru_maxrss` after the imports and the first read), how the
stream ended, and the answer bytes the server sent.

    tool-call indexes   3,000,000 tool-call deltas, each with a new `index` and nothing else
    4-char deltas       2,000,000 content deltas of 4 ASCII characters (7.6 MiB), then the end
    past the cap        4-character content deltas until `answer_bytes` refuses them
    one wide character  as `4-char deltas`, the last delta an emoji (the answer's `str` then
                        takes 4 bytes a character: Python's widest string kind)

`--src PATH` imports the domain from another source tree (to compare with an older version).
Run: `.venv/bin/python bench/memory_bench.py [--quick] [--src PATH]`. `run(quick)` returns (name,
value) rows for a combined table. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import SRC, report

READ = 65536
FLOODS = ("tool-call indexes", "4-char deltas", "past the cap", "one wide character")
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'


def events(flood: str, quick: bool) -> Iterator[bytes]:
    scale = 10 if quick else 1
    if flood == "tool-call indexes":
        template = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":%d}]}}]}\n\n'
        for index in range(3_000_000 // scale):
            yield template % index
    elif flood in ("4-char deltas", "one wide character"):
        delta = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"abcd"}}]}\n\n'
        for _ in range(2_000_000 // scale - 1):
            yield delta
        yield delta.replace(b"abcd", "abc\U0001f422".encode()) if flood == "one wide character" else delta
    elif flood == "past the cap":
        delta = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"abcd"}}]}\n\n'
        while True:
            yield delta
    yield FINISH


def reads(flood: str, quick: bool) -> Iterator[bytes]:
    pending: list[bytes] = []
    size = 0
    for event in events(flood, quick):
        pending.append(event)
        size += len(event)
        if size >= READ:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def child(flood: str, quick: bool) -> dict[str, Any]:
    from app.config import parse_config
    from app.container import client_limits
    from domain.chat_stream import ChatStream
    from domain.completion import Completion
    from domain.errors import InferError

    config = parse_config({"socket": "/unused.sock"})  # the defaults, as the container reads them
    stream = ChatStream(client_limits(config).stream, config.limits.max_tokens, 0.0)
    source = reads(flood, quick)
    first = next(source)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome = "no end"
    sent = 0
    data: bytes | None = first
    while data is not None and outcome == "no end":
        sent += data.count(b'"content":"abcd"') * 4 + data.count(b'"content":"abc\xf0') * 7
        for step in stream.feed(data, 0.0):
            if isinstance(step, Completion):
                outcome = f"Completion ({len(step.content or '')} characters)"
            elif isinstance(step, InferError):
                outcome = f"{type(step).__name__}: {str(step)[:90]}"
        data = next(source, None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_kib": peak - baseline, "baseline_kib": baseline, "outcome": outcome, "sent": sent}


def run(quick: bool = False, src: Path = SRC) -> list[tuple[str, str]]:
    rows = [("memory: source", str(src))]
    for flood in FLOODS:
        argv = [sys.executable, __file__, "--child", flood, "--src", str(src)] + (["--quick"] if quick else [])
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=1800)
        got = json.loads(done.stdout)
        rows.append((f"memory: {flood}: peak RSS above baseline", f"{got['peak_kib'] / 1024:,.1f} MiB"))
        rows.append((f"memory: {flood}: answer bytes sent", f"{got['sent'] / (1 << 20):,.1f} MiB"))
        rows.append((f"memory: {flood}: outcome", got["outcome"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tenth of each flood")
    parser.add_argument("--src", type=Path, default=SRC, help="the source tree to import the domain from")
    parser.add_argument("--child", choices=FLOODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(args.src))
        print(json.dumps(child(args.child, args.quick)))
        return
    report(lambda: run(quick=args.quick, src=args.src))


if __name__ == "__main__":
    main()
