"""In-memory fakes for unit tests: a clock that moves only when told, a transport that replays
the same scripts as `FakeServer` without sockets, and a slot probe with states set by hand.

`ScriptedTransport` is the real exchange (`adapters.uds_http._async.exchange`: h11 for the head, the
body readers for the framing, the head's size cap) over a `ScriptedStream` instead of a socket,
as a mock stream sits under a real HTTP connection. So every in-memory test runs the same
parsing as production, and a script fails here exactly as it fails on a socket.

How `ScriptedStream` replays a script: the request written to it is parsed and recorded as
`FakeServer` records it, the routes choose the reply, and the reply's bytes are scheduled as
`FakeServer` writes them (`adapters.fake_server.wire`), at times relative to the request. A
`recv` either reaches the next write within its timeout (the clock jumps to it) or does not (the
clock jumps by the whole timeout and the call returns `TIMED_OUT`). So a piece's delay advances
the fake clock, and a read whose timeout is shorter than the next piece's delay costs exactly
its timeout. `End.CLOSE` and `End.RESET` read as EOF, as on a Unix socket; `End.SILENCE` never
ends.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from collections.abc import Mapping

from adapters.fake_server.script import End, RecordedRequest, RouteItem, Routes, RouteSpec, Script
from adapters.fake_server.wire import RequestReader, on_wire
from adapters.uds_http._async.exchange import AsyncHttpExchange
from adapters.uds_http._async.exchange import send as send_async
from adapters.uds_http._sync.exchange import HttpExchange, send
from adapters.uds_http.response import Request, render_for
from domain.errors import ConnectError
from ports.slot_probe import SlotState
from ports.transport import TIMED_OUT, CancelSignal, Link, TimedOut

ScriptedExchange = HttpExchange
"""What `ScriptedTransport.open` returns: the real exchange, over a `ScriptedStream`."""


def _fired(cancel: CancelSignal | None) -> bool:
    if cancel is None:
        return False
    seen: list[bool] = []
    cancel.on_cancel(lambda: seen.append(True))()
    return bool(seen)


class FakeClock:
    """A monotonic clock for tests: `sleep` and `advance` move it at once; nothing else does."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float, cancel: CancelSignal | None = None) -> None:
        if not _fired(cancel):
            self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds} s)")
        with self._lock:
            self._now += seconds


class AsyncFakeClock:
    """The `AsyncClock` port over a `FakeClock` (shared with whatever else holds it): `sleep`
    moves it at once, then lets the loop run once."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock.now()

    async def sleep(self, seconds: float, cancel: CancelSignal | None = None) -> None:
        self.clock.sleep(seconds, cancel)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)


class ScriptedStream:
    """The `ByteStream` port played by the routes on `clock` (see the module). The reply is
    chosen when the request is whole, and `recorded` gets the request as the server records it;
    `shutdown` and `close` record that the client closed, at the clock's time."""

    def __init__(self, clock: FakeClock, routes: Routes, recorded: list[RecordedRequest]) -> None:
        self._clock = clock
        self._routes = routes
        self._recorded = recorded
        self._reader: RequestReader | None = RequestReader()
        self._request: RecordedRequest | None = None
        self._writes: list[tuple[float, bytes]] = []  # (due, data) not yet received
        self._next = 0
        self._eof_at = math.inf  # until the request is whole, and for ever after `End.SILENCE`
        self._shut = False

    def send_now(self, data: bytes) -> int:
        self.send_all(data, 0.0)  # a script takes every byte at once
        return len(data)

    def send_all(self, data: bytes, timeout: float) -> None:
        reader = self._reader
        if reader is None:
            return  # bytes after the request are ignored: it said Connection: close
        request = reader.feed(data, self._clock.now())
        if request is not None:
            self._reader = None
            self._request = request
            self._recorded.append(request)
            self._schedule(self._routes.reply_for(request), request.time)

    def recv(self, max_bytes: int, timeout: float) -> bytes | TimedOut:
        if self._shut:
            return b""
        index = self._next
        due, data = self._writes[index] if index < len(self._writes) else (self._eof_at, b"")
        clock = self._clock
        wait = due - clock.now()
        timeout = max(timeout, 0.0)
        if wait > timeout:
            clock.advance(timeout)
            return TIMED_OUT
        if wait > 0:
            clock.advance(wait)
        if len(data) > max_bytes:
            self._writes[index] = (due, data[max_bytes:])
            return data[:max_bytes]
        if data:
            self._next = index + 1
        return data

    def pause(self) -> None:
        return None

    def shutdown(self) -> None:
        self._shut = True
        self.close()

    def close(self) -> None:
        if self._request is not None:
            self._request.mark_closed(self._clock.now())

    def _schedule(self, script: Script, start: float) -> None:
        wire = on_wire(script)
        at = start
        for after_s, data in wire.writes:
            at += after_s
            self._writes.append((at, data))
        if wire.end is not End.SILENCE:
            self._eof_at = at + wire.end_after_s


