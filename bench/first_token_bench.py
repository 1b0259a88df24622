"""Where the first token's time goes: a new connection and a new call, side by side in one run.

Against an upstream that answers at once (its own process: a select loop that sends the head and
the first content event in one write as soon as the request is in), so the server's own jitter of
several ms does not hide the path's cost, and beside it the real llama-server. Every round runs
each path once, in an order shuffled anew (so no path always follows the same other or finds the
caches another left), each on a new connection:

    direct     raw request ── TCP ─────────────────────────── upstream
    proxy      raw request ── Unix socket ── inferproxy ── TCP ── upstream
    client     Client.chat ── Unix socket ── inferproxy ── TCP ── upstream
    aclient    AsyncClient.chat, likewise (one event loop for every round)
    stamped    raw request through a second inferproxy whose connections note the time of their
               accept, the request moved up, their threads' start and the answer ready to move back

A pause of `PAUSE_S` comes before each request, so each starts on cold caches, as a request
after a pause does. Each figure is the median over the rounds of the time from the start of the
request (the raw connect, or the call) to its first content byte (raw) or first `Content` event
(the client), with the middle half of the rounds (25th to 75th percentile) beside the main ones:
this machine's host is shared, and its quiet and busy spells move every figure. The client's
times are noted by a transport that wraps the real one (request written, response head); the
stamped proxy's by a subclass of its connection in that proxy's process. Every process reads
the same `CLOCK_MONOTONIC`, so their stamps compare.

Run: `.venv/bin/python bench/first_token_bench.py [--quick] [--fast-only]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import select
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import ROOT, TRANSCRIPTS, process, report

sys.path.insert(0, str(ROOT / "tests" / "device"))

ns = time.monotonic_ns
Row = tuple[str, str]
PAUSE_S = 0.003  # between two measurements: the last connection's threads wind down first
PROXY_LIMITS = ["--burst", "100000", "--rate", "100000"]  # the bench's connections never meet them
CHAT_PATH = "/v1/chat/completions"


# ---------------------------------------------------------------------------------------------
# The upstream that answers at once: one select loop, every connection answered as soon as its
# request is in. Stamps (accept, request complete) go to stdout, one line per connection.


def _response_parts() -> tuple[bytes, bytes]:
    """(head and the first content event, the rest) from the recorded plain answer."""
    raw = (TRANSCRIPTS / "plain_answer" / "response.raw").read_bytes()
    head, _, body = raw.partition(b"\r\n\r\n")
    chunks: list[bytes] = []
    rest = body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        chunks.append(b"%s\r\n%s\r\n" % (size_line, rest[:size]))
        rest = rest[size + 2 :]
    first = next(i for i, chunk in enumerate(chunks) if b'"content":"' in chunk)
    return head + b"\r\n\r\n" + chunks[first], b"".join(chunks[-3:])


def serve_fast_upstream() -> None:
    first, rest = _response_parts()
    server = socket.create_server(("127.0.0.1", 0), backlog=128)
    server.setblocking(False)
    print(server.getsockname()[1], flush=True)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, None)
    pending: dict[socket.socket, tuple[int, bytearray]] = {}
    while True:
        for key, _ in selector.select():
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    conn, _ = server.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn.setblocking(False)
                    pending[conn] = (ns(), bytearray())
                    selector.register(conn, selectors.EVENT_READ, conn)
                continue
            conn = key.data
            accepted, got = pending[conn]
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            got += data
            if data and not _request_complete(got):
                continue
            done = ns()
            selector.unregister(conn)
            del pending[conn]
            if data:
                conn.setblocking(True)
                with contextlib.suppress(OSError):
                    conn.sendall(first)
                    conn.sendall(rest)
            conn.close()
            if data:  # one line a request: a connection made ahead and dropped unused brings none
                print(f"upstream {accepted} {done}", flush=True)


def _request_complete(got: bytearray) -> bool:
    end = got.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = 0
    for line in bytes(got[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return len(got) >= end + 4 + length


# ---------------------------------------------------------------------------------------------
# The stamped proxy: the real accept loop, its connections noting four times each.


def serve_stamped_proxy(path: str, port: int) -> None:
    import adapters.proxy.server as server_module
    from adapters.proxy import Address, Proxy, ProxyLimits, StderrLog, bind_socket_file
    from adapters.proxy.connection import Connection

    class Stamped(Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.stamps: dict[str, int] = {}

        def _prepare(self) -> None:
            super()._prepare()
            self._down = self._stamping(self._down, "back")

        def _stamping(self, inner: Any, key: str) -> Any:
            def mover(src: socket.socket, dst: socket.socket) -> None:
                poller = select.poll()
                poller.register(src, select.POLLIN)
                poller.poll()
                self.stamps[key] = ns()
                inner(src, dst)

            return mover

        def take(self, client: socket.socket, first_byte_by: float) -> bool:
            self.stamps["accept"] = ns()
            return super().take(client, first_byte_by)

        def forward_first(self) -> None:  # (older proxies, without it, leave "taken" unstamped)
            super().forward_first()
            self.stamps["taken"] = ns()

        def wake(self) -> None:
            self.stamps["woken"] = ns()
            super().wake()

        def _forward(self) -> None:
            self.stamps["thread"] = ns()
            super()._forward()

        def _connect(self) -> socket.socket | None:
            sock = super()._connect()
            self.stamps["connected"] = ns()
            return sock

        def _run(self) -> None:
            try:
                super()._run()
            finally:
                s = self.stamps
                if s:
                    keys = ("accept", "taken", "woken", "thread", "connected", "back")
                    line = " ".join(str(s.get(k, 0)) for k in keys)
                    print(f"proxy {line}", flush=True)

    server_module.Connection = Stamped  # type: ignore[misc]
    log = StderrLog()
    limits = ProxyLimits(burst=100000, rate=100000.0)
    proxy = Proxy(bind_socket_file(path), Address("127.0.0.1", port), limits, log=log)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: proxy.stop())
    log(proxy.start_line)
    proxy.serve()


# ---------------------------------------------------------------------------------------------
# Processes


@contextmanager
def fast_upstream() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port: list[int] = []

    def ready(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        port.append(int(proc.stdout.readline()))

    with process([sys.executable, str(Path(__file__).resolve()), "--upstream"], ready=ready) as proc:
        yield port[0], proc


def _started(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "listening on" not in line:
        raise RuntimeError(f"inferproxy did not start: {line.strip()}")


@contextmanager
def inferproxy(path: str, upstream: str) -> Iterator[None]:
    argv = [sys.executable, "-m", "adapters.proxy", "--listen", path, "--upstream", upstream, *PROXY_LIMITS]
    with process(argv, ready=_started):
        yield


@contextmanager
def stamped_proxy(path: str, port: int) -> Iterator[subprocess.Popen[str]]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--stamped-proxy", path, str(port)]
    with process(argv, ready=_started) as proc:
        yield proc


def _stamps(proc: subprocess.Popen[str], kind: str) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != kind:
        raise RuntimeError(f"expected a {kind} stamp line, got {line!r}")
    return [int(value) for value in line[1:]]


# ---------------------------------------------------------------------------------------------
# One request each way


def raw_first(connect: Callable[[], socket.socket], request: bytes) -> tuple[int, int, int]:
    """(start, connected, first content byte) of one raw request, reading on to EOF."""
    start = ns()
    sock = connect()
    connected = ns()
    first = 0
    try:
        sock.sendall(request)
        seen = b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            if not first:
                seen += data
                if b'"content":"' in seen:
                    first = ns()
    finally:
        sock.close()
    if not first:
        raise RuntimeError("no content byte came")
    return start, connected, first


def _tcp(host: str, port: int) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    return connect


def _unix(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock

    return connect


class Marks:
    """The times one call reached each step, noted by the stamped transports and `on_event`."""

    def __init__(self) -> None:
        from domain.events import Content  # imported here, not in `on_event`: the call's own time

        self.written = self.head = self.first = 0
        self._content = Content

    def reset(self) -> None:
        self.written = self.head = self.first = 0

    def on_event(self, event: object) -> None:
        if not self.first and isinstance(event, self._content):
            self.first = ns()


def stamped_transports(socket_path: str, marks: Marks) -> tuple[Any, Any]:
    """A `UdsTransport` and an `AsyncUdsTransport` whose exchanges note when the request was
    written and the head arrived; reads go straight to the real exchange's `read`."""
    from adapters.uds_http._async.transport import AsyncUdsTransport
    from adapters.uds_http._sync.transport import UdsTransport
    from adapters.uds_http.sockets import SocketAhead
    from ports.transport import TimedOut

    class Ahead(SocketAhead):
        """The transport's socket made ahead, which it makes just after a request is written:
        the moment noted as the request written."""

        __slots__ = ()

        def refill(self) -> None:
            marks.written = marks.written or ns()
            super().refill()

    class Exchange:
        def __init__(self, inner: Any) -> None:
            self._inner = inner
            self.read = inner.read
            self.close = inner.close
            self.abort = inner.abort
            self.watch = inner.watch
            self.what = inner.what

        def head(self, timeout: float) -> Any:
            head = self._inner.head(timeout)
            if not isinstance(head, TimedOut) and not marks.head:
                marks.head = ns()
            return head

        def __enter__(self) -> Exchange:
            return self

        def __exit__(self, *exc: object) -> None:
            self._inner.close()

    class AsyncExchange(Exchange):
        async def head(self, timeout: float) -> Any:  # type: ignore[override]
            head = await self._inner.head(timeout)
            if not isinstance(head, TimedOut) and not marks.head:
                marks.head = ns()
            return head

        async def __aenter__(self) -> AsyncExchange:
            return self

        async def __aexit__(self, *exc: object) -> None:
            self._inner.close()

    class Transport(UdsTransport):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._ahead = Ahead()

        def open(self, *args: Any, **kwargs: Any) -> Any:
            exchange = super().open(*args, **kwargs)
            marks.written = marks.written or ns()
            return Exchange(exchange)

    class AsyncTransport(AsyncUdsTransport):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._ahead = Ahead()

        async def open(self, *args: Any, **kwargs: Any) -> Any:
            exchange = await super().open(*args, **kwargs)
            marks.written = marks.written or ns()
            return AsyncExchange(exchange)

    return Transport(socket_path, header_bytes=16384), AsyncTransport(socket_path, header_bytes=16384)


