"""What the benchmarks share: child processes that always stop, a recorded stream served by the
fake server in its own process, interleaved CPU and wall-clock timing, and the printed table.

Imported by name (`import common`): the benchmarks run as scripts from this folder, or from
`run_all.py`, which puts this folder on `sys.path`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
TRANSCRIPTS = ROOT / "tests" / "fixtures" / "transcripts"
READY_TIMEOUT_S = 10.0

Row = tuple[str, str]
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Child processes


@contextmanager
def process(
    argv: list[str], *, ready: Callable[[subprocess.Popen[str]], None], capture_stderr: bool = True
) -> Iterator[subprocess.Popen[str]]:
    """Run `argv` with `src/` importable; `ready` blocks until it serves (or raises). Always
    terminated on the way out, killed if it has not exited 5 s later, its pipes closed.
    `capture_stderr=False` leaves stderr on the console, for a child that may write more of it
    than a pipe nobody reads can hold."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    stderr = subprocess.PIPE if capture_stderr else None
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    try:
        ready(proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# ---------------------------------------------------------------------------------------------
# A llama-server stream, served verbatim


@dataclass(frozen=True)
class Stream:
    source: str
    raw: bytes
    events: int


def chunked_response(head: bytes, pieces: list[bytes]) -> bytes:
    """`head` and a chunked body of one HTTP chunk per piece (as llama-server writes one event per
    chunk), then the last chunk: a raw response for `fake_server`."""
    return head + b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def data_events(raw: bytes) -> int:
    """The `data:` events of a raw SSE response, `[DONE]` not counted."""
    return raw.count(b"data: ") - raw.count(b"data: [DONE]")


def recorded_stream() -> Stream | None:
    """The recorded 200 event stream under `tests/fixtures/transcripts/` with the most events."""
    best: Stream | None = None
    for raw_path in sorted(TRANSCRIPTS.glob("*/response.raw")):
        raw = raw_path.read_bytes()
        head, _, _ = raw.partition(b"\r\n\r\n")
        if b"text/event-stream" not in head.lower() or not head.startswith(b"HTTP/1.1 200"):
            continue
        events = data_events(raw)
        if best is None or events > best.events:
            best = Stream(str(raw_path.relative_to(ROOT)), raw, events)
    return best


@contextmanager
def fake_server(raw: bytes, *, prefix: str) -> Iterator[str]:
    """Serve `raw` for every chat request from the fake server's command line, in its own process
    so it never shares our GIL; yields the socket path once it serves."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        raw_path = os.path.join(folder, "response.raw")
        with open(raw_path, "wb") as handle:
            handle.write(raw)
        socket_path = os.path.join(folder, "llama.sock")
        # One piece per 64 KiB: the benchmarks measure the reader, not the server's pacing.
        command = [
            sys.executable,
            "-m",
            "adapters.fake_server",
            "--socket",
            socket_path,
            "--transcript",
            raw_path,
            "--piece-bytes",
            "65536",
        ]

        def ready(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            deadline = time.monotonic() + READY_TIMEOUT_S
            line = proc.stdout.readline()
            if not line.startswith("serving") or time.monotonic() > deadline:
                raise RuntimeError(f"fake server did not start: {line!r}")

        with process(command, ready=ready, capture_stderr=False):
            yield socket_path


# ---------------------------------------------------------------------------------------------
# Timing


def rounds_for(quick: bool) -> tuple[int, int]:
    """(rounds, warm-up rounds) of a stream benchmark."""
    return (10, 2) if quick else (40, 5)


@dataclass
class Timed(Generic[T]):
    """One stack's kept rounds: wall-clock and CPU seconds each, and what its last round returned."""

    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    last: T | None = None


def interleaved(stacks: Mapping[str, Callable[[], T]], rounds: int, warmup: int) -> dict[str, Timed[T]]:
    """Each round runs every stack once, in turn, so a burst of load elsewhere on the machine falls
    on all of them alike; the first `warmup` rounds are not kept. CPU is `time.thread_time` of this
    thread, the one that reads."""
    timed: dict[str, Timed[T]] = {name: Timed() for name in stacks}
    for index in range(warmup + rounds):
        for name, read_stream in stacks.items():
            wall = time.perf_counter()
            cpu = time.thread_time()
            result = read_stream()
            cpu = time.thread_time() - cpu
            wall = time.perf_counter() - wall
            if index >= warmup:
                timed[name].wall_s.append(wall)
                timed[name].cpu_s.append(cpu)
            timed[name].last = result
    return timed


@dataclass(frozen=True)
class StackResult:
    """One stack reading a stream of `events` data events: medians over the kept rounds."""

    name: str
    events: int
    wall_s: list[float]
    cpu_s: list[float]

    @property
    def events_per_s(self) -> float:
        return self.events / statistics.median(self.wall_s)

    @property
    def cpu_us_per_event(self) -> float:
        return statistics.median(self.cpu_s) / self.events * 1e6

    @property
    def wall_ms(self) -> float:
        return statistics.median(self.wall_s) * 1e3


# ---------------------------------------------------------------------------------------------
# The table


def print_table(table: list[Row]) -> None:
    width = max(len(name) for name, _ in table)
    for name, value in table:
        print(f"{name:<{width}}  {value}")


def cli(run: Callable[..., list[Row]], doc: str | None, quick: str = "fewer rounds") -> None:
    """A benchmark's command line: `--quick` (`quick` says what it leaves out), then its table."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args()
    report(lambda: run(quick=args.quick))


def report(produce: Callable[[], list[Row]]) -> None:
    """Print the rows `produce` returns, then how long that took."""
    started = time.monotonic()
    print_table(produce())
    print(f"(took {time.monotonic() - started:.1f} s)")
