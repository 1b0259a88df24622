"""What the client tests share: the routes they script, a client configured with short limits,
and the short answer most of them stream (its chunks built by `adapters.fake_server.chunk`, which
is `chunk` here too).

    from client_support import ANSWER, CHAT, REQ, Kind   # with tests/ on sys.path

A test of a limit asks for short ones, so it waits a fraction of a second: `TIMED` (polls every
100 ms, wait budgets of 150 ms, liveness 100 ms: `config_for(path, **TIMED)`) or its own. Every
other test gets `LIMITS`, five seconds each, which no pause of a busy machine reaches: a test that
is not about time neither polls nor times out. Retry waits are 50, 80 and 120 ms without jitter.

One contract suite, two clients: a test that asks for the `client_kind` fixture (tests/conftest.py)
runs once per `Kind` in `CLIENT_KINDS`, and builds its clients and probes by that kind
(`client_kind.client_for(server)`, `client_kind.client_of(container)`, `client_kind.probe_on(...)`,
`client_kind.probe_state(...)`): the sync `Client`, or the container's `AsyncClient` behind an
`AsyncBridge`, which has the sync surface and awaits the async one underneath. Code that wants the
sync client alone says so: `SYNC.client_for(server)`.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

from adapters.fake_server import CHUNK_ID, ROLE, AsyncFakeClock, FakeClock, FakeServer, RecordedRequest, chunk
from adapters.system import AsyncSystemClock, SystemClock
from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.transport import UdsTransport
from app._async.fetch import AsyncHttpSlotProbe
from app._sync.fetch import HttpSlotProbe
from app.client import Client
from app.config import Config, parse_config
from app.container import Container
from async_bridge import AsyncBridge, run
from domain.bodies import FetchLimits
from domain.completion import Completion, FinishReason, Timings
from domain.events import ChatEvent, Content, Progress
from domain.limits import StreamLimits
from domain.messages import ChatRequest, UserMessage
from ports.slot_probe import SlotState

CHAT = ("POST", "/v1/chat/completions")
CONTROL = ("POST", "/v1/chat/completions/control")
SLOTS = ("GET", "/slots")
STOP = ("DELETE", "/v1/stream")  # a generation stopped
PROPS = ("GET", "/props")
CID = CHUNK_ID
REQ = ChatRequest(slot=0, messages=(UserMessage("What is the capital of France?"),))
EXPECT = {"chat_template_sha256": "0" * 64, "n_ctx": 4096, "total_slots": 2}
TIMED = {"poll_ms": 100, "busy_wait_ms": 150, "load_wait_ms": 150, "idle_grace_ms": 150, "liveness_ms": 100}
# On a shared machine a 140 ms pause between two reads is ordinary: limits a test does not test
# stay far from any pause, so only the limit under test can end a call.
LIMITS = dict.fromkeys(TIMED, 5000)
RETRY = {"attempts": 4, "delays_ms": [50, 80, 120], "jitter": 0.0, "total_ms": 1000}
# No inferproxy stands before the fake server: its accept limit is not the client's to keep here
# (tests of the budget itself set their own).
NO_PROXY_LIMIT = {"burst": 1_000_000, "rate": 1_000_000, "max_conns": 1024}


def config_for(
    socket_path: str, *, expect: bool = True, timed: bool = False, retry: dict[str, Any] | None = None, **limits: int
) -> Config:
    """`LIMITS` (`TIMED` if `timed`) and `RETRY` with the given changes; `expect=False` leaves the
    slot count to `/props`."""
    data: dict[str, Any] = {
        "socket": socket_path,
        "limits": {**(TIMED if timed else LIMITS), **limits},
        "retry": {**RETRY, **(retry or {})},
        "proxy": NO_PROXY_LIMIT,
    }
    if expect:
        data["expect"] = EXPECT
    return parse_config(data)


@contextlib.contextmanager
def overridden() -> Iterator[Callable[..., Container]]:
    """The one way tests override providers: `with overridden() as make:` then
    `make(config, clock=..., transport=...)` builds a container whose providers are overridden
    until the block ends (`Container.override_providers` as a context manager, for every
    container built). A `FakeClock` given as `clock` is the async client's clock too."""
    with contextlib.ExitStack() as stack:

        def make(config: Config, **providers: Any) -> Container:
            if isinstance(providers.get("clock"), FakeClock) and "async_clock" not in providers:
                providers["async_clock"] = AsyncFakeClock(providers["clock"])  # one fake time for both
            container = Container(config=config)
            stack.enter_context(container.override_providers(**providers))
            return container

        yield make


