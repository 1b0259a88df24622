"""`make serve` shows the proxy's own lines after its start line (one per refused connection):
`ProxyProcess(echo=...)`, as scripts/serve.py starts it, copies them to the terminal as they come."""

from __future__ import annotations

import io
import socket
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))
from proxy import ProxyProcess

pytestmark = pytest.mark.timeout(20)


class Sink(io.StringIO):
    """A terminal that keeps what it was shown, and says when a refusal was."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if "refused a connection: accept rate limit" in self.getvalue():
            self.refused.set()
        return written


def test_the_proxys_lines_after_its_start_line_are_shown_as_they_come(tmp_path: Path) -> None:
    sink = Sink()
    with ProxyProcess("127.0.0.1:1", str(tmp_path / "infer.sock"), echo=sink) as proxy:
        assert "listening" in proxy.start_line
        for _ in range(12):  # past the burst of 10: two refused at once
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(proxy.socket_path)
        assert sink.refused.wait(5.0), f"no refusal line shown: {sink.getvalue()!r}"