def clients(socket_path: str, marks: Marks, *, model: str, total_slots: int, n_ctx: int) -> tuple[Any, Any]:
    from app.config import parse_config
    from app.container import Container

    config = parse_config(
        {
            "proxy": {"burst": 1_000_000, "rate": 1_000_000},  # no accept limit to keep on this path
            "socket": socket_path,
            "model": model,
            "limits": {"max_tokens": 4},
            "sampling": {"temperature": 0.0, "seed": 42},
            "expect": {"chat_template_sha256": "0" * 64, "n_ctx": n_ctx, "total_slots": total_slots},
        }
    )
    sync_transport, async_transport = stamped_transports(socket_path, marks)
    container = Container(config=config)
    container.transport.override(sync_transport)
    container.async_transport.override(async_transport)
    return container.client(), container.async_client()


def request_bytes(client: Any) -> Callable[[], bytes]:
    """The bytes the client sends for the bench's request, each time under a new conversation id."""
    from adapters.uds_http.response import render
    from app.conversation_ids import new_conversation_id
    from domain.llama_api import CONVERSATION_HEADER

    body = client.render(bench_request())

    def request() -> bytes:
        return render("POST", CHAT_PATH, body, 16384, ((CONVERSATION_HEADER, new_conversation_id()),)).data

    return request


