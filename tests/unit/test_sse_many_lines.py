"""An SSE event of many short `data:` lines: one outcome however its bytes are split, at a cost
that grows with its bytes, not with its lines, and a cap that names itself when it is passed.

Cost is counted, not timed: the calls the decoder makes (its own functions and the bytes methods
it calls, seen by `sys.setprofile`) while fed, which do not depend on the machine's speed.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_support import stream_limits
from domain.chat_stream import ChatStream
from domain.errors import InferError, ProtocolError
from domain.sse import SseData, SseDecoder, SseEvent

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
LINES = 300_000


@dataclass(frozen=True)
class Outcome:
    events: tuple[SseEvent, ...]
    error: str | None = None  # the ProtocolError's words


def decode(pieces: list[bytes], max_line: int = MIB) -> Outcome:
    decoder = SseDecoder(max_line)
    events: list[SseEvent] = []
    try:
        for piece in pieces:
            events += decoder.feed(piece)
        decoder.feed(b"")  # a failure held back behind events is raised now
    except ProtocolError as exc:
        return Outcome(tuple(events), str(exc))
    return Outcome(tuple(events))


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def random_splits(data: bytes, seed: int, most: int = 20_000) -> list[bytes]:
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(data):
        n = rng.randint(1, most)
        out.append(data[at : at + n])
        at += n
    return out


def many_lines(lines: int, line: bytes = b"data: x\n") -> bytes:
    return line * lines + b"\n"


# -- one outcome whatever the chunking ------------------------------------------------------------


def test_an_event_of_300000_short_data_lines_is_one_event_however_it_is_split() -> None:
    event = many_lines(LINES)
    expected = Outcome((SseData("\n".join(["x"] * LINES)),))
    assert decode([event]) == expected
    assert decode(reads(event, 65536)) == expected
    for seed in range(3):
        assert decode(random_splits(event, seed)) == expected, seed


def test_a_smaller_event_of_many_lines_fed_one_byte_at_a_time_is_the_same_event() -> None:
    event = many_lines(5000, b"data:  x\n") + many_lines(3000, b"data:\n")
    whole = decode([event])
    assert whole == Outcome((SseData("\n".join([" x"] * 5000)), SseData("\n".join([""] * 3000))))
    assert decode(reads(event, 1)) == whole


def test_the_stream_ends_such_an_event_as_data_that_is_not_json_at_any_chunking() -> None:
    # Not a stall: the fake `now` never moves, and the outcome is the event's own.
    event = b'data: {"id":"chatcmpl-1","choices":[]}\n\n' + many_lines(LINES)
    for pieces in ([event], reads(event, 65536), random_splits(event, 7)):
        stream = ChatStream(stream_limits(sse_line_bytes=MIB), 100, 0.0)
        steps: list[object] = []
        for piece in pieces:
            steps += stream.feed(piece, 0.0)
            if steps and isinstance(steps[-1], InferError):
                break
        assert len(steps) == 1 and isinstance(steps[0], ProtocolError)
        assert str(steps[0]).startswith("SSE data is not valid JSON")


# -- the caps, and the joined bound they give -------------------------------------------------------


def chunkings(data: bytes, seed: int = 0) -> list[list[bytes]]:
    return [[data], reads(data, 65536), reads(data, 65537), random_splits(data, seed)]


def test_one_data_line_more_than_the_limit_is_refused_naming_the_cap_at_any_chunking() -> None:
    event = many_lines(MIB + 1, b"data:\n")
    for pieces in chunkings(event):
        assert decode(pieces) == Outcome((), f"SSE event of more than {MIB} data lines")


def test_one_byte_of_data_more_than_the_limit_is_refused_naming_the_cap_at_any_chunking() -> None:
    event = b"data: 12345678\n" * (MIB // 8) + b"data: 9\n\n"  # a byte over, in the last line
    for pieces in chunkings(event):
        assert decode(pieces) == Outcome((), f"SSE event data over {MIB} bytes")


def test_the_largest_event_joins_to_twice_the_limit_less_a_byte_and_one_more_is_refused() -> None:
    limit = 100
    largest = b"data: v\n" * limit + b"\n"  # `limit` bytes of values in `limit` lines
    text = "\n".join(["v"] * limit)
    assert len(text) == 2 * limit - 1
    byte_more = b"data: vv\n" + largest[8:]
    line_more = b"data:\n" + largest
    for pieces in [*chunkings(largest), reads(largest, 1)]:
        assert decode(pieces, limit) == Outcome((SseData(text),))
    for pieces in [*chunkings(byte_more), reads(byte_more, 1)]:
        assert decode(pieces, limit) == Outcome((), f"SSE event data over {limit} bytes")
    for pieces in [*chunkings(line_more), reads(line_more, 1)]:
        assert decode(pieces, limit) == Outcome((), f"SSE event of more than {limit} data lines")


def test_a_line_over_the_limit_among_many_data_lines_is_refused_as_a_line() -> None:
    limit = 30_000
    event = b"data: x\n" * 10_000 + b"data: " + b"y" * (limit - 5) + b"\n" + many_lines(10_000)
    for pieces in chunkings(event):
        outcome = decode(pieces, limit)
        assert outcome.events == ()
        assert outcome.error is not None and outcome.error.startswith("SSE line"), outcome.error


# -- every shape of data line, against the line-by-line rule ----------------------------------------


VALUES = st.lists(
    st.sampled_from([b"", b" ", b"  ", b"x", b" x", b"data:", b" data: x", b"\xc3\xa9", b"{}", b":"]),
    max_size=4,
).map(b"".join)


def expected(raws: list[bytes], max_line: int) -> Outcome:
    """The WHATWG rule line by line, with the decoder's caps, written out plainly."""
    values: list[bytes] = []
    size = 0
    for raw in raws:
        line = b"data:" + raw
        if len(line) > max_line:
            return Outcome((), f"SSE line of {len(line)} bytes, over {max_line} bytes")
        value = raw[1:] if raw[:1] == b" " else raw
        size += len(value)
        if size > max_line:
            return Outcome((), f"SSE event data over {max_line} bytes")
        if len(values) >= max_line:
            return Outcome((), f"SSE event of more than {max_line} data lines")
        values.append(value)
    return Outcome((SseData(b"\n".join(values).decode()),))


