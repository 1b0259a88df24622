"""The `SlotProbe` contract: busy, idle, unavailable or unresponsive for one slot, within its own
short timeout, never raising for a server fault.

Run against the hand-set fake (the states it is told), and against the real probe in both
flavours (`HttpSlotProbe`, and `AsyncHttpSlotProbe` awaited on a loop of its own) over the
in-memory scripted transport and over a Unix socket to the fake server (the same `/slots`
scripts for all four).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.fake_server import (
    AsyncFakeClock,
    AsyncScriptedTransport,
    End,
    FakeClock,
    FakeServer,
    FakeSlotProbe,
    Piece,
    Raw,
    Reply,
    RouteItem,
    ScriptedTransport,
    error_reply,
    json_reply,
    loading,
    silence,
    slots_reply,
)
from adapters.system import AsyncSystemClock, SystemClock
from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.transport import UdsTransport
from app._async.fetch import AsyncHttpSlotProbe
from app._sync.fetch import HttpSlotProbe
from async_bridge import run
from domain.bodies import FetchLimits
from domain.cancel import CancelToken
from ports import AsyncSlotProbe, SlotProbe, SlotState
from ports.transport import CancelSignal

pytestmark = pytest.mark.timeout(20)

TIMEOUT_S = 0.1
HEADER_BYTES = 16384
BODY_BYTES = 4 * 1024 * 1024
LIMITS = FetchLimits(TIMEOUT_S, TIMEOUT_S, BODY_BYTES, 4096)
BUSY, IDLE, UNAVAILABLE, UNRESPONSIVE = SlotState.BUSY, SlotState.IDLE, SlotState.UNAVAILABLE, SlotState.UNRESPONSIVE


class Awaited:
    """An `AsyncSlotProbe` asked as a `SlotProbe`: each `state` awaited on a loop of its own."""

    def __init__(self, probe: AsyncSlotProbe) -> None:
        self.probe = probe

    def state(self, slot: int, cancel: CancelSignal | None = None) -> SlotState:
        return run(self.probe.state(slot, cancel))


@dataclass
class ProbeHarness:
    kind: str
    probe: SlotProbe
    fake: FakeSlotProbe | None = None
    routes: ScriptedTransport | FakeServer | None = None
    clock: FakeClock | None = None

    def set_slots(self, busy: list[bool]) -> None:
        if self.fake is not None:
            self.fake.states = {i: BUSY if flag else IDLE for i, flag in enumerate(busy)}
        else:
            self.serve(slots_reply(busy))

    def serve(self, *replies: RouteItem) -> None:
        assert self.routes is not None
        self.routes.route("GET", "/slots", *replies)

    def elapsed(self, since: float) -> float:
        return (self.clock.now() if self.clock else time.monotonic()) - since

    def now(self) -> float:
        return self.clock.now() if self.clock else time.monotonic()


@pytest.fixture(params=["fake", "memory", "uds"])
def any_probe(request: pytest.FixtureRequest) -> Iterator[ProbeHarness]:
    yield from _harness(request.param)


@pytest.fixture(params=["memory", "uds", "memory-async", "uds-async"])
def real_probe(request: pytest.FixtureRequest) -> Iterator[ProbeHarness]:
    yield from _harness(request.param)


def _harness(kind: str) -> Iterator[ProbeHarness]:
    if kind == "fake":
        fake = FakeSlotProbe()
        yield ProbeHarness(kind, fake, fake=fake)
    elif kind.startswith("memory"):
        clock = FakeClock()
        if kind.endswith("async"):
            scripted: ScriptedTransport = AsyncScriptedTransport(clock, header_bytes=HEADER_BYTES)
            probe: SlotProbe = Awaited(AsyncHttpSlotProbe(scripted, AsyncFakeClock(clock), LIMITS))  # type: ignore[arg-type]
        else:
            scripted = ScriptedTransport(clock, header_bytes=HEADER_BYTES)
            probe = HttpSlotProbe(scripted, clock, LIMITS)
        yield ProbeHarness(kind, probe, routes=scripted, clock=clock)
    else:
        with FakeServer() as server:
            yield ProbeHarness(kind, uds_probe(kind, server.socket_path), routes=server)


def uds_probe(kind: str, socket_path: str) -> SlotProbe:
    """The real probe of `kind`'s flavour on a Unix socket."""
    if kind.endswith("async"):
        return Awaited(
            AsyncHttpSlotProbe(AsyncUdsTransport(socket_path, header_bytes=HEADER_BYTES), AsyncSystemClock(), LIMITS)
        )
    return HttpSlotProbe(UdsTransport(socket_path, header_bytes=HEADER_BYTES), SystemClock(), LIMITS)