def bench_request() -> Any:
    from domain.messages import ChatRequest, SystemMessage, UserMessage

    return ChatRequest(
        slot=0,
        messages=[SystemMessage("You are a helpful assistant."), UserMessage("Name three colours of the rainbow.")],
    )


# ---------------------------------------------------------------------------------------------
# The rounds


class Samples:
    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, name: str, start: int, at: int) -> None:
        self.values.setdefault(name, []).append((at - start) / 1e6)

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])

    def spread(self, name: str) -> str:
        """The middle half of the values: 25th to 75th percentile."""
        low, _, high = statistics.quantiles(self.values[name], n=4)
        return f"{low:.2f}-{high:.2f}"


def measure(
    rounds: int,
    warmup: int,
    *,
    direct: Callable[[], socket.socket],
    proxied: Callable[[], socket.socket],
    stamped: Callable[[], socket.socket] | None,
    stamped_proc: subprocess.Popen[str] | None,
    upstream_proc: subprocess.Popen[str] | None,
    client: Any,
    aclient: Any,
    marks: Marks,
    request: Callable[[], bytes],
) -> Samples:
    """Every round runs each path once, in an order shuffled anew (seeded): no path always
    comes first, after the same other, or onto the caches another left."""
    samples = Samples()
    req = bench_request()
    runner = asyncio.Runner()
    order = random.Random(20261201)

    async def achat() -> int:
        start = ns()
        await aclient.chat(req, marks.on_event)
        return start

    def upstream_line() -> list[int]:
        return _stamps(upstream_proc, "upstream") if upstream_proc is not None else []

    def raw(name: str, connect: Callable[[], socket.socket], keep: bool) -> None:
        start, connected, first = raw_first(connect, request())
        upstream_line()
        if keep:
            samples.add(name, start, first)
            samples.add(f"{name} connect", start, connected)

    def call(name: str, keep: bool) -> None:
        marks.reset()
        if name == "client":
            start = ns()
            client.chat(req, marks.on_event)
        else:
            start = runner.run(achat())
        upstream_line()
        if keep:
            samples.add(name, start, marks.first)
            samples.add(f"{name} written", start, marks.written)
            samples.add(f"{name} head", start, marks.head)

    def stamped_raw(keep: bool) -> None:
        assert stamped is not None and stamped_proc is not None
        start, connected, first = raw_first(stamped, request())
        up = upstream_line()
        accept, taken, woken, thread, linked, fwd_back = _stamps(stamped_proc, "proxy")
        if not keep:
            return
        samples.add("stamped", start, first)
        for name, at in (
            ("stamped connect", connected),
            ("stamped accept", accept),
            ("stamped taken", taken),
            ("stamped woken", woken),
            ("stamped thread", thread),
            ("stamped upstream connected", linked),
            ("stamped back ready", fwd_back),
        ):
            if at > start:  # a step this request took (a connection made ahead was connected before it)
                samples.add(name, start, at)
        if up and up[0] > start:  # accepted for this request, not ahead of it
            samples.add("stamped upstream accepted", start, up[0])
        if up:
            samples.add("stamped upstream request in", start, up[1])

    paths: list[Callable[[bool], None]] = [
        lambda keep: raw("direct", direct, keep),
        lambda keep: raw("proxy", proxied, keep),
        lambda keep: call("client", keep),
        lambda keep: call("aclient", keep),
    ]
    if stamped is not None and stamped_proc is not None:
        paths.append(stamped_raw)
    try:
        for index in range(warmup + rounds):
            for path in order.sample(paths, len(paths)):
                path(index >= warmup)
                time.sleep(PAUSE_S)
    finally:
        runner.close()
    return samples


