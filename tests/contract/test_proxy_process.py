"""`python -m adapters.proxy` as a process: its lines, its socket file, its signals, its exit codes.

Every process started here is terminated, and killed if need be, before the test ends.
"""

import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.proxy.options import Address
from adapters.proxy.testing import LoopbackUpstream, echo, unused_port

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
            "at most 8 connections, accept burst 10, refill 2/s\n"
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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
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


def test_a_second_proxy_on_a_live_socket_refuses_to_start_and_the_first_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "infer.sock"
    with LoopbackUpstream(echo) as upstream, started_proxy(path, upstream.address):
        with proxy_process("--listen", str(path), "--upstream", str(upstream.address)) as second:
            status, err = finish(second)
        assert status == 1
        assert err == f"inferproxy: error: a process is listening on {path}; refusing to start\n"
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


def test_the_installed_console_script_runs_the_same_main(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "inferproxy"
    if not script.exists():
        pytest.skip(f"the package is not installed into {script.parent} (pip install -e .)")
    result = subprocess.run([str(script), "--upstream", "h:1"], capture_output=True, timeout=10)
    assert result.returncode == 2
    assert result.stderr == b"inferproxy: error: the following arguments are required: --listen\n"
