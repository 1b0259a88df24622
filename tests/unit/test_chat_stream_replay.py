"""A re-attach asks for the last bytes read again (at most `REPLAY_OVERLAP_BYTES`, the last read
that fed anything) and its replay must begin with them: checked as they come, in any split, not
fed twice; a replay that begins elsewhere is a `ProtocolError` even where its bytes would parse."""

from __future__ import annotations

import orjson
import pytest

from client_support import stream_limits
from domain.chat_stream import REPLAY_OVERLAP_BYTES, ChatStream
from domain.errors import ProtocolError, StreamClosedEarly
from domain.events import Content


def content(*texts: str) -> bytes:
    out = b""
    for text in texts:
        chunk = {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": text}}]}
        out += b"data: " + orjson.dumps(chunk) + b"\n\n"
    return out


def stream_that_read(*reads: bytes) -> ChatStream:
    stream = ChatStream(stream_limits(), max_tokens=100, now=0.0)
    for data in reads:
        stream.feed(data, now=0.1)
    return stream


BODY = content(" one", " two", " three")
FIRST, SECOND = BODY[:150], BODY[150:]


def test_the_replay_is_asked_from_the_last_bytes_read_which_it_must_repeat() -> None:
    stream = stream_that_read(FIRST)

    offset, overlap = stream.replay(len(FIRST))

    assert overlap == FIRST[-REPLAY_OVERLAP_BYTES:]
    assert offset == len(FIRST) - REPLAY_OVERLAP_BYTES


@pytest.mark.parametrize("last", [10, 1], ids=["a short last read", "one-byte reads"])
def test_the_bytes_repeated_are_the_last_fed_across_reads_however_short_each(last: int) -> None:
    # A short last read alone (the start every chunk shares, a keep-alive) would tell little.
    reads = [FIRST[:-last]] + [FIRST[i : i + 1] for i in range(len(FIRST) - last, len(FIRST))]
    stream = stream_that_read(*reads)

    assert stream.replay(len(FIRST)) == (len(FIRST) - REPLAY_OVERLAP_BYTES, FIRST[-REPLAY_OVERLAP_BYTES:])


def test_fewer_bytes_than_the_overlap_read_are_repeated_whole() -> None:
    stream = stream_that_read(FIRST[:20], FIRST[20:30])

    assert stream.replay(30) == (0, FIRST[:30])


def test_nothing_read_is_a_replay_from_the_start_with_nothing_to_repeat() -> None:
    assert stream_that_read().replay(0) == (0, b"")


def test_after_a_replay_the_bytes_repeated_next_are_the_last_fed_across_the_cut() -> None:
    stream = stream_that_read(FIRST)
    offset, overlap = stream.replay(len(FIRST))
    stream.resumed(1.0, overlap)
    stream.feed(BODY[offset : len(FIRST) + 5], now=1.1)  # the overlap, then 5 new bytes

    assert stream.replay(len(FIRST) + 5) == (
        len(FIRST) + 5 - REPLAY_OVERLAP_BYTES,
        BODY[len(FIRST) + 5 - 64 : len(FIRST) + 5],
    )


@pytest.mark.parametrize("split", [1, 7, 64, 65, 100])
def test_a_replay_that_repeats_them_goes_on_as_if_uncut_whatever_its_split(split: int) -> None:
    whole = stream_that_read()
    expected = whole.feed(FIRST, now=0.1) + whole.feed(SECOND, now=0.1)
    stream = stream_that_read(FIRST)
    offset, overlap = stream.replay(len(FIRST))
    stream.resumed(1.0, overlap)
    replay = BODY[offset:]

    steps = stream.feed(replay[:split], now=1.1) + stream.feed(replay[split:], now=1.1)

    assert [s for s in expected if isinstance(s, Content)][1:] == [s for s in steps if isinstance(s, Content)]


@pytest.mark.parametrize("piece", [None, 1], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("off_by", [-2, -1, 1, 5])
def test_a_replay_from_a_few_bytes_off_is_a_protocol_error_even_where_it_would_parse(
    off_by: int, piece: int | None
) -> None:
    stream = stream_that_read(FIRST)
    offset, overlap = stream.replay(len(FIRST))
    stream.resumed(1.0, overlap)
    replay = BODY[offset + off_by :]
    pieces = [replay] if piece is None else [replay[i : i + 1] for i in range(len(replay))]

    with pytest.raises(ProtocolError, match="the replay does not begin where the stream broke"):
        for data in pieces:
            stream.feed(data, now=1.1)
    with pytest.raises(ProtocolError, match="the stream is over"):
        stream.feed(BODY[len(FIRST) :], now=1.2)  # nothing more is taken, the right bytes neither
    with pytest.raises(ProtocolError, match="cannot be resumed"):
        stream.resumed(1.3, overlap)


def test_a_replay_wrong_only_in_its_last_repeated_byte_is_a_protocol_error() -> None:
    stream = stream_that_read(FIRST)
    _, overlap = stream.replay(len(FIRST))
    stream.resumed(1.0, overlap)
    wrong = overlap[:-1] + bytes([overlap[-1] ^ 1]) + SECOND

    with pytest.raises(ProtocolError, match="the replay does not begin where the stream broke"):
        stream.feed(wrong, now=1.1)


def test_a_replay_cut_inside_the_repeated_bytes_is_asked_again_from_the_same_place() -> None:
    stream = stream_that_read(FIRST)
    offset, overlap = stream.replay(len(FIRST))
    stream.resumed(1.0, overlap)
    assert stream.feed(BODY[offset : offset + 20], now=1.1) == []  # 20 of the 64 repeated, then a cut

    assert stream.replay(offset + 20) == (offset, overlap)


def test_a_replay_that_ends_inside_the_repeated_bytes_is_stream_closed_early() -> None:
    stream = stream_that_read(FIRST)
    offset, overlap = stream.replay(len(FIRST))
    stream.resumed(1.0, overlap)
    stream.feed(BODY[offset : offset + 20], now=1.1)

    with pytest.raises(StreamClosedEarly, match="the replay ended inside the bytes it was to begin with"):
        stream.feed(b"", now=1.2)
    with pytest.raises(ProtocolError, match="cannot be resumed"):
        stream.resumed(1.3, overlap)


def test_the_overlap_is_the_64_bytes_the_readme_names() -> None:
    assert REPLAY_OVERLAP_BYTES == 64
