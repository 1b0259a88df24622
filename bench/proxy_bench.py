"""inferproxy against socat and a direct TCP connection, side by side, in one run.

All three paths end at the same local TCP echo server (a separate process):

    direct   client ── TCP ───────────────────────────────── echo
    socat    client ── Unix socket ── socat (fork) ── TCP ── echo
    proxy    client ── Unix socket ── inferproxy ──── TCP ── echo

Measured per path: a 200-byte ping-pong on one open connection (p50, p99 round trip; the gain
over direct is what a message pays to cross the forwarder, as an SSE event does) and bulk
throughput (64 MiB sent and echoed back at once; payload MB/s one way). Goals: the proxy adds at
most socat's p50 latency and moves at least 1.5x socat's throughput. The ping-pong runs twice:
across the machine's cores, as the scheduler places each process, and with every process pinned
to one core, where a round trip's wake of another core (25 to 30 µs each on some virtual
machines, and as many as the placement makes) is out of the figure and what is left is the
forwarder's own cost per message.

Run: `.venv/bin/python bench/proxy_bench.py [--quick]`. `run(quick)` returns (name, value) rows
for a combined table. socat is installed from Debian's packages if missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import READY_TIMEOUT_S, process, report

MESSAGE_BYTES = 200
LATENCY_WARMUP = 100
BULK_PIECE = 1024 * 1024


@dataclass(frozen=True)
class PathResult:
    name: str
    p50_us: float
    p99_us: float
    mb_per_s: float


# ---------------------------------------------------------------------------------------------
# The echo server: its own process, one thread per connection, pages moved with splice so it
# is never the bottleneck of any path.


def serve_echo() -> None:
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    print(server.getsockname()[1], flush=True)

    def echo(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        read_end, write_end = os.pipe()
        try:
            fd = conn.fileno()
            while True:
                n = os.splice(fd, write_end, BULK_PIECE)
                if not n:
                    break
                while n:
                    n -= os.splice(read_end, fd, n)
        except OSError:
            pass
        finally:
            os.close(read_end)
            os.close(write_end)
            conn.close()

    while True:
        conn, _ = server.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


# ---------------------------------------------------------------------------------------------
# Processes


@contextmanager
def echo_server() -> Iterator[int]:
    port: list[int] = []

    def ready(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        port.append(int(proc.stdout.readline()))

    with process([sys.executable, str(Path(__file__).resolve()), "--echo"], ready=ready):
        yield port[0]


def _wait_for_socket(path: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            return
        except OSError:
            time.sleep(0.01)
        finally:
            probe.close()
    raise RuntimeError(f"nothing listens on {path}")


@contextmanager
def socat_forwarder(path: str, port: int) -> Iterator[None]:
    socat = ensure_socat()
    argv = [socat, f"UNIX-LISTEN:{path},fork", f"TCP:127.0.0.1:{port}"]
    with process(argv, ready=lambda proc: _wait_for_socket(path, proc)):
        yield


@contextmanager
def inferproxy(path: str, port: int) -> Iterator[None]:
    # The limits are lifted so the readiness probe and the bench's connections never meet them.
    argv = [
        sys.executable,
        "-m",
        "adapters.proxy",
        "--listen",
        path,
        "--upstream",
        f"127.0.0.1:{port}",
        "--burst",
        "1000",
        "--rate",
        "1000",
    ]

    def ready(proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        if "listening on" not in line:
            raise RuntimeError(f"inferproxy did not start: {line.strip()}")

    with process(argv, ready=ready):
        yield


def ensure_socat() -> str:
    found = shutil.which("socat")
    if found:
        return found
    print("installing socat from Debian's packages ...", file=sys.stderr, flush=True)
    if subprocess.run(["apt-get", "install", "-y", "-qq", "socat"], capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "socat"], check=True, capture_output=True)
    found = shutil.which("socat")
    if not found:
        raise RuntimeError("socat is not installed and could not be installed")
    return found


# ---------------------------------------------------------------------------------------------
# Measurements


def _recv_exactly(sock: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if not n:
            raise RuntimeError("the echo closed early")
        got += n


def ping_pong(connect: Callable[[], socket.socket], rounds: int) -> list[int]:
    """Round trips in nanoseconds of a 200-byte message on one open connection."""
    message = os.urandom(MESSAGE_BYTES)
    reply = bytearray(MESSAGE_BYTES)
    view = memoryview(reply)
    samples: list[int] = []
    with connect() as sock:
        for i in range(LATENCY_WARMUP + rounds):
            start = time.perf_counter_ns()
            sock.sendall(message)
            _recv_exactly(sock, view)
            elapsed = time.perf_counter_ns() - start
            if i >= LATENCY_WARMUP:
                samples.append(elapsed)
            if reply != message:
                raise RuntimeError("the echo changed the message")
    return samples


def bulk(connect: Callable[[], socket.socket], total: int) -> float:
    """Send `total` bytes and read them back at the same time; payload MB/s one way."""
    block = os.urandom(BULK_PIECE)
    buf = bytearray(BULK_PIECE)
    failure: list[BaseException] = []
    with connect() as sock:

        def send() -> None:
            try:
                sent = 0
                while sent < total:
                    piece = min(BULK_PIECE, total - sent)
                    sock.sendall(memoryview(block)[:piece])
                    sent += piece
            except BaseException as exc:
                failure.append(exc)

        start = time.perf_counter()
        sender = threading.Thread(target=send, name="bench-sender")
        sender.start()
        try:
            got = 0
            while got < total:
                n = sock.recv_into(buf)
                if not n:
                    raise RuntimeError(f"the echo closed after {got} of {total} bytes")
                got += n
            elapsed = time.perf_counter() - start
        finally:
            sender.join()
    if failure:
        raise RuntimeError(f"sending failed: {failure[0]}")
    return total / elapsed / 1e6


def _tcp(port: int) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    return connect


def _unix(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock

    return connect


def measure(paths: dict[str, Callable[[], socket.socket]], reps: int, rounds: int, total: int) -> list[PathResult]:
    """Interleave the paths rep by rep, so a burst of load elsewhere on the machine falls on all
    of them alike. p50 and throughput are the medians of the reps; p99 is over all samples."""
    samples: dict[str, list[int]] = {name: [] for name in paths}
    p50s: dict[str, list[float]] = {name: [] for name in paths}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(reps):
        for name, connect in paths.items():
            round_trips = ping_pong(connect, rounds)
            samples[name].extend(round_trips)
            p50s[name].append(statistics.median(round_trips) / 1000)
            rates[name].append(bulk(connect, total))
    results = []
    for name in paths:
        p99 = statistics.quantiles(samples[name], n=100, method="inclusive")[98] / 1000
        results.append(PathResult(name, statistics.median(p50s[name]), p99, statistics.median(rates[name])))
    return results


def run(quick: bool = False) -> list[tuple[str, str]]:
    reps = 3 if quick else 9
    rounds = 1000 if quick else 2000
    total = (16 if quick else 64) * 1024 * 1024
    results = _measure_all(reps, rounds, total)
    return rows(results, total) + one_core_rows(quick)


def _measure_all(reps: int, rounds: int, total: int) -> list[PathResult]:
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as folder, echo_server() as port:
        socat_path = os.path.join(folder, "socat.sock")
        proxy_path = os.path.join(folder, "proxy.sock")
        with socat_forwarder(socat_path, port), inferproxy(proxy_path, port):
            paths = {"direct": _tcp(port), "socat": _unix(socat_path), "inferproxy": _unix(proxy_path)}
            return measure(paths, reps, rounds, total)


def one_core_rows(quick: bool) -> list[tuple[str, str]]:
    """The ping-pong again with every process on one core, in a child pinned before it starts
    them: a message's wake of another core (tens of µs on some hosts, and where the scheduler
    puts each thread decides how many a round trip takes) is then out of the figure, which is
    left with what the forwarder itself costs a message."""
    if not hasattr(os, "sched_setaffinity"):
        return [("proxy, one core", "n/a (no sched_setaffinity here)")]
    argv = [sys.executable, str(Path(__file__).resolve()), "--one-core"] + (["--quick"] if quick else [])
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    p50 = dict(zip(("direct", "socat", "inferproxy"), map(float, done.stdout.split()), strict=True))
    socat_added, proxy_added = p50["socat"] - p50["direct"], p50["inferproxy"] - p50["direct"]
    ratio = f"{proxy_added / socat_added:.2f}x" if socat_added > 0 else "n/a (socat added nothing)"
    out = [(f"proxy, one core: {name} ping-pong p50", f"{value:.1f} µs") for name, value in p50.items()]
    out.append(
        (
            "proxy, one core: added p50, inferproxy / socat (goal <= 1)",
            f"{ratio} ({proxy_added:.1f} / {socat_added:.1f} µs)",
        )
    )
    return out


def _one_core(quick: bool) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the echo, socat and inferproxy inherit it
    results = _measure_all(3 if quick else 9, 1000 if quick else 2000, 1024 * 1024)
    print(" ".join(f"{r.p50_us:.2f}" for r in results))


def rows(results: list[PathResult], total: int) -> list[tuple[str, str]]:
    direct, socat, proxy = results
    out: list[tuple[str, str]] = []
    for r in results:
        out.append((f"proxy: {r.name} ping-pong p50 / p99", f"{r.p50_us:.0f} / {r.p99_us:.0f} µs"))
    for r in results[1:]:
        out.append((f"proxy: {r.name} added p50 over direct", f"{r.p50_us - direct.p50_us:.0f} µs"))
    socat_added = socat.p50_us - direct.p50_us
    proxy_added = proxy.p50_us - direct.p50_us
    ratio = f"{proxy_added / socat_added:.2f}x" if socat_added > 0 else "n/a (socat added nothing)"
    out.append(("proxy: added p50, inferproxy / socat (goal <= 1)", ratio))
    out.append(("proxy: p50, inferproxy / direct", f"{proxy.p50_us / direct.p50_us:.2f}x"))
    for r in results:
        out.append((f"proxy: {r.name} bulk {total >> 20} MiB through and back", f"{r.mb_per_s:.0f} MB/s"))
    out.append(("proxy: throughput, inferproxy / socat (goal >= 1.5)", f"{proxy.mb_per_s / socat.mb_per_s:.2f}x"))
    out.append(("proxy: throughput, inferproxy / direct", f"{proxy.mb_per_s / direct.mb_per_s:.2f}x"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and 16 MiB of bulk")
    parser.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one-core", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo:
        serve_echo()
        return
    if args.one_core:
        _one_core(args.quick)
        return
    report(lambda: run(quick=args.quick))


if __name__ == "__main__":
    main()
