"""The client's own steps to the first token, against the fast local upstream through inferproxy
(`first_token_bench`), in one run:

- how the request's write comes into the first token: `Client.chat` as it is, with 50 µs of
  busy work added just before its request is written, and with the same just after (each round
  runs the three in a shuffled order, each after a pause, so on cold caches as a request after a
  pause). Work before the write that the first token absorbs is hidden (the proxy's accept runs
  meanwhile); work it does not absorb shows whole.
- where the time goes from the response's bytes to the task on asyncio: the times, from the call's
  start, of the request written, the bytes received (the blocking read returning; on asyncio, the
  selector returning them to the loop and the socket's reader callback), the response head and
  the first `Content`, for both flavours. The stamps are taken by wrappers around the loop's
  selector and the streams' reads (the bench's own, a few µs each).

Run: `.venv/bin/python bench/client_steps_bench.py [--quick]`.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from common import ROOT, cli

Row = tuple[str, str]
DELAY_S = 50e-6
VARIANTS = ("as it is", "50 µs before the write", "50 µs after the write")


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def delayed_open(transport: Any, where: list[str]) -> None:
    """`transport.open` with `DELAY_S` of busy work before or after its request is written, as
    `where[0]` says (one of `VARIANTS`)."""
    inner: Callable[..., Any] = transport.open

    def open_(*args: Any, **kwargs: Any) -> Any:
        if where[0] == VARIANTS[1]:
            spin(DELAY_S)
        exchange = inner(*args, **kwargs)
        if where[0] == VARIANTS[2]:
            spin(DELAY_S)
        return exchange

    transport.open = open_


def run(quick: bool = False) -> list[Row]:
    sys.path.insert(0, str(ROOT / "src"))
    import first_token_bench as ft
    from adapters.uds_http import sockets

    rounds, warmup = (60, 10) if quick else (200, 20)
    ns = ft.ns
    received: list[int] = []  # the bytes received by the read waiting for the head
    selected: list[int] = []  # asyncio: the selector returned events with a timeout (a wait)
    readable: list[int] = []  # asyncio: the socket's reader callback ran

    sync_recv = sockets.SocketStream.recv
    async_readable = sockets.AsyncSocketStream._readable

    def recv(self: Any, max_bytes: int, timeout: float) -> Any:
        data = sync_recv(self, max_bytes, timeout)
        if not received:
            received.append(ns())
        return data

    def on_readable(self: Any) -> None:
        if not readable:
            readable.append(ns())
        async_readable(self)

    samples: dict[str, list[float]] = {}

    def add(name: str, start: int, at: int) -> None:
        if at:
            samples.setdefault(name, []).append((at - start) / 1e6)

    with tempfile.TemporaryDirectory(prefix="client-steps-") as folder, ft.fast_upstream() as (port, upstream):
        socket_path = os.path.join(folder, "proxy.sock")
        with ft.inferproxy(socket_path, f"127.0.0.1:{port}"):
            marks = ft.Marks()
            client, aclient = ft.clients(socket_path, marks, model="bench", total_slots=2, n_ctx=4096)
            where = [VARIANTS[0]]
            delayed_open(client._llama._transport, where)
            req = ft.bench_request()
            runner = asyncio.Runner()
            loop = runner.get_loop()
            selector = getattr(loop, "_selector", None)  # the default loop's (a bench's wrapper only)
            if selector is not None:
                select = selector.select

                def selecting(timeout: float | None = None) -> Any:
                    events = select(timeout)
                    if events and timeout != 0 and not selected:
                        selected.append(ns())
                    return events

                selector.select = selecting
            sockets.SocketStream.recv = recv  # type: ignore[method-assign]
            sockets.AsyncSocketStream._readable = on_readable  # type: ignore[method-assign]

            async def achat() -> int:
                start = ns()
                await aclient.chat(req, marks.on_event)
                return start

            paths = [*VARIANTS, "asyncio"]
            order = random.Random(20261202)
            try:
                for i in range(warmup + rounds):
                    for path in order.sample(paths, len(paths)):
                        marks.reset()
                        received.clear()
                        selected.clear()
                        readable.clear()
                        if path == "asyncio":
                            start = runner.run(achat())
                        else:
                            where[0] = path
                            start = ns()
                            client.chat(req, marks.on_event)
                        ft._stamps(upstream, "upstream")
                        if i >= warmup:
                            add(f"{path} first", start, marks.first)
                            if path in (VARIANTS[0], "asyncio"):
                                add(f"{path} written", start, marks.written)
                                add(f"{path} received", start, received[0] if received else 0)
                                add(f"{path} selected", start, selected[0] if selected else 0)
                                add(f"{path} readable", start, readable[0] if readable else 0)
                                add(f"{path} head", start, marks.head)
                        time.sleep(ft.PAUSE_S)
            finally:
                runner.close()
                sockets.SocketStream.recv = sync_recv  # type: ignore[method-assign]
                sockets.AsyncSocketStream._readable = async_readable  # type: ignore[method-assign]
    m = {name: statistics.median(values) for name, values in samples.items()}
    out: list[Row] = [(f"the request's write in the first token ({rounds} rounds, median ms)", "")]
    for variant in VARIANTS:
        change = m[f"{variant} first"] - m[f"{VARIANTS[0]} first"]
        out.append((f"  Client.chat, {variant}", f"{m[f'{variant} first']:.3f} ({change * 1000:+.0f} µs)"))
    out.append(("the client's steps, from the call's start (median ms)", ""))
    sync, aio = VARIANTS[0], "asyncio"
    steps = [
        ("Client.chat", sync, ("written", "received", "head", "first")),
        ("AsyncClient.chat", aio, ("written", "selected", "readable", "head", "first")),
    ]
    for title, path, names in steps:
        shown = [f"{name} {m[f'{path} {name}']:.3f}" for name in names if f"{path} {name}" in m]
        out.append((f"  {title}", " / ".join(shown)))
    if f"{aio} selected" in m:
        wake = (m[f"{aio} head"] - m[f"{aio} selected"]) * 1000
        read = (m[f"{sync} head"] - m[f"{sync} received"]) * 1000
        out.append(
            ("  the bytes to the head: asyncio from the selector's return; sync", f"{wake:.0f} µs; {read:.0f} µs")
        )
    return out


if __name__ == "__main__":
    cli(run, __doc__)
