"""An exchange's waits end at their time even while bytes keep coming that make nothing: 1xx
heads under a cap they never reach, and a body's framing that never makes a piece. A stream that
is always readable, on a clock that moves 10 ms a reading."""

from __future__ import annotations

import pytest

from adapters.uds_http._sync.exchange import HttpExchange
from adapters.uds_http.response import render
from ports.transport import TIMED_OUT, ResponseHead

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


class Endless:
    """A byte stream that hands out `first`, then `then` at every read, for at most `most` reads."""

    def __init__(self, first: bytes, then: bytes, most: int = 1000) -> None:
        self._pending = [first] if first else []
        self._then = then
        self.reads = 0
        self._most = most

    def recv(self, max_bytes: int, timeout: float) -> bytes:
        self.reads += 1
        if self.reads > self._most:
            raise AssertionError(f"still reading after {self._most} reads: the wait has no end")
        return self._pending.pop(0) if self._pending else self._then

    def pause(self) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        self.t += 0.01
        return self.t


def exchange(stream: Endless, header_bytes: int = 1 << 30) -> HttpExchange:
    return HttpExchange(stream, render("GET", "/x", None, header_bytes), Clock().now)  # type: ignore[arg-type]


def test_a_head_wait_ends_at_its_time_while_informational_responses_keep_coming() -> None:
    stream = Endless(b"", CONTINUE)

    assert exchange(stream).head(0.1) is TIMED_OUT
    assert stream.reads <= 12


@pytest.mark.parametrize("framing", [b";ext", b"0" * 8], ids=["a chunk extension", "leading zeros"])
def test_a_body_read_ends_at_its_time_while_framing_bytes_keep_coming(framing: bytes) -> None:
    # A chunk-size line under the cap that never ends makes no piece.
    stream = Endless(HEAD + b"1", framing, most=1000)
    ex = exchange(stream, header_bytes=1 << 30)
    assert isinstance(ex.head(1.0), ResponseHead)

    assert ex.read(0.1) is TIMED_OUT
    assert stream.reads <= 14
