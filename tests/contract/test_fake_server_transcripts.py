"""Recorded llama-server responses replayed by the fake server (and by the in-memory transport)
and read back by the real client: the bytes and events that come out are the ones the server
sent. The oracle is `tests/transcripts.py`, a small strict de-chunker independent of ours.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.fake_server import FakeClock, FakeServer, ScriptedTransport, raw_reply, split_recorded
from adapters.system import SystemClock
from adapters.uds_http._sync.transport import UdsTransport
from adapters.uds_http.body import ChunkedBody
from app._sync.fetch import HttpSlotProbe, read_all
from domain.bodies import FetchLimits
from domain.sse import SseComment, SseData, SseDecoder, SseDone, parse_chunk
from ports import Exchange, SlotState, Transport
from ports.transport import TIMED_OUT, ResponseHead

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts"
HEADER_BYTES = 16384
BODY_BYTES = 4 * 1024 * 1024

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(
        not (TRANSCRIPTS / "index.json").exists(),
        reason="no recorded transcripts under tests/fixtures/transcripts (run `make transcripts`)",
    ),
]

if (TRANSCRIPTS / "index.json").exists():
    from transcripts import Case, case_names, load_case, sse_payloads

    CASES = case_names()
    STREAMS = [name for name in CASES if load_case(name).response.header("Transfer-Encoding")]
    WHOLE = [name for name in CASES if name not in STREAMS]
else:  # pragma: no cover - collected only to be skipped
    CASES = STREAMS = WHOLE = []


def chunk_payloads(raw: bytes) -> list[bytes]:
    """The data of each chunk exactly as the server wrote it (from the recorded pieces)."""
    payloads = []
    for piece in split_recorded(raw)[1:]:
        size_line, _, rest = piece.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size:
            payloads.append(rest[:size])
    return payloads


def reads(exchange: Exchange) -> tuple[ResponseHead, list[bytes]]:
    head = exchange.head(5.0)
    assert isinstance(head, ResponseHead)
    pieces = []
    while True:
        piece = exchange.read(5.0)
        assert piece is not TIMED_OUT and isinstance(piece, bytes)
        if not piece:
            return head, pieces
        pieces.append(piece)


def recorded_request(case: Case) -> tuple[str, str, bytes | None]:
    method, target, _ = case.request_raw.split(b"\r\n", 1)[0].decode().split(" ")
    return method, target, case.request or None


def replay(transport: Transport, case: Case) -> tuple[ResponseHead, list[bytes]]:
    method, target, body = recorded_request(case)
    exchange = transport.open(method, target, body, timeout=5.0)
    with exchange:  # type: ignore[attr-defined]
        return reads(exchange)


def serve(case: Case, **pacing: object) -> FakeServer:
    method, target, _ = recorded_request(case)
    return FakeServer({(method, target.split("?")[0]): raw_reply(case.response_raw, **pacing)})  # type: ignore[arg-type]


# -- streams -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", STREAMS)
def test_a_recorded_stream_reads_back_chunk_for_chunk(name: str) -> None:
    # One write per recorded chunk, a millisecond apart, so no read ends inside a chunk (when
    # one does, the client hands out the part it has: see the paced test below).
    case = load_case(name)
    with serve(case, delay_s=0.001) as server:
        head, pieces = replay(UdsTransport(server.socket_path, header_bytes=HEADER_BYTES), case)
    assert head.status == case.status
    assert head.headers == tuple((k.lower(), v) for k, v in case.response.headers)
    assert pieces == chunk_payloads(case.response_raw)
    assert b"".join(pieces) == case.body


@pytest.mark.parametrize("name", ["raw_chunked", "tool_call"])
def test_a_recorded_stream_paced_in_odd_pieces_reads_back_the_same_bytes(name: str) -> None:
    case = load_case(name)
    with serve(case, piece_bytes=97, delay_s=0.001) as server:
        _, pieces = replay(UdsTransport(server.socket_path, header_bytes=HEADER_BYTES), case)
    assert b"".join(pieces) == case.body


@pytest.mark.parametrize("name", STREAMS)
def test_the_in_memory_transport_replays_a_recording_like_the_socket(name: str) -> None:
    case = load_case(name)
    method, target, _ = recorded_request(case)
    transport = ScriptedTransport(FakeClock(), {(method, target): raw_reply(case.response_raw, delay_s=0.01)})
    head, pieces = replay(transport, case)
    assert head.status == case.status
    assert pieces == chunk_payloads(case.response_raw)


@pytest.mark.parametrize("name", STREAMS)
def test_the_recorded_chunked_body_de_frames_the_same_byte_by_byte(name: str) -> None:
    case = load_case(name)
    raw_body = case.response_raw.partition(b"\r\n\r\n")[2]
    reader = ChunkedBody("x", 16384)
    out = bytearray()
    for i in range(len(raw_body)):
        reader.push(raw_body[i : i + 1])
        while piece := reader.pull():
            out += piece
    assert reader.pull() == b""
    assert bytes(out) == case.body


@pytest.mark.parametrize("name", STREAMS)
def test_the_recorded_events_decode_to_the_servers_chunks(name: str) -> None:
    case = load_case(name)
    expected = sse_payloads(case.body)
    for pieces in (chunk_payloads(case.response_raw), [case.body[i : i + 1] for i in range(len(case.body))]):
        decoder = SseDecoder()
        events = [event for piece in pieces for event in decoder.feed(piece)] + decoder.end()
        assert not decoder.partial_event
        assert [e.data if isinstance(e, SseData) else "[DONE]" for e in events if not isinstance(e, SseComment)] == (
            expected
        )
        assert isinstance(events[-1], SseDone)
        assert [parse_chunk(e.data) for e in events if isinstance(e, SseData)] == case.events()


# -- whole bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", WHOLE)
def test_a_recorded_whole_response_reads_back_exactly(name: str) -> None:
    case = load_case(name)
    with serve(case) as server:
        method, target, body = recorded_request(case)
        exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open(method, target, body, timeout=5.0)
        with exchange:
            head = exchange.head(5.0)
            assert isinstance(head, ResponseHead)
            assert read_all(exchange, SystemClock(), BODY_BYTES, 5.0) == case.body
    assert head.status == case.status
    assert head.headers == tuple((k.lower(), v) for k, v in case.response.headers)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("slots", [SlotState.IDLE, SlotState.IDLE]), ("slots_busy", [SlotState.BUSY, SlotState.IDLE])],
)
def test_the_slot_probe_reads_the_recorded_slots(name: str, expected: list[SlotState]) -> None:
    case = load_case(name)
    with serve(case) as server:
        transport = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES)
        probe = HttpSlotProbe(transport, SystemClock(), FetchLimits(2.0, 2.0, BODY_BYTES, 4096))
        assert [probe.state(0), probe.state(1), probe.state(2)] == [*expected, SlotState.UNAVAILABLE]
