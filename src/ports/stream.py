"""One connected byte stream: what an HTTP exchange reads from and writes to.

The seam under `Transport`: the real exchange (h11 for the head, the body readers for the
framing) runs over a Unix socket in production and over a script replayed on a fake clock in
unit tests, so both run the same parsing. The contract, which both streams meet:

- `send_now(data)` sends what the connection takes at once, without waiting (not awaited in
  either flavour): the count of bytes sent, 0 when it takes none now; `OSError` if the
  connection broke. A request nearly always goes whole.
- `send_all(data, timeout)` sends every byte of `data`. It raises `TimeoutError` if that takes
  longer than `timeout` seconds and another `OSError` if the connection broke.
- `recv(max_bytes, timeout)` returns between 1 and `max_bytes` bytes as soon as any arrived,
  `b""` if and only if the peer closed its end (EOF, and again on every later call), or
  `TIMED_OUT` if nothing arrived within `timeout` seconds. A timeout of zero or less polls. A
  timeout consumes nothing: the next call continues where this one stopped. A connection that
  failed (reset by the peer) raises `OSError`.
- `pause()` lets whatever else shares the thread run once (the event loop's other tasks); a
  blocking stream has nothing to let run and returns at once.
- `shutdown()` may be called from any thread while another is blocked in `recv`: that `recv`
  returns (`b""`) at once and the peer sees the close. It never raises.
- `close()` releases the connection; it is idempotent and never raises. Nothing may be called
  after it.

`OSError` is the stream's currency because the exchange above it maps every failure onto
`domain.errors` with what it knows and the stream does not: where in the response it happened.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ports.transport import TimedOut


@runtime_checkable
class ByteStream(Protocol):
    def send_now(self, data: bytes) -> int: ...

    def send_all(self, data: bytes, timeout: float) -> None: ...

    def recv(self, max_bytes: int, timeout: float) -> bytes | TimedOut: ...

    def pause(self) -> None: ...

    def shutdown(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncByteStream(Protocol):
    """`ByteStream` for asyncio: `send_all` and `recv` are awaited and meet the same contract;
    `shutdown()` and `close()` are not awaited and act at once (the peer sees the close).
    Cancelling the task blocked in `recv` or `send_all` ends the wait too."""

    def send_now(self, data: bytes) -> int: ...

    async def send_all(self, data: bytes, timeout: float) -> None: ...

    async def recv(self, max_bytes: int, timeout: float) -> bytes | TimedOut: ...

    async def pause(self) -> None: ...

    def shutdown(self) -> None: ...

    def close(self) -> None: ...