STAMPS = [  # the stamped proxy's times, in order, and what each is
    ("stamped connect", "the client's connect returned"),
    ("stamped accept", "accepted, handed to the spare"),
    ("stamped taken", "what the client sent moved up the connection made ahead"),
    ("stamped woken", "its threads woken"),
    ("stamped thread", "its first thread running (for a request moved whole: once the client closes)"),
    ("stamped upstream accepted", "the upstream accepted a connection made now (none ready)"),
    ("stamped upstream connected", "the first thread saw it connected"),
    ("stamped upstream request in", "the upstream has the whole request"),
    ("stamped back ready", "the answer ready to move back"),
    ("stamped", "the client has the first content byte"),
]


def rows(samples: Samples, label: str, rounds: int) -> list[Row]:
    m = samples.median
    direct, proxy, client, aclient = m("direct"), m("proxy"), m("client"), m("aclient")
    connects = f"{m('direct connect'):.3f} / {m('proxy connect'):.3f}"
    q = samples.spread
    out: list[Row] = [
        (f"first token, {label} ({rounds} rounds, median ms from the start; middle half)", ""),
        ("  direct TCP, raw request", f"{direct:.2f} ({q('direct')})"),
        ("  raw request through inferproxy", f"{proxy:.2f} ({proxy - direct:+.2f} over direct; {q('proxy')})"),
        ("  Client.chat through inferproxy", f"{client:.2f} ({client - direct:+.2f}; {q('client')})"),
        ("  AsyncClient.chat through inferproxy", f"{aclient:.2f} ({aclient - direct:+.2f}; {q('aclient')})"),
        ("  the proxy's part: raw through it - direct (goal <= 0.2)", f"{proxy - direct:.2f}"),
        (
            "  the client's part: the client - raw, through the proxy (goal <= 0.3)",
            f"{client - proxy:.2f} (asyncio {aclient - proxy:.2f})",
        ),
        ("  client overhead over direct (goal <= 0.5)", f"{client - direct:.2f} (asyncio {aclient - direct:.2f})"),
        ("  connect returned: direct TCP / the proxy's socket", connects),
    ]
    for name, title in (("client", "Client"), ("aclient", "AsyncClient")):
        out.append(
            (
                f"  {title}: request written / response head / first Content",
                f"{m(f'{name} written'):.3f} / {m(f'{name} head'):.3f} / {m(name):.3f}",
            )
        )
    if "stamped" in samples.values:
        out.append((f"  inside a stamped proxy, a raw request ({m('stamped'):.2f} in all):", ""))
        for key, what in STAMPS:
            if key in samples.values:
                out.append((f"    {what}", f"{m(key):.3f}"))
    return out


