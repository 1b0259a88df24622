"""What is made ahead for the next request, on and off in one run: the socket of the next
connect (`SocketAhead`) and the next conversation id (`ConversationIds`). The first `Content` of
`Client.chat` and `AsyncClient.chat` through inferproxy against the fast local upstream
(`first_token_bench`), from clients that make the next one just after each request is written
and from clients that do not. Each round runs them all, and a raw request over direct TCP, in a
shuffled order, each after a pause (so on cold caches, as a request after a pause). Prints the
medians and, per flavour and per thing made ahead, what it changes (the first token, and the
request written).

Run: `.venv/bin/python bench/socket_ahead_bench.py [--quick]`.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from common import ROOT, cli

Row = tuple[str, str]
FLAVOURS = ("Client.chat", "AsyncClient.chat")


def run(quick: bool = False) -> list[Row]:
    sys.path.insert(0, str(ROOT / "src"))
    import first_token_bench as ft
    from adapters.uds_http.sockets import SocketAhead
    from app.conversation_ids import ConversationIds

    class NoneAhead(SocketAhead):
        """A transport's holder that never makes a socket ahead: every connect makes its own."""

        __slots__ = ()

        def refill(self) -> None:
            return None

    class NoIdAhead(ConversationIds):
        """Ids that are never made ahead: each request makes its own."""

        __slots__ = ()

        def refill(self) -> None:
            return None

    rounds, warmup = (60, 10) if quick else (200, 20)
    kinds = ("all made ahead", "no socket ahead", "no id ahead")
    paths = ["direct TCP", *(f"{f}, {kind}" for f in FLAVOURS for kind in kinds)]
    samples: dict[str, list[float]] = {path: [] for path in paths}
    written: dict[str, list[float]] = {path: [] for path in paths}
    with tempfile.TemporaryDirectory(prefix="socket-ahead-") as folder, ft.fast_upstream() as (port, upstream):
        socket_path = os.path.join(folder, "proxy.sock")
        with ft.inferproxy(socket_path, f"127.0.0.1:{port}"):
            marks = ft.Marks()
            ahead = ft.clients(socket_path, marks, model="bench", total_slots=2, n_ctx=4096)
            no_socket = ft.clients(socket_path, marks, model="bench", total_slots=2, n_ctx=4096)
            no_id = ft.clients(socket_path, marks, model="bench", total_slots=2, n_ctx=4096)
            for client in no_socket:
                client._llama._transport._ahead = NoneAhead()
            for client in no_id:
                client._llama._ids = NoIdAhead()
            clients: dict[str, Any] = {
                f"{FLAVOURS[i]}, {kind}": pair[i]
                for kind, pair in zip(kinds, (ahead, no_socket, no_id), strict=True)
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
                        start, at, first = ft.raw_first(direct, request())
                    else:
                        marks.reset()
                        if path.startswith("Async"):
                            start = runner.run(achat(clients[path]))
                        else:
                            start = ft.ns()
                            clients[path].chat(req, marks.on_event)
                        first, at = marks.first, marks.written
                    ft._stamps(upstream, "upstream")
                    if i >= warmup:
                        samples[path].append((first - start) / 1e6)
                        written[path].append((at - start) / 1e6)
                    time.sleep(ft.PAUSE_S)
            runner.close()
    median = {path: statistics.median(values) for path, values in samples.items()}
    wrote = {path: statistics.median(values) for path, values in written.items()}
    out: list[Row] = [("made ahead", f"first Content, fast upstream ({rounds} rounds, median ms)")]
    out += [(f"  {path}", f"{median[path]:.3f}") for path in paths]
    for flavour in FLAVOURS:
        mine = f"{flavour}, {kinds[0]}"
        for kind, what in ((kinds[1], "the socket"), (kinds[2], "the id")):
            other = f"{flavour}, {kind}"
            change, sooner = median[mine] - median[other], wrote[mine] - wrote[other]
            out.append((f"  {flavour}: {what} made ahead - not", f"{change:+.3f} ms (request written {sooner:+.3f})"))
    return out


if __name__ == "__main__":
    cli(run, __doc__)
