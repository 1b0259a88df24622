"""Cancel latency: from `token.cancel()` in another thread to the call's return, per phase.

Against the scripted fake server on a Unix socket, the call is cancelled while it is queued at
the slot gate, waiting for the response head, inside a `/slots` poll, streaming, posting
`reasoning_end`, and waiting to retry; each phase is tried `TRIES` times and the table gives the
median and the maximum. The server side is left unanswered in every phase, so only the cancel
can end the call.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from adapters.fake_server import End, FakeServer, RecordedRequest, Script, json_reply, silence, sse_reply  # noqa: E402
from app.client import Client  # noqa: E402
from client_support import ANSWER, CHAT, CONTROL, REQ, SLOTS, SYNC, chunk  # noqa: E402
from domain.cancel import CancelToken  # noqa: E402
from domain.errors import Cancelled  # noqa: E402
from domain.events import ChatEvent, Content, Queued, Retrying  # noqa: E402

TRIES = 100
LIMITS: dict[str, Any] = {
    "poll_ms": 5000,
    "busy_wait_ms": 60_000,
    "load_wait_ms": 60_000,
    "idle_grace_ms": 60_000,
    "liveness_ms": 60_000,
}


def one(
    client: Client,
    call: Callable[[Client, CancelToken, Callable[[ChatEvent], None]], object],
    ready: Callable[[ChatEvent], bool] | None,
    armed: threading.Event | None = None,
) -> float:
    """Run one call in a thread, cancel it once it is in its phase; seconds from cancel to return."""
    token = CancelToken()
    phase = threading.Event()
    done = threading.Event()
    outcome: list[BaseException] = []

    def sink(event: ChatEvent) -> None:
        if ready is not None and ready(event):
            phase.set()

    def run() -> None:
        try:
            call(client, token, sink)
        except BaseException as exc:
            outcome.append(exc)
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    (armed or phase).wait(10.0)
    time.sleep(0.005)  # let the call block in its I/O
    start = time.monotonic()
    token.cancel()
    done.wait(10.0)
    latency = time.monotonic() - start
    thread.join(10.0)
    assert outcome and isinstance(outcome[0], Cancelled), outcome
    return latency


def measure(name: str, setup: Callable[[FakeServer], tuple[Client, Any, Any, Any]]) -> tuple[str, str]:
    times = []
    for _ in range(TRIES):
        with FakeServer() as server:
            client, call, ready, armed = setup(server)
            times.append(one(client, call, ready, armed))
            client.close()
    ms = [t * 1000 for t in times]
    return (f"cancel while {name}", f"median {statistics.median(ms):.2f} ms, max {max(ms):.2f} ms over {TRIES}")


def chat(client: Client, token: CancelToken, sink: Callable[[ChatEvent], None]) -> object:
    return client.chat(REQ, sink, cancel=token)


def queued(server: FakeServer) -> tuple[Client, Any, Any, Any]:
    release = threading.Event()
    server.route(*CHAT, lambda request: (release.wait(10.0), sse_reply(ANSWER))[1])
    client = SYNC.client_for(server, **LIMITS)
    holder = threading.Thread(target=lambda: client.chat(REQ, lambda e: None), daemon=True)
    holder.start()
    while not client._gate.held(0):
        time.sleep(0.001)
    original_close = client.close

    def close() -> None:
        release.set()
        holder.join(10.0)
        original_close()

    client.close = close  # type: ignore[method-assign]
    return client, chat, lambda e: isinstance(e, Queued), None


def head(server: FakeServer) -> tuple[Client, Any, Any, Any]:
    arrived = threading.Event()

    def handler(request: RecordedRequest) -> Script:
        arrived.set()
        return silence()

    server.route(*CHAT, handler)
    return SYNC.client_for(server, **LIMITS), chat, None, arrived


def probe(server: FakeServer) -> tuple[Client, Any, Any, Any]:
    polled = threading.Event()

    def slots(request: RecordedRequest) -> Script:
        polled.set()
        return silence()

    server.route(*CHAT, silence())
    server.route(*SLOTS, slots)
    return SYNC.client_for(server, **{**LIMITS, "poll_ms": 50}), chat, None, polled


def streaming(server: FakeServer) -> tuple[Client, Any, Any, Any]:
    server.route(*CHAT, sse_reply([chunk({"content": "Paris"}, n=1)], done=False, end=End.SILENCE))
    return SYNC.client_for(server, **LIMITS), chat, lambda e: isinstance(e, Content), None


def control(server: FakeServer) -> tuple[Client, Any, Any, Any]:
    posted = threading.Event()

    def handler(request: RecordedRequest) -> Script:
        posted.set()
        return silence()

    server.route(
        *CHAT,
        sse_reply([chunk({"reasoning_content": f" t{n}"}, n=n) for n in range(1, 12)], done=False, end=End.SILENCE),
    )
    server.route(*CONTROL, handler)
    return SYNC.client_for(server, **LIMITS, thinking_cap=8, thinking_overrun=4), chat, None, posted


def retry_wait(server: FakeServer) -> tuple[Client, Any, Any, Any]:
    server.route(*CHAT, json_reply({"error": {"code": 503, "message": "Loading model"}}, 503))
    client = SYNC.client_for(server, **LIMITS, retry={"attempts": 2, "delays_ms": [60_000], "total_ms": 120_000})

    def call(client: Client, token: CancelToken, sink: Callable[[ChatEvent], None]) -> object:
        return client.chat_with_retry(REQ, sink, cancel=token)

    return client, call, lambda e: isinstance(e, Retrying), None


PHASES = [
    ("queued at the gate", queued),
    ("waiting for the head", head),
    ("in a /slots poll", probe),
    ("streaming", streaming),
    ("posting reasoning_end", control),
    ("waiting to retry", retry_wait),
]


def run(quick: bool = False) -> list[tuple[str, str]]:
    global TRIES
    if quick:
        TRIES = 10
    return [measure(name, setup) for name, setup in PHASES]


if __name__ == "__main__":
    for label, figure in run(quick="--quick" in sys.argv):
        print(f"{label:<40} {figure}")