# -- every implementation ------------------------------------------------------------------------


def test_a_processing_slot_is_busy_and_a_free_one_idle(any_probe: ProbeHarness) -> None:
    any_probe.set_slots([True, False])
    assert isinstance(any_probe.probe, SlotProbe)
    assert any_probe.probe.state(0) is BUSY
    assert any_probe.probe.state(1) is IDLE


def test_a_slot_the_server_does_not_have_is_unavailable(any_probe: ProbeHarness) -> None:
    any_probe.set_slots([False, False])
    assert any_probe.probe.state(2) is UNAVAILABLE


def test_a_negative_slot_is_a_bug(any_probe: ProbeHarness) -> None:
    with pytest.raises(ValueError, match=r"^slot ids are never negative, got -1$"):
        any_probe.probe.state(-1)


# -- the real probe: every server fault is unavailable, silence unresponsive ---------------------

FAULTS: dict[str, RouteItem] = {
    "501 with --no-slots": error_reply(501, "This server does not support slots endpoint.", "not_supported_error"),
    "404": error_reply(404, "File Not Found", "not_found_error"),
    "malformed JSON": Reply(pieces=[Piece(0, b"[{")]),
    "an object instead of a list": json_reply({"id": 0, "is_processing": True}),
    "is_processing missing": json_reply([{"id": 0}]),
    "is_processing not a bool": json_reply([{"id": 0, "is_processing": 1}]),
    "the id as a string": json_reply([{"id": "0", "is_processing": False}]),
    "entries that are not objects": json_reply([0, None, "x"]),
    "a cut before the head": Raw((), End.CLOSE),
    "a cut inside the body": Reply(headers=[("Content-Length", "100")], pieces=[Piece(0, b"[")]),
    "garbage": Raw([Piece(0, b"\x00\x01\x02\r\n\r\n")]),
    "a body over the limit": Reply(pieces=[Piece(0, b" " * (4 * 1024 * 1024 + 1))]),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_server_fault_is_unavailable_never_an_exception(real_probe: ProbeHarness, fault: str) -> None:
    real_probe.serve(FAULTS[fault])
    assert real_probe.probe.state(0) is UNAVAILABLE


def test_a_refused_connection_is_unavailable(real_probe: ProbeHarness, tmp_path: Path) -> None:
    if isinstance(real_probe.routes, ScriptedTransport):
        real_probe.routes.refusing = True
        probe = real_probe.probe
    else:
        probe = uds_probe(real_probe.kind, str(tmp_path / "missing.sock"))
    assert probe.state(0) is UNAVAILABLE


SILENCES: dict[str, RouteItem] = {
    "no head": silence(),
    "a late head": Reply(head_delay_s=0.5),
    "a body that stops": Reply(headers=[("Content-Length", "50")], pieces=[Piece(0, b"[")], end=End.SILENCE),
    "a head that stops": Raw([Piece(0, b"HTTP/1.1 200 OK\r\nContent-")], End.SILENCE),
}


@pytest.mark.parametrize("script", list(SILENCES.values()), ids=list(SILENCES))
def test_silence_is_unresponsive_within_the_probes_own_timeout(
    real_probe: ProbeHarness, script: RouteItem, caplog: pytest.LogCaptureFixture
) -> None:
    # It took the connection and answered nothing (paused with SIGSTOP, stuck in a decode).
    real_probe.serve(script)
    start = real_probe.now()
    with caplog.at_level(logging.WARNING, logger="inferpath.probe"):
        assert real_probe.probe.state(0) is UNRESPONSIVE
    elapsed = real_probe.elapsed(start)
    if real_probe.clock is not None:
        assert elapsed == pytest.approx(TIMEOUT_S)
        expected = "slot 0: /slots probe: no answer within 100 ms (unresponsive: paused or stuck)"
        assert [r.getMessage() for r in caplog.records] == [expected]
    else:
        assert TIMEOUT_S * 0.8 <= elapsed < TIMEOUT_S + 1.0
        (record,) = caplog.records
        assert re.fullmatch(
            r"slot 0: /slots probe: no answer within \d+ ms \(unresponsive: paused or stuck\)", record.getMessage()
        )
    assert caplog.records[0].levelno == logging.WARNING


LOUD_FAULTS: dict[str, tuple[RouteItem, str]] = {
    # At once: what a proxy does to a connection it refuses (`ProxyRefused`, a `StreamClosedEarly`).
    "a cut before the head": (Raw((), End.CLOSE), "slot 0: /slots probe failed (ProxyRefused: "),
    "a cut inside the body": (
        Reply(headers=[("Content-Length", "100")], pieces=[Piece(0, b"[")]),
        "slot 0: /slots probe failed (StreamClosedEarly: ",
    ),
    "garbage": (Raw([Piece(0, b"\x00\x01\x02\r\n\r\n")]), "slot 0: /slots probe failed (ProtocolError)"),
}


@pytest.mark.parametrize("fault", list(LOUD_FAULTS))
def test_a_server_that_answers_or_cuts_is_unavailable_and_logged_by_its_error_type(
    real_probe: ProbeHarness, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    script, logged = LOUD_FAULTS[fault]
    real_probe.serve(script)
    with caplog.at_level(logging.WARNING, logger="inferpath.probe"):
        assert real_probe.probe.state(0) is UNAVAILABLE
    (record,) = caplog.records
    assert record.getMessage().startswith(logged)
    assert "no answer" not in record.getMessage()
    assert "Loading model" not in record.getMessage(), "never the server's text"


def test_a_refused_connection_is_unavailable_not_unresponsive(
    real_probe: ProbeHarness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if isinstance(real_probe.routes, ScriptedTransport):
        real_probe.routes.refusing = True
        probe = real_probe.probe
    else:
        probe = uds_probe(real_probe.kind, str(tmp_path / "missing.sock"))
    with caplog.at_level(logging.WARNING, logger="inferpath.probe"):
        assert probe.state(0) is UNAVAILABLE
    (record,) = caplog.records
    assert record.getMessage().startswith("slot 0: /slots probe failed (ConnectError: cannot connect to ")


def test_a_server_that_falls_silent_then_answers_again_is_followed(real_probe: ProbeHarness) -> None:
    real_probe.serve(slots_reply([True]), silence(), loading(), slots_reply([False]))
    assert [real_probe.probe.state(0) for _ in range(4)] == [BUSY, UNRESPONSIVE, SlotState.LOADING, IDLE]


def test_each_probe_asks_get_slots_on_its_own_connection_and_closes_it(real_probe: ProbeHarness) -> None:
    real_probe.serve(slots_reply([True]))
    real_probe.probe.state(0)
    real_probe.probe.state(0)
    assert real_probe.routes is not None
    requests = real_probe.routes.requests
    assert [(r.method, r.target, r.body) for r in requests] == [("GET", "/slots", b"")] * 2
    assert all(r.client_closed.wait(2.0) for r in requests)


def test_the_answer_follows_the_server_from_one_probe_to_the_next(real_probe: ProbeHarness) -> None:
    real_probe.serve(loading(), slots_reply([True]), slots_reply([False]))
    assert [real_probe.probe.state(0) for _ in range(4)] == [SlotState.LOADING, BUSY, IDLE, IDLE]


def test_a_server_that_says_it_is_loading_is_loading_and_logged_so(
    real_probe: ProbeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    # 503 "Loading model" (a single-model server, or a router's child), and the router's own
    # plain-text 500 while a child starts, both say the model is on its way.
    real_probe.serve(
        loading(),
        Reply(
            status=500,
            headers=[("Content-Type", "text/plain")],
            pieces=[Piece(0, b"proxy error: Could not establish connection")],
        ),
    )
    with caplog.at_level(logging.WARNING, logger="inferpath.probe"):
        assert [real_probe.probe.state(0) for _ in range(2)] == [SlotState.LOADING] * 2
    assert [r.getMessage() for r in caplog.records] == [
        "slot 0: /slots probe: the model is loading (HTTP 503)",
        "slot 0: /slots probe: the model is loading (HTTP 500)",
    ]


def test_a_slot_with_full_llama_server_fields_is_read(real_probe: ProbeHarness) -> None:
    real_probe.serve(
        json_reply(
            [
                {
                    "id": 0,
                    "id_task": 12,
                    "n_ctx": 4096,
                    "speculative": False,
                    "is_processing": True,
                    "params": {"n_predict": -1, "samplers": ["top_k"]},
                    "next_token": {"has_next_token": True},
                },
                {"id": 1, "n_ctx": 4096, "speculative": False, "is_processing": False},
            ]
        )
    )
    assert (real_probe.probe.state(0), real_probe.probe.state(1)) == (BUSY, IDLE)


def test_the_real_probe_refuses_a_negative_slot_in_both_flavours(real_probe: ProbeHarness) -> None:
    with pytest.raises(ValueError, match=r"^slot ids are never negative, got -3$"):
        real_probe.probe.state(-3)
    assert real_probe.routes is not None
    assert real_probe.routes.requests == [], "nothing is asked of the server"


def test_a_slot_missing_from_the_answer_is_unavailable_and_logged_so(
    real_probe: ProbeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    real_probe.set_slots([False, False])
    with caplog.at_level(logging.WARNING, logger="inferpath.probe"):
        assert real_probe.probe.state(2) is UNAVAILABLE
    assert [r.getMessage() for r in caplog.records] == ["slot 2: /slots answer has no readable entry for this slot"]


def test_a_probe_for_a_call_already_cancelled_aborts_its_connection_and_answers_unavailable_at_once(
    real_probe: ProbeHarness,
) -> None:
    real_probe.serve(silence())  # a probe that went on would wait its timeout and be unresponsive
    token = CancelToken()
    token.cancel()
    start = real_probe.now()

    assert real_probe.probe.state(0, token) is UNAVAILABLE
    assert real_probe.elapsed(start) < TIMEOUT_S


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_unresponsive_warning_names_how_long_the_probe_waited(
    flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(start=1000.0)
    limits = FetchLimits(1.5, 1.5, BODY_BYTES, 4096)
    if flavour == "async":
        scripted: ScriptedTransport = AsyncScriptedTransport(clock, header_bytes=HEADER_BYTES)
        probe: SlotProbe = Awaited(AsyncHttpSlotProbe(scripted, AsyncFakeClock(clock), limits))  # type: ignore[arg-type]
    else:
        scripted = ScriptedTransport(clock, header_bytes=HEADER_BYTES)
        probe = HttpSlotProbe(scripted, clock, limits)
    scripted.route("GET", "/slots", silence())

    with caplog.at_level(logging.WARNING, logger="inferpath.probe"):
        assert probe.state(0) is UNRESPONSIVE

    expected = "slot 0: /slots probe: no answer within 1500 ms (unresponsive: paused or stuck)"
    assert [r.getMessage() for r in caplog.records] == [expected]
