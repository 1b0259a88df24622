"""Run `inferproxy` as its own process for the device tier.

The command comes from the environment (`INFERPROXY_CMD`, split like a shell line), so the client
code under test never imports the proxy; by default it is this interpreter's `-m adapters.proxy`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

START_DEADLINE_S = 20.0


def proxy_command() -> list[str]:
    configured = os.environ.get("INFERPROXY_CMD", "").strip()
    return shlex.split(configured) if configured else [sys.executable, "-m", "adapters.proxy"]


class ProxyProcess:
    """One `inferproxy` forwarding `socket_path` to `upstream`; restartable on the same path."""

    def __init__(
        self,
        upstream: str,
        socket_path: str | None = None,
        extra_args: Sequence[str] = (),
        echo: TextIO | None = None,
    ) -> None:
        self.upstream = upstream
        self.echo = echo  # where its lines after the start line go (`make serve`: the terminal), if anywhere
        self.extra_args = tuple(extra_args)  # more flags, e.g. a lifted accept rate for a bench
        self._folder = None if socket_path else tempfile.mkdtemp(prefix="inferproxy-")
        self.socket_path = socket_path or str(Path(self._folder or "") / "infer.sock")
        self.process: subprocess.Popen[str] | None = None
        self.start_line = ""

    def start(self) -> ProxyProcess:
        argv = [*proxy_command(), "--listen", self.socket_path, "--upstream", self.upstream, *self.extra_args]
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.process = process
        assert process.stdout is not None
        # The proxy prints its one start line once it listens: that line is the readiness event.
        line = process.stdout.readline()
        if "listening" not in line or not Path(self.socket_path).exists():
            rest = ""
            if process.poll() is not None:
                rest = process.stdout.read()
            self.stop()
            raise RuntimeError(f"inferproxy did not start: {line!r} {rest!r} ({' '.join(argv)})")
        self.start_line = line.strip()
        if self.echo is not None:
            threading.Thread(target=_copy_lines, args=(process.stdout, self.echo), daemon=True).start()
        return self

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, so a stale socket file stays behind."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
        self.process = None

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if Path(self.socket_path).is_socket():
            Path(self.socket_path).unlink()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


def _copy_lines(source: TextIO, sink: TextIO) -> None:
    """The proxy's lines (one per refused connection, a summary a second) as they come."""
    try:
        for line in source:
            sink.write(line)
            sink.flush()
    except (OSError, ValueError):  # the pipe closed as the proxy stopped
        return