class ScriptedTransport:
    """The `Transport` port over scripts instead of a socket. `refusing = True` makes `open` fail
    as a socket with nobody listening does. `header_bytes` caps response heads as the real
    transport's does; without it, heads are not capped."""

    def __init__(
        self,
        clock: FakeClock,
        routes: Mapping[tuple[str, str], RouteSpec] | None = None,
        *,
        socket_path: str = "/fake/llama.sock",
        header_bytes: int | None = None,
        default: RouteItem | None = None,
    ) -> None:
        self.clock = clock
        self.routes = Routes(routes)
        if default is not None:
            self.routes.set_default(default)
        self.socket_path = socket_path
        self.header_bytes = header_bytes
        self.refusing = False
        self.requests: list[RecordedRequest] = []

    def route(self, method: str, path: str, *replies: RouteItem) -> None:
        self.routes.set(method, path, *replies)

    def connect(self, timeout: float, cancel: CancelSignal | None = None) -> ScriptedStream:
        """A connection to the script, nothing sent: `open(..., link=)` sends on it."""
        self._refuse()
        return ScriptedStream(self.clock, self.routes, self.requests)

    def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        cancel: CancelSignal | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        link: Link | None = None,
        place_wait: float | None = None,
    ) -> ScriptedExchange:
        request, stream = self._render(method, path, body, headers, link)
        return send(
            stream,
            request,
            timeout=timeout,
            now=self.clock.now,
            peer=self.socket_path,
            cancel=cancel,
        )

    def _render(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: tuple[tuple[str, str], ...],
        link: Link | None,
    ) -> tuple[Request, ScriptedStream]:
        """The request checked as the real transport checks it, and the stream that plays it
        (`link`, when `connect` made it)."""
        header_bytes = sys.maxsize if self.header_bytes is None else self.header_bytes
        request, stream = render_for(
            link, ScriptedStream, self, method, path, body, header_bytes, headers
        )
        if stream is None:
            self._refuse()
            stream = ScriptedStream(self.clock, self.routes, self.requests)
        return request, stream

    def _refuse(self) -> None:
        if self.refusing:
            raise ConnectError(
                f"cannot connect to {self.socket_path}: connection refused"
                " (nobody is listening on the socket)"
            )


class AsyncScriptedStream:
    """The `AsyncByteStream` port over a `ScriptedStream`: the same replay, awaited; a `recv`
    lets the loop run once, as a socket read does."""

    def __init__(self, stream: ScriptedStream) -> None:
        self._stream = stream

    def send_now(self, data: bytes) -> int:
        return self._stream.send_now(data)

    async def send_all(self, data: bytes, timeout: float) -> None:
        self._stream.send_all(data, timeout)

    async def recv(self, max_bytes: int, timeout: float) -> bytes | TimedOut:
        data = self._stream.recv(max_bytes, timeout)
        await asyncio.sleep(0)
        return data

    async def pause(self) -> None:
        await asyncio.sleep(0)

    def shutdown(self) -> None:
        self._stream.shutdown()

    def close(self) -> None:
        self._stream.close()


class AsyncScriptedTransport(ScriptedTransport):
    """The `AsyncTransport` port over the same scripts (`ScriptedTransport`'s routes, record and
    switches), for the asyncio client on a fake clock."""

    async def connect(self, timeout: float, cancel: CancelSignal | None = None) -> ScriptedStream:  # type: ignore[override]
        return super().connect(timeout, cancel)

    async def open(  # type: ignore[override]
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        cancel: CancelSignal | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        link: Link | None = None,
        place_wait: float | None = None,
    ) -> AsyncHttpExchange:
        request, scripted = self._render(method, path, body, headers, link)
        return await send_async(
            AsyncScriptedStream(scripted),
            request,
            timeout=timeout,
            now=self.clock.now,
            peer=self.socket_path,
            cancel=cancel,
        )


class FakeSlotProbe:
    """The `SlotProbe` port with states set by hand; records every slot it was asked about."""

    def __init__(self, states: Mapping[int, SlotState] | None = None) -> None:
        self.states: dict[int, SlotState] = dict(states or {})
        self.asked: list[int] = []

    def state(self, slot: int, cancel: CancelSignal | None = None) -> SlotState:
        if slot < 0:
            raise ValueError(f"slot ids are never negative, got {slot}")
        self.asked.append(slot)
        return self.states.get(slot, SlotState.UNAVAILABLE)


class AsyncFakeSlotProbe(FakeSlotProbe):
    """`FakeSlotProbe` awaited: the `AsyncSlotProbe` port with states set by hand."""

    async def state(self, slot: int, cancel: CancelSignal | None = None) -> SlotState:  # type: ignore[override]
        return FakeSlotProbe.state(self, slot, cancel)


__all__ = [
    "AsyncFakeClock",
    "AsyncFakeSlotProbe",
    "AsyncScriptedStream",
    "AsyncScriptedTransport",
    "FakeClock",
    "FakeSlotProbe",
    "Script",
    "ScriptedExchange",
    "ScriptedStream",
    "ScriptedTransport",
]
