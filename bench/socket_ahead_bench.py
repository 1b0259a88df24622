"""The socket made ahead for the next connect (`SocketAhead`), on and off in one run: the first
`Content` of `Client.chat` and `AsyncClient.chat` through inferproxy against the fast local
upstream (`first_token_bench`), from clients whose transport makes the next connect's socket
just after each request is written and from clients whose transport does not. Each round runs
the four, and a raw request over direct TCP, in a shuffled order, each after a pause (so on cold
caches, as a request after a pause). Prints the medians and, per flavour, what the socket made
ahead changes.

Run: `.venv/bin/python bench/socket_ahead_bench.py [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from common import ROOT, report

Row = tuple[str, str]
FLAVOURS = ("Client.chat", "AsyncClient.chat")


def run(quick: bool = False) -> list[Row]:
    sys.path.insert(0, str(ROOT / "src"))
    import first_token_bench as ft
    from adapters.uds_http.sockets import SocketAhead

    class NoneAhead(SocketAhead):
        """A transport's holder that never makes a socket ahead: every connect makes its own."""

        __slots__ = ()

        def refill(self) -> None:
            return None

    rounds, warmup = (60, 10) if quick else (200, 20)
    paths = ["direct TCP", *(f"{f}, {kind}" for f in FLAVOURS for kind in ("socket made ahead", "none ahead"))]
    samples: dict[str, list[float]] = {path: [] for path in paths}
    with tempfile.TemporaryDirectory(prefix="socket-ahead-") as folder, ft.fast_upstream() as (port, upstream):
        socket_path = os.path.join(folder, "proxy.sock")
        with ft.inferproxy(socket_path, f"127.0.0.1:{port}"):
            marks = ft.Marks()
            ahead = ft.clients(socket_path, marks, model="bench", total_slots=2, n_ctx=4096)
            none = ft.clients(socket_path, marks, model="bench", total_slots=2, n_ctx=4096)
            for client in none:
                client._llama._transport._ahead = NoneAhead()
            clients: dict[str, Any] = {
                f"{FLAVOURS[i]}, {kind}": pair[i]
                for kind, pair in (("socket made ahead", ahead), ("none ahead", none))
                for i in range(2)
            }
            request = ft.request_bytes(ahead[0])
            direct = ft._tcp("127.0.0.1", port)
            req = ft.bench_request()
            runner = asyncio.Runner()
            order = random.Random(20261201)

            async def achat(client: Any) -> int:
                start = ft.ns()
                await client.chat(req, marks.on_event)
                return start

            for i in range(warmup + rounds):
                for path in order.sample(paths, len(paths)):
                    if path == "direct TCP":
                        start, _, first = ft.raw_first(direct, request())
                    else:
                        marks.reset()
                        if path.startswith("Async"):
                            start = runner.run(achat(clients[path]))
                        else:
                            start = ft.ns()
                            clients[path].chat(req, marks.on_event)
                        first = marks.first
                    ft._stamps(upstream, "upstream")
                    if i >= warmup:
                        samples[path].append((first - start) / 1e6)
                    time.sleep(ft.PAUSE_S)
            runner.close()
    median = {path: statistics.median(values) for path, values in samples.items()}
    out: list[Row] = [("socket made ahead", f"first Content, fast upstream ({rounds} rounds, median ms)")]
    out += [(f"  {path}", f"{median[path]:.3f}") for path in paths]
    for flavour in FLAVOURS:
        change = median[f"{flavour}, socket made ahead"] - median[f"{flavour}, none ahead"]
        out.append((f"  {flavour}: made ahead - none ahead", f"{change:+.3f} ms"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    report(lambda: run(quick=args.quick))


if __name__ == "__main__":
    main()