@settings(max_examples=500, deadline=None)
@given(raws=st.lists(VALUES, min_size=1, max_size=60), max_line=st.integers(8, 120), seed=st.integers(0, 99))
def test_any_event_of_data_lines_is_what_the_line_by_line_rule_makes_of_it(
    raws: list[bytes], max_line: int, seed: int
) -> None:
    event = b"".join(b"data:" + raw + b"\n" for raw in raws) + b"\n"
    want = expected(raws, max_line)
    for pieces in ([event], reads(event, 1), random_splits(event, seed, most=40)):
        got = decode(pieces, max_line)
        if want.error is not None and want.error.startswith("SSE line"):
            # Its words say whether the line was still unterminated when it passed the limit.
            assert got.events == () and got.error is not None and got.error.startswith("SSE line")
        else:
            assert got == want


# -- the cost grows with the bytes, not with the lines ---------------------------------------------


def calls_while_feeding(pieces: list[bytes], max_line: int) -> int:
    """The calls (Python and built-in) made while `pieces` were fed, on a thread of its own."""
    counted: list[int] = []

    def work() -> None:
        decoder = SseDecoder(max_line)
        calls = 0

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal calls
            if event in ("call", "c_call"):
                calls += 1

        feed: Callable[[bytes], list[SseEvent]] = decoder.feed
        sys.setprofile(profile)
        try:
            for piece in pieces:
                feed(piece)
        finally:
            sys.setprofile(None)
        counted.append(calls)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return counted[0]


def test_an_event_of_many_short_lines_costs_the_calls_of_one_of_few_long_lines() -> None:
    # The same bytes in the same reads: 300,000 lines of 8 bytes, or 3,000 of 800.
    short = many_lines(LINES)
    long = many_lines(LINES // 100, b"data: " + b"x" * 793 + b"\n")
    assert len(long) == len(short)
    many, few = (calls_while_feeding(reads(event, 65536), 4 * MIB) for event in (short, long))
    # Some twenty calls a read either way (37 reads); a step per line would be 300,000 and more.
    assert many <= few + 100, (many, few)
    assert many <= 30 * len(reads(short, 65536)), many


@pytest.mark.parametrize(("read", "lines"), [(65536, LINES // 4), (1, 2000)], ids=["64 KiB reads", "1-byte reads"])
def test_four_times_the_lines_cost_at_most_four_times_the_calls(read: int, lines: int) -> None:
    small, large = (calls_while_feeding(reads(many_lines(n), read), 4 * MIB) for n in (lines, 4 * lines))
    assert small < large <= 4 * small + 100, (small, large)
