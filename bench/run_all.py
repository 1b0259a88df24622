"""`make bench`: every benchmark, side by side measurements in one run, printed as one table and
written to `bench/RESULTS.md` (the figures the docs point to: never edited by hand)."""

from __future__ import annotations

import importlib
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import print_table  # noqa: E402

SUITES = [
    ("proxy vs socat vs direct TCP", "proxy_bench"),
    ("SSE decoding vs httpx + httpx-sse", "decode_bench"),
    ("SSE decoding cost by chunking: a long line in 1-byte reads", "sse_cost_bench"),
    ("the whole client on one-byte HTTP chunks: a long line against short events", "tiny_chunks_bench"),
    ("peak memory of one stream under floods of tool calls and tiny deltas", "memory_bench"),
    ("client CPU per chunk vs openai-python", "client_bench"),
    ("async client vs sync client and AsyncOpenAI; 32 streams on one loop vs 32 threads", "async_bench"),
    ("asyncio reads of small chunks: loop.sock_recv vs streams", "aio_read_bench"),
    ("end to end against the real llama-server", "e2e_bench"),
    ("first token by path: direct TCP, inferproxy, the client; where the time goes", "first_token_bench"),
    ("first token with and without what is made ahead for the next request: its socket, its id", "socket_ahead_bench"),
    ("the client's own steps to the first token: the write's place in it, asyncio's wake", "client_steps_bench"),
    ("the cache prediction: its cost per turn and its error against the server's cache_n", "cache_bench"),
    ("more sessions than slots: reuse and first token, slot= vs sessions", "sessions_bench"),
    ("cancel latency per phase, cancel() to return", "cancel_bench"),
    ("4 and 8 sessions through a default proxy: refusals, retries", "sessions_conns_bench"),
]


def main() -> int:
    quick = "--quick" in sys.argv
    begun = time.monotonic()
    rows: list[tuple[str, str]] = []
    for title, module_name in SUITES:
        started = time.monotonic()
        print(f"running {module_name} ...", file=sys.stderr, flush=True)
        module = importlib.import_module(module_name)
        suite_rows = module.run(quick=quick)
        rows.append((f"== {title}", f"({time.monotonic() - started:.0f} s)"))
        rows.extend(suite_rows)
    print()
    print_table(rows)
    write_results(rows, quick=quick, took_s=time.monotonic() - begun)
    return 0


def write_results(rows: list[tuple[str, str]], *, quick: bool, took_s: float) -> None:
    """The table as `bench/RESULTS.md`: what ran, on what, when, and every row as printed."""
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    head = [
        "# Benchmark results",
        "",
        f"Written by `make bench`{' --quick' if quick else ''} on {time.strftime('%Y-%m-%d %H:%M %Z')}"
        f" ({machine}; {took_s / 60:.1f} min). Ratios are measured side by side in one run; absolute",
        "figures move with the machine's load. Do not edit: run `make bench` again.",
        "",
        "| what | figure |",
        "|---|---|",
    ]
    body = [f"| {name.replace('|', '/')} | {value.replace('|', '/')} |" for name, value in rows]
    (HERE / "RESULTS.md").write_text("\n".join([*head, *body, ""]), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
