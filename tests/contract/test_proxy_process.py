"""`python -m adapters.proxy` as a process: its lines, its socket file and lock, its signals, its
exit codes, and how it holds up under a connect flood and a stderr that nobody reads.

Every process started here is terminated, and killed if need be, before the test ends. Floods are
bounded in count and time and knock only on the proxy's own Unix socket.
"""

import os
import re
import select
import selectors
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.proxy.options import Address
from adapters.proxy.testing import (
    LoopbackUpstream,
    black_hole,
    echo,
    fill_pipe,
    knock,
    pending_connects,
    unused_port,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")


def read_line(proc: "subprocess.Popen[bytes]", timeout: float = 5.0) -> str:
    """One line of the process's stderr, or fail after `timeout` instead of hanging."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    line = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise AssertionError(f"no line from the proxy within {timeout} s (so far {line!r})")
            byte = os.read(fd, 1)
            if not byte:
                break
            line += byte
    return line.decode()


@contextmanager
def proxy_process(*args: str) -> Iterator["subprocess.Popen[bytes]"]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapters.proxy", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


@contextmanager
def started_proxy(path: Path, upstream: Address, *extra: str) -> Iterator["subprocess.Popen[bytes]"]:
    with proxy_process("--listen", str(path), "--upstream", str(upstream), *extra) as proc:
        line = read_line(proc)
        assert line.startswith("inferproxy: listening on "), line
        yield proc


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.settimeout(5)
    return sock


def finish(proc: "subprocess.Popen[bytes]", timeout: float = 5.0) -> tuple[int, str]:
    """Exit status and the rest of stderr."""
    returncode = proc.wait(timeout)
    assert proc.stderr is not None
    return returncode, proc.stderr.read().decode()


def test_prints_one_start_line_naming_the_socket_the_upstream_and_the_limits_and_nothing_about_traffic(
    tmp_path: Path,
) -> None:
    path = tmp_path / "infer.sock"
    with (
        LoopbackUpstream(echo) as upstream,
        proxy_process("--listen", str(path), "--upstream", str(upstream.address)) as proc,
    ):
        assert read_line(proc) == (
            f"inferproxy: listening on {path}, forwarding to {upstream.address}; "
            "at most 8 connections, accept burst 10, refill 2/s, first byte within 10 s\n"
        )
        with connect(path) as client:
            client.sendall(b"GET /props")
            assert client.recv(100) == b"GET /props"
        proc.send_signal(signal.SIGTERM)
        status, rest = finish(proc)
        assert proc.stdout is not None
        stdout = proc.stdout.read()
    assert (status, rest, stdout) == (0, "", b"")


def test_the_socket_file_has_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with started_proxy(path, unused_port()):
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600


STOP_SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
STOP_SIGNAL_IDS = ["SIGTERM", "SIGHUP", "SIGINT"]


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=STOP_SIGNAL_IDS)
def test_a_stop_signal_closes_every_connection_removes_the_socket_and_exits_0(
    tmp_path: Path, signum: signal.Signals
) -> None:
    path = tmp_path / "infer.sock"
    with LoopbackUpstream(echo) as upstream, started_proxy(path, upstream.address) as proc:
        clients = [connect(path) for _ in range(3)]
        try:
            for client in clients:
                client.sendall(b"hi")
                assert client.recv(10) == b"hi"
            proc.send_signal(signum)
            for client in clients:
                assert client.recv(10) == b""  # closed by the proxy, not by the upstream
            status, rest = finish(proc)
        finally:
            for client in clients:
                client.close()
        upstream.join_handlers(2)
    assert (status, rest) == (0, "")
    assert not os.path.lexists(path)


def test_one_line_names_the_limit_for_each_refused_connection(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with (
        LoopbackUpstream(echo) as upstream,
        started_proxy(path, upstream.address, "--max-conns", "1", "--burst", "2", "--rate", "0.001") as proc,
        connect(path) as held,
    ):
        held.sendall(b"x")
        assert held.recv(1) == b"x"
        with connect(path) as second:
            assert second.recv(1) == b""
        assert read_line(proc) == "inferproxy: refused a connection: 1 connections already open\n"
        with connect(path) as third:
            assert third.recv(1) == b""
        assert read_line(proc) == "inferproxy: refused a connection: accept rate limit (burst 2, refill 0.001/s)\n"


def test_a_client_that_sends_nothing_is_closed_after_the_first_byte_timeout_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with (
        LoopbackUpstream(echo) as upstream,
        started_proxy(path, upstream.address, "--first-byte-timeout", "0.1") as proc,
        connect(path) as silent,
    ):
        assert silent.recv(1) == b""
        assert read_line(proc) == (
            "inferproxy: closed a connection: the client sent no byte within 0.1 s (first-byte limit)\n"
        )
        with connect(path) as talker:
            talker.sendall(b"hello")
            assert talker.recv(100) == b"hello"


def test_help_names_the_first_byte_timeout_and_its_default() -> None:
    with proxy_process("--help") as proc:
        assert proc.wait(10) == 0
        assert proc.stdout is not None
        usage = " ".join(proc.stdout.read().decode().split())
    assert "--first-byte-timeout SECONDS close a connection whose client has sent nothing" in usage
    assert "(default 10)" in usage


def test_a_second_proxy_on_a_live_socket_refuses_to_start_and_the_first_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with LoopbackUpstream(echo) as upstream, started_proxy(path, upstream.address):
        with proxy_process("--listen", str(path), "--upstream", str(upstream.address)) as second:
            status, err = finish(second)
        assert status == 1
        assert err == f"inferproxy: error: another inferproxy holds {path}.lock; refusing to start\n"
        with connect(path) as client:
            client.sendall(b"still here")
            assert client.recv(100) == b"still here"


def test_the_stale_socket_of_a_killed_proxy_is_removed_by_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with LoopbackUpstream(echo) as upstream:
        with started_proxy(path, upstream.address) as first:
            first.kill()
            first.wait(5)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)  # left behind by SIGKILL
        with started_proxy(path, upstream.address), connect(path) as client:
            client.sendall(b"again")
            assert client.recv(100) == b"again"


def test_a_regular_file_at_the_socket_path_stops_the_start_and_survives(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    path.write_bytes(b"do not delete")
    with proxy_process("--listen", str(path), "--upstream", "127.0.0.1:1") as proc:
        status, err = finish(proc)
    assert status == 1
    assert err == (
        f"inferproxy: error: {path} exists and is a regular file, not a socket; refusing to start (left untouched)\n"
    )
    assert path.read_bytes() == b"do not delete"


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    with proxy_process("--listen", str(tmp_path / "none" / "s.sock"), "--upstream", "127.0.0.1:80") as proc:
        status, err = finish(proc)
    assert status == 2
    assert err == f"inferproxy: error: --listen: the folder {tmp_path / 'none'} does not exist\n"


@pytest.mark.parametrize("through", ["folder", "symlink"])
def test_a_listen_path_ending_in_a_slash_exits_2_naming_it_and_makes_nothing_in_the_folder(
    tmp_path: Path, through: str
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)
    path = f"{tmp_path / ('run' if through == 'folder' else 'link')}/"
    with proxy_process("--listen", path, "--upstream", "127.0.0.1:1") as proc:
        status, err = finish(proc)
    assert status == 2
    assert err == f"inferproxy: error: --listen must end in the socket file's name, and {path} ends in a slash\n"
    assert os.listdir(folder) == []


def test_the_installed_console_script_runs_the_same_main(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "inferproxy"
    if not script.exists():
        pytest.skip(f"the package is not installed into {script.parent} (pip install -e .)")
    result = subprocess.run([str(script), "--upstream", "h:1"], capture_output=True, timeout=10)
    assert result.returncode == 2
    assert result.stderr == b"inferproxy: error: the following arguments are required: --listen\n"


# -- floods, a stderr nobody reads, and the lock beside the socket -----------------------------------


def seconds_to_exit(proc: "subprocess.Popen[bytes]", signum: signal.Signals, limit: float = 5.0) -> float:
    """Send `signum` and measure, from the signal to the process's exit, how long it took.

    A pidfd becomes readable the moment the process exits, so no polling interval is added.
    """
    pidfd = os.pidfd_open(proc.pid)
    try:
        started = time.monotonic()
        proc.send_signal(signum)
        exited = select.select([pidfd], [], [], limit)[0]
        elapsed = time.monotonic() - started
    finally:
        os.close(pidfd)
    assert exited, f"still running {limit} s after {signum.name}"
    return elapsed


@contextmanager
def draining(proc: "subprocess.Popen[bytes]") -> Iterator[bytearray]:
    """Read the process's stderr on a thread until EOF; the bytes grow in the yielded buffer."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    got = bytearray()

    def read() -> None:
        while chunk := os.read(fd, 1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=read, name="test-stderr")
    reader.start()
    try:
        yield got
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(5)
    assert not reader.is_alive()


class Flood:
    """Knocks on a Unix socket from a thread as fast as it can, until told, `limit` knocks, `seconds`
    or the socket is gone, whichever comes first."""

    def __init__(self, path: Path, *, limit: int, seconds: float) -> None:
        self._path = str(path)
        self._limit = limit
        self._deadline = time.monotonic() + seconds
        self._enough = threading.Event()
        self._reached = threading.Event()
        self._mark = limit
        self.knocks = 0
        self.thread = threading.Thread(target=self._run, name="test-flood")

    def _run(self) -> None:
        try:
            while self.knocks < self._limit and not self._enough.is_set() and time.monotonic() < self._deadline:
                self.knocks += knock(self._path)
                if self.knocks >= self._mark:
                    self._reached.set()
        except (FileNotFoundError, ConnectionRefusedError):
            pass  # the proxy has gone, and its socket with it
        finally:
            self._reached.set()

    def wait_for(self, knocks: int, timeout: float) -> bool:
        self._mark = knocks
        return self._reached.wait(timeout) and self.knocks >= knocks

    def __enter__(self) -> "Flood":
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._enough.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


def forwards_within(path: Path, seconds: float) -> bool:
    """Whether a client gets its bytes echoed within `seconds`, trying again while it is refused."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                client.connect(str(path))
                client.sendall(b"anyone there?")
                if client.recv(100) == b"anyone there?":
                    return True
            except (ConnectionResetError, BrokenPipeError, TimeoutError, BlockingIOError):
                pass
        time.sleep(0.02)  # refused by the rate limit: a token comes every 50 ms at 20/s
    return False


def test_a_full_stderr_pipe_nobody_reads_stops_neither_forwarding_nor_the_stop_signal(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with (
        LoopbackUpstream(echo) as upstream,
        started_proxy(path, upstream.address, "--burst", "1", "--rate", "20") as proc,
    ):
        # From here on nobody reads the proxy's stderr, and it is full to the last byte.
        fill_pipe(f"/proc/{proc.pid}/fd/2")
        deadline = time.monotonic() + 10
        knocked = 0
        for _ in range(5000):
            knocked += knock(str(path))
            if time.monotonic() > deadline:
                break
        assert knocked > 1000
        assert forwards_within(path, 3.0)
        elapsed = seconds_to_exit(proc, signal.SIGTERM)
        assert proc.wait(5) == 0
    assert not os.path.lexists(path)
    assert elapsed < 0.5, f"{elapsed * 1000:.0f} ms from SIGTERM to exit"


def test_a_stop_signal_in_the_middle_of_a_connect_flood_ends_the_process_within_100_ms(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with (
        LoopbackUpstream(echo) as upstream,
        started_proxy(path, upstream.address) as proc,
        draining(proc),
        Flood(path, limit=500_000, seconds=10) as flood,
    ):
        assert flood.wait_for(3000, timeout=10)
        elapsed = seconds_to_exit(proc, signal.SIGTERM)
        assert proc.wait(5) == 0
    # 100 ms is the aim; the bound leaves room for a loaded two-core machine to schedule the exit.
    assert elapsed < 0.5, f"{elapsed * 1000:.0f} ms from SIGTERM to exit"


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=STOP_SIGNAL_IDS)
def test_a_stop_signal_ends_the_process_within_200_ms_while_a_connection_waits_for_its_upstream_connect(
    tmp_path: Path, signum: signal.Signals
) -> None:
    path = tmp_path / "infer.sock"
    with black_hole() as address:
        others = pending_connects(address)  # the black hole's own queue holders
        with started_proxy(path, address) as proc, connect(path) as client:
            client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            deadline = time.monotonic() + 2
            while not pending_connects(address) - others:  # the proxy's connect is under way
                assert time.monotonic() < deadline, "the proxy never started its upstream connect"
                time.sleep(0.001)
            elapsed = seconds_to_exit(proc, signum)
            assert finish(proc) == (0, "")
            with pytest.raises(ConnectionResetError):  # closed with the request unread
                client.recv(1)
    assert not os.path.lexists(path)
    # The upstream connect waits 5 s for an answer; the stop must not wait for it. 200 ms is the
    # aim; the bound leaves room for a loaded two-core machine and stays far below those 5 s.
    assert elapsed < 1.0, f"{elapsed * 1000:.0f} ms from {signum.name} to exit"


REFUSAL_SUMMARY = re.compile(r"^inferproxy: refused (\d+) more connections? within 1 s \[(.*)\]$")


def test_the_log_stays_a_few_lines_under_a_flood_of_5000_connects_and_counts_every_refusal(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    rate_limit = "accept rate limit (burst 1, refill 0.001/s)"
    with (
        LoopbackUpstream(echo) as upstream,
        started_proxy(path, upstream.address, "--burst", "1", "--rate", "0.001") as proc,
        draining(proc) as err,
    ):
        started = time.monotonic()
        knocked = 0
        for _ in range(5000):
            knocked += knock(str(path))
            if time.monotonic() - started > 10:
                break
        # The backlog is served in order: once this client is refused, so is every knock before.
        with connect(path) as last:
            assert last.recv(1) == b""
        seconds = time.monotonic() - started
        assert seconds_to_exit(proc, signal.SIGTERM) < 5
        assert proc.wait(5) == 0
    lines = err.decode().splitlines()
    own = [line for line in lines if line == f"inferproxy: refused a connection: {rate_limit}"]
    summaries = [match for line in lines if (match := REFUSAL_SUMMARY.match(line))]
    assert len(own) == 10
    assert len(lines) == len(own) + len(summaries)  # nothing else after the start line
    assert 1 <= len(summaries) <= seconds + 2
    assert all(m[2] == f"{rate_limit}: {m[1]}" for m in summaries)
    # The first knock got the one token; every other client, the last one included, is
    # accounted for exactly once.
    assert len(own) + sum(int(m[1]) for m in summaries) == knocked
    assert len(err) < 2048, f"{len(err)} bytes of log for {knocked + 1} connects"


# Binds the socket path, never listens, and holds it until its stdin closes.
HOLDER = (
    "import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]);"
    " print('bound', flush=True); sys.stdin.read()"
)


def test_a_socket_another_process_has_bound_but_not_yet_put_into_listen_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"bound\n"
        before = os.lstat(path)
        with proxy_process("--listen", str(path), "--upstream", "127.0.0.1:1") as proc:
            status, err = finish(proc)
        after = os.lstat(path)
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(5)
        holder.stdout.close()
    assert status == 1
    assert err == f"inferproxy: error: a process has a socket bound at {path}; refusing to start (left untouched)\n"
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def test_the_lock_file_stays_behind_with_mode_0600_and_the_next_proxy_takes_it(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    lock = tmp_path / "infer.sock.lock"
    with LoopbackUpstream(echo) as upstream:
        with started_proxy(path, upstream.address) as proc:
            st = os.lstat(lock)
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            proc.send_signal(signal.SIGTERM)
            assert finish(proc) == (0, "")
        assert not os.path.lexists(path)
        assert os.lstat(lock).st_ino == st.st_ino  # left in place: unlinking a lock file races
        with started_proxy(path, upstream.address), connect(path) as client:
            client.sendall(b"again")
            assert client.recv(100) == b"again"
