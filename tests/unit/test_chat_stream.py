"""ChatStream: the thinking cap ends a feed at once, and a stream that ended takes no more bytes."""

from __future__ import annotations

import orjson
import pytest

from client_support import stream_limits
from domain.chat_stream import ChatStream, PostReasoningEnd, StreamLimits
from domain.errors import ProtocolError, Stalled, StreamClosedEarly, ThinkingOverrun
from domain.events import Reasoning, ThinkingCapped

OVER = "^the stream is over: no more bytes are taken$"


def limits(thinking_cap: int = 100, thinking_overrun: int = 0) -> StreamLimits:
    return stream_limits(thinking_cap=thinking_cap, thinking_overrun=thinking_overrun)


def reasoning(*texts: str, cid: str | None = "chatcmpl-1") -> bytes:
    """One SSE event per text, each a chunk carrying that reasoning text."""
    out = b""
    for text in texts:
        chunk: dict[str, object] = {"choices": [{"index": 0, "delta": {"reasoning_content": text}}]}
        if cid is not None:
            chunk["id"] = cid
        out += b"data: " + orjson.dumps(chunk) + b"\n\n"
    return out


def test_every_reasoning_chunk_of_one_feed_below_the_cap_is_returned() -> None:
    stream = ChatStream(limits(), max_tokens=1000, now=0.0)
    assert stream.feed(reasoning("a", "b", "c"), now=0.1) == [Reasoning("a"), Reasoning("b"), Reasoning("c")]


def test_the_cap_without_a_completion_id_ends_the_stream_at_that_chunk() -> None:
    stream = ChatStream(limits(thinking_cap=1), max_tokens=1000, now=0.0)
    steps = stream.feed(reasoning("a", "b", cid=None), now=0.1)
    assert steps[0] == Reasoning("a")
    assert len(steps) == 2
    assert isinstance(steps[1], ThinkingOverrun)
    assert str(steps[1]) == (
        "reasoning_end posted at 1 reasoning tokens was not accepted: the stream carried no completion id"
    )
    with pytest.raises(ProtocolError, match=OVER):
        stream.feed(reasoning("c"), now=0.2)


def test_reasoning_past_the_overrun_ends_the_feed_at_that_chunk() -> None:
    stream = ChatStream(limits(thinking_cap=1, thinking_overrun=0), max_tokens=1000, now=0.0)
    assert stream.feed(reasoning("a"), now=0.1) == [Reasoning("a"), PostReasoningEnd("chatcmpl-1")]
    assert stream.control_answered(None) == ThinkingCapped(tokens=1)
    steps = stream.feed(reasoning("b", "c"), now=0.2)
    assert steps[0] == Reasoning("b")
    assert len(steps) == 2
    assert isinstance(steps[1], ThinkingOverrun)
    with pytest.raises(ProtocolError, match=OVER):
        stream.feed(reasoning("d"), now=0.3)


def test_a_refused_control_call_ends_the_stream() -> None:
    stream = ChatStream(limits(thinking_cap=1), max_tokens=1000, now=0.0)
    assert stream.feed(reasoning("a"), now=0.1)[-1] == PostReasoningEnd("chatcmpl-1")
    with pytest.raises(ThinkingOverrun) as caught:
        stream.control_answered("")
    assert str(caught.value) == "reasoning_end posted at 1 reasoning tokens was not accepted: "
    with pytest.raises(ProtocolError, match=OVER):
        stream.feed(reasoning("b"), now=0.2)


def test_silence_that_stalled_the_stream_ends_it() -> None:
    stream = ChatStream(limits(), max_tokens=1000, now=0.0)
    stream.silence(0.5)  # not yet
    with pytest.raises(Stalled):
        stream.silence(1.0)
    with pytest.raises(ProtocolError, match=OVER):
        stream.feed(reasoning("late"), now=1.1)


def timings(predicted_n: int) -> bytes:
    """A chunk that carries only timings: progress only while `predicted_n` grows up to max_tokens."""
    return (
        b"data: " + orjson.dumps({"id": "chatcmpl-1", "choices": [], "timings": {"predicted_n": predicted_n}}) + b"\n\n"
    )


def test_tokens_past_max_tokens_are_no_progress_and_the_silence_ends_in_stalled() -> None:
    stream = ChatStream(limits(), max_tokens=10, now=0.0)
    assert stream.feed(timings(5), now=0.9) == []  # progress: the silence restarts at 0.9
    assert stream.feed(timings(11), now=1.5) == []  # past max_tokens: no progress
    steps = stream.feed(timings(12), now=2.0)
    assert len(steps) == 1
    assert isinstance(steps[0], Stalled)
    assert str(steps[0]) == "no data for 1100 ms (liveness limit 1000 ms)"
    with pytest.raises(ProtocolError, match=OVER):
        stream.feed(timings(13), now=2.1)


@pytest.mark.parametrize("how", ["a read that timed out", "bytes that came too late"])
def test_a_stall_either_way_is_resumed_by_a_re_attach_and_the_stream_goes_on(how: str) -> None:
    stream = ChatStream(limits(), max_tokens=10, now=0.0)
    assert stream.feed(reasoning("a"), now=0.5) == [Reasoning("a")]
    if how == "a read that timed out":
        with pytest.raises(Stalled):
            stream.silence(1.5)
    else:
        steps = stream.feed(b": ping\n\n", now=1.5)
        assert len(steps) == 1 and isinstance(steps[0], Stalled)
    with pytest.raises(ProtocolError, match=OVER):
        stream.feed(reasoning("b"), now=1.6)  # stalled: nothing until it is resumed
    stream.resumed(2.0)
    assert stream.feed(reasoning("b"), now=2.1) == [Reasoning("b")]
    assert stream.timeout(2.1) == pytest.approx(1.0)  # the silence restarted at the chunk


def test_done_before_the_final_chunk_ends_the_stream_at_once() -> None:
    stream = ChatStream(limits(), max_tokens=10, now=0.0)
    steps = stream.feed(reasoning("a") + b"data: [DONE]\n\n", now=0.1)
    assert steps[0] == Reasoning("a")
    assert len(steps) == 2
    assert isinstance(steps[1], StreamClosedEarly)


@pytest.mark.parametrize(
    "bad",
    [b"data: " + b"x" * (1 << 16) + b"\n\n", b"data: \xff\xfe\n\n", b"data: " + b"x" * (1 << 16)],
    ids=["line over the cap", "invalid UTF-8", "unterminated line over the cap"],
)
def test_a_broken_line_behind_good_events_ends_the_feed_that_brought_it(bad: bytes) -> None:
    # Not held back for a next read that may never come (silence would then read as a stall,
    # and a broken stream be picked up again or its request sent twice).
    stream = ChatStream(limits(), max_tokens=1000, now=0.0)
    steps = stream.feed(reasoning("a") + bad, now=0.1)
    assert steps[0] == Reasoning("a")
    assert isinstance(steps[-1], ProtocolError) and len(steps) == 2
    with pytest.raises(ProtocolError, match=OVER):
        stream.feed(b"data: {}\n\n", now=0.2)