def run_fast(rounds: int, warmup: int) -> list[Row]:
    from domain.completion import Timings  # noqa: F401 - src importable

    with tempfile.TemporaryDirectory(prefix="first-token-") as folder, fast_upstream() as (port, upstream):
        proxy_path = os.path.join(folder, "proxy.sock")
        stamped_path = os.path.join(folder, "stamped.sock")
        with inferproxy(proxy_path, f"127.0.0.1:{port}"), stamped_proxy(stamped_path, port) as stamped:
            marks = Marks()
            client, aclient = clients(proxy_path, marks, model="test-model", total_slots=2, n_ctx=4096)
            samples = measure(
                rounds,
                warmup,
                direct=_tcp("127.0.0.1", port),
                proxied=_unix(proxy_path),
                stamped=_unix(stamped_path),
                stamped_proc=stamped,
                upstream_proc=upstream,
                client=client,
                aclient=aclient,
                marks=marks,
                request=request_bytes(client),
            )
    return rows(samples, "fast upstream", rounds)


def run_real(rounds: int, warmup: int) -> list[Row]:
    import llama

    with (
        tempfile.TemporaryDirectory(prefix="first-token-") as folder,
        llama.start_server("tools") as server,
    ):
        proxy_path = os.path.join(folder, "proxy.sock")
        stamped_path = os.path.join(folder, "stamped.sock")
        with inferproxy(proxy_path, f"{server.host}:{server.port}"), stamped_proxy(stamped_path, server.port) as sp:
            marks = Marks()
            client, aclient = clients(
                proxy_path, marks, model=llama.ALIAS, total_slots=llama.SLOTS, n_ctx=llama.SLOT_CONTEXT
            )
            samples = measure(
                rounds,
                warmup,
                direct=_tcp(server.host, server.port),
                proxied=_unix(proxy_path),
                stamped=_unix(stamped_path),
                stamped_proc=sp,
                upstream_proc=None,
                client=client,
                aclient=aclient,
                marks=marks,
                request=request_bytes(client),
            )
    return rows(samples, "llama-server", rounds)


def run(quick: bool = False, fast_only: bool = False) -> list[Row]:
    rounds, warmup = (40, 10) if quick else (200, 20)
    out = run_fast(rounds, warmup)
    if not fast_only:
        out += run_real(max(rounds // 2, 20) if quick else 100, 10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--fast-only", action="store_true", help="leave out the real server")
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stamped-proxy", nargs=2, metavar=("PATH", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        serve_fast_upstream()
        return
    if args.stamped_proxy:
        serve_stamped_proxy(args.stamped_proxy[0], int(args.stamped_proxy[1]))
        return
    sys.path.insert(0, str(ROOT / "src"))
    report(lambda: run(quick=args.quick, fast_only=args.fast_only))


if __name__ == "__main__":
    main()
