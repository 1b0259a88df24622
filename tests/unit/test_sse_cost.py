"""The SSE decoder's cost is linear in the bytes received, however a server splits them.

A server that sends a long line one byte per read must not make the decoder copy or rescan the
unfinished line on every read. Work is measured as bytes allocated while feeding (the decoder
copies only into new objects: joins, slices, buffers), which does not depend on the machine's
load; one side-by-side CPU comparison with a generous margin checks the same in time.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from domain.errors import ProtocolError
from domain.sse import SseData, SseDecoder, SseEvent

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
SMALL = 1024


def one_line_event(size: int) -> bytes:
    """One event whose only line is `size` bytes long."""
    return b"data: " + b"x" * (size - 6) + b"\n\n"


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def allocated_while_feeding(chunks: list[bytes], max_line: int) -> tuple[int, list[SseEvent]]:
    """The bytes the decoder allocated in proportion to what it was fed, over all the feeds, and
    the events it returned. Each feed counts its peak above what was traced before it, when that
    is at least `SMALL`: every call allocates a few small objects (its result list among them)
    whatever the line's length, and those are the per-call cost, not copying.

    Measured on a thread of its own: tracemalloc walks the whole stack on every allocation, and
    a fresh thread's stack is a few frames deep where the test runner's is dozens."""
    result: list[tuple[int, list[SseEvent]]] = []
    thread = threading.Thread(target=lambda: result.append(_allocated(chunks, max_line)))
    thread.start()
    thread.join()
    return result[0]


def _allocated(chunks: list[bytes], max_line: int) -> tuple[int, list[SseEvent]]:
    decoder = SseDecoder(max_line=max_line)
    events: list[SseEvent] = []
    total = 0
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for chunk in chunks:
            tracemalloc.reset_peak()
            got = decoder.feed(chunk)
            after, peak = tracemalloc.get_traced_memory()
            if peak - before >= SMALL:
                total += peak - before
            before = after
            if got:
                events += got
    finally:
        tracemalloc.stop()
    return total, events


# Tracemalloc makes every allocation cost microseconds, so the 1 MiB line is fed 16 bytes at a
# time (65,536 reads, as many as the 64 KiB line's one byte at a time).
@pytest.mark.parametrize(("size", "read"), [(64 * 1024, 1), (MIB, 16)], ids=["64 KiB by 1", "1 MiB by 16"])
def test_a_long_line_in_tiny_reads_costs_what_it_costs_in_whole_reads(size: int, read: int) -> None:
    event = one_line_event(size)
    tiny, tiny_events = allocated_while_feeding(list(pieces(event, read)), max_line=size)
    whole, whole_events = allocated_while_feeding(list(pieces(event, 65536)), max_line=size)
    assert tiny_events == whole_events == [SseData("x" * (size - 6))]
    assert tiny <= 1.5 * whole, f"{read}-byte reads allocated {tiny:,} bytes, 64 KiB reads {whole:,}"
    # Linear, not merely alike: a few copies of the line (the buffer, its join, the data, the text).
    assert whole <= 8 * size


def test_an_unfinished_line_in_one_byte_reads_copies_nothing_per_read() -> None:
    size = 64 * 1024
    start = one_line_event(size)[:-2]  # the line without its end
    allocated, events = allocated_while_feeding(list(pieces(start, 1)), max_line=size)
    assert events == []
    # The line's buffer grows by a fraction of its size at a time: about once its size in all.
    assert allocated <= 2 * size, f"{allocated:,} bytes allocated for a {size:,}-byte partial line"


def test_the_line_limit_still_fails_at_the_byte_that_passes_it_in_one_byte_reads() -> None:
    decoder = SseDecoder(max_line=1000)
    line = b"data: " + b"x" * 2000
    fed = 0
    with pytest.raises(ProtocolError) as caught:
        for chunk in pieces(line, 1):
            decoder.feed(chunk)
            fed += 1
    assert fed == 1000  # the 1001st byte failed
    assert str(caught.value) == "SSE line over 1000 bytes (still unterminated at 1001 bytes)"


def test_a_line_split_in_reads_of_every_size_decodes_the_same() -> None:
    event = b'data: {"a":"' + "żółw 🐢 ".encode() * 200 + b'"}\r\n\r\ndata: [DONE]\r\n\r\n'
    expected = SseDecoder().feed(event)
    for size in (1, 2, 3, 7, 64, 1000):
        decoder = SseDecoder()
        got: list[SseEvent] = []
        for chunk in pieces(event, size):
            got += decoder.feed(chunk)
        assert got == expected, size


def least_cpu(*works: Callable[[], object], repeats: int = 5) -> list[float]:
    """The least CPU seconds of each of `works`, run in turn `repeats` times, so that a burst of
    load elsewhere on the machine falls on all of them alike."""
    best = [float("inf")] * len(works)
    for _ in range(repeats):
        for index, work in enumerate(works):
            started = time.thread_time()
            work()
            best[index] = min(best[index], time.thread_time() - started)
    return best


def test_one_byte_reads_of_a_long_line_cost_no_more_cpu_than_of_short_lines() -> None:
    # The same bytes and the same number of feed calls: only the length of the unfinished line
    # differs, so a decoder that rescans it pays for it here.
    size = 128 * 1024
    long_event = one_line_event(size)
    short = b"data: " + b"x" * 56 + b"\n\n"
    short_events = short * (len(long_event) // len(short))
    long_chunks = list(pieces(long_event[: len(short_events)], 1))
    short_chunks = list(pieces(short_events, 1))

    def feed_all(chunks: list[bytes]) -> Callable[[], None]:
        def work() -> None:
            decoder = SseDecoder(max_line=size)
            for chunk in chunks:
                decoder.feed(chunk)

        return work

    # Alike within 5% on a quiet machine; a rescan costs 40x and more. The bound leaves room for
    # a machine whose other work thrashes the caches of one run and not the other.
    long_cpu, short_cpu = least_cpu(feed_all(long_chunks), feed_all(short_chunks), repeats=7)
    assert long_cpu <= 2 * short_cpu, f"long line {long_cpu * 1e3:.0f} ms, short lines {short_cpu * 1e3:.0f} ms"


def test_endless_empty_data_lines_are_refused_at_the_line_limit() -> None:
    # Each empty `data:` line adds no data byte but one "\n" to the event: bounded by count.
    decoder = SseDecoder(max_line=100)
    assert decoder.feed(b"data:\n" * 100) == []
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"data:\n")
    assert str(caught.value) == "SSE event of more than 100 data lines"


def test_an_event_of_many_data_lines_up_to_the_limit_is_joined_whole() -> None:
    decoder = SseDecoder(max_line=100)
    assert decoder.feed(b"data: a\n" * 50 + b"data\n" * 50 + b"\n") == [SseData("\n".join(["a"] * 50 + [""] * 50))]