@dataclass(frozen=True)
class Kind:
    """One flavour of client, and how to build its clients and probes: `SYNC` (`app.client.Client`)
    or `ASYNC` (`app.async_client.AsyncClient` behind an `AsyncBridge`, duck-typed as a `Client`).
    The `client_kind` fixture (tests/conftest.py) hands a test one of them."""

    name: str

    def __str__(self) -> str:
        return self.name

    @property
    def is_async(self) -> bool:
        return self.name == "async"

    def client_of(self, container: Container) -> Client:
        """The container's client of this kind: `container.client()`, or
        `container.async_client()` behind an `AsyncBridge`."""
        if self.is_async:
            return cast(Client, AsyncBridge(container.async_client()))
        client: Client = container.client()
        return client

    def client_for(self, server: FakeServer, **options: Any) -> Client:
        """A client of this kind on `server`'s socket, configured by `config_for(..., **options)`."""
        return self.client_of(Container(config=config_for(server.socket_path, **options)))

    def probe_on(self, socket_path: str, *, timeout: float, body_bytes: int) -> dict[str, Any]:
        """A provider override: a `/slots` probe of this kind on `socket_path` (the sync client's
        `probe`, or the async client's `async_probe`)."""
        limits = FetchLimits(timeout, timeout, body_bytes, 4096)
        if self.is_async:
            transport = AsyncUdsTransport(socket_path, header_bytes=16384)
            return {"async_probe": AsyncHttpSlotProbe(transport, AsyncSystemClock(), limits)}
        blocking = UdsTransport(socket_path, header_bytes=16384)
        return {"probe": HttpSlotProbe(blocking, SystemClock(), limits)}

    def probe_state(self, container: Container, slot: int) -> SlotState:
        """One `/slots` probe by the container's probe of this kind."""
        if self.is_async:
            state: SlotState = run(container.async_probe().state(slot))
            return state
        probed: SlotState = container.probe().state(slot)
        return probed


SYNC = Kind("sync")
ASYNC = Kind("async")
CLIENT_KINDS = (SYNC, ASYNC)


def recorded(server: FakeServer, route: tuple[str, str]) -> list[RecordedRequest]:
    """The requests the server received on `route`, in order."""
    return [r for r in server.requests if (r.method, r.path) == route]


ANSWER = [
    chunk(ROLE, n=0, progress=(42, 0, 42)),
    chunk({"content": "Paris"}, n=1),
    chunk({"content": "."}, n=2),
    chunk(finish="stop", n=2),
]
ANSWER_EVENTS: list[ChatEvent] = [Progress(42, 0, 42), Content("Paris"), Content(".")]
ANSWER_COMPLETION = Completion(
    id=CID,
    content="Paris.",
    reasoning_content=None,
    tool_calls=(),
    finish_reason=FinishReason.STOP,
    timings=Timings(0, 42, 2),
    reasoning_tokens=0,
    thinking_capped=False,
)


# The limits the unit tests run a `ChatStream` under.
STREAM_LIMITS = StreamLimits(
    liveness_s=1.0,
    sse_line_bytes=1 << 16,
    answer_bytes=1 << 20,
    thinking_cap=100,
    thinking_overrun=0,
    tool_calls=128,
    error_body_bytes=4096,
)


def stream_limits(**changes: int) -> StreamLimits:
    """`STREAM_LIMITS` with `changes`."""
    return replace(STREAM_LIMITS, **changes)


TOO_LARGE = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 7\r\nConnection: close\r\n\r\ntoo big"


def refuse_unread(conn: socket.socket) -> None:
    """Play a server that refuses a body too large: read the request's head, answer 413 and
    close, the body unread."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    conn.sendall(TOO_LARGE)
    conn.close()
