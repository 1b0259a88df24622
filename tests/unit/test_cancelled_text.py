"""What a `Cancelled` carries of the answer (`content`, `reasoning`): the text of the `Content` and
`Reasoning` events the stream handed out since the call began or its last re-send, in both flavours
of the event stream, without a client; and `Cancelled.carrying`, the copy that holds it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator, Sequence

import pytest

from app.event_stream import AsyncEventStream, EventStream, Step
from domain.cancel import CancelToken, cancel_all
from domain.errors import Cancelled, ClientClosed
from domain.events import ChatEvent, Content, Progress, Reasoning, Retrying, ToolCallDelta

pytestmark = pytest.mark.timeout(10)

RESEND = Retrying(attempt=2, after_ms=0, error="the replay was forgotten", resend=True)
REATTACH = Retrying(attempt=2, after_ms=50, error="the stream broke", resend=False)


def ending_in(events: Sequence[ChatEvent], error: Cancelled) -> EventStream:
    """A stream whose call hands out `events`, then raises `error`."""

    def steps(token: CancelToken) -> Generator[Step, None, None]:
        yield from events
        raise error

    return EventStream(steps)


def async_ending_in(events: Sequence[ChatEvent], error: Cancelled) -> AsyncEventStream:
    async def steps(token: CancelToken) -> AsyncGenerator[Step, None]:
        for event in events:
            yield event
        raise error

    return AsyncEventStream(steps)


def raised(events: Sequence[ChatEvent], error: Cancelled | None = None) -> Cancelled:
    with ending_in(events, error or Cancelled("the call was cancelled")) as stream, pytest.raises(Cancelled) as caught:
        stream.run(lambda event: None)
    return caught.value


def test_the_error_carries_the_text_and_reasoning_of_the_events_handed_out() -> None:
    error = raised([Progress(4, 0, 4), Reasoning("Hm"), Reasoning("m."), Content("Oslo"), Content(" is")])
    assert (error.content, error.reasoning) == ("Oslo is", "Hmm.")


def test_a_re_send_starts_the_text_over_and_a_re_attach_does_not() -> None:
    error = raised([Reasoning("a"), Content("b"), REATTACH, Content("c"), RESEND, Reasoning("x"), Content("y")])
    assert (error.content, error.reasoning) == ("y", "x")
    error = raised([Content("b"), REATTACH, Content("c")])
    assert error.content == "bc"


def test_tool_call_deltas_and_other_events_bring_no_text() -> None:
    error = raised([ToolCallDelta(0, "call_1", "get_time", '{"city"'), Progress(4, 0, 4)])
    assert (error.content, error.reasoning) == ("", "")


def test_an_error_after_no_text_is_raised_as_it_is() -> None:
    mine = Cancelled("stopped by the user")
    assert raised([Progress(4, 0, 4)], mine) is mine
    assert (mine.content, mine.reasoning) == ("", "")


def test_text_that_is_not_ascii_comes_back_whole() -> None:
    assert raised([Content("h\u00e9"), Content("\u2603 \U0001f999")]).content == "h\u00e9\u2603 \U0001f999"


def test_the_error_a_loop_meets_carries_what_the_loop_was_handed() -> None:
    with ending_in([Content("Par"), Content("is")], Cancelled("stop")) as stream, pytest.raises(Cancelled) as caught:
        for _ in stream:
            pass
    assert caught.value.content == "Paris"


def test_streams_ended_by_one_error_each_carry_their_own_text() -> None:
    # A close cancels every call with one and the same `ClientClosed`.
    closing = ClientClosed("the client was closed while the call ran")
    streams = [ending_in([Content(word)], closing) for word in ("Oslo", "Rome")]
    carried = []
    for stream in streams:
        with stream, pytest.raises(ClientClosed) as caught:
            stream.run(lambda event: None)
        carried.append(caught.value)
    assert [error.content for error in carried] == ["Oslo", "Rome"]
    assert closing.content == "" and all(type(error) is ClientClosed for error in carried)


def test_a_stream_cancelled_between_two_steps_carries_the_text_handed_out_before() -> None:
    def steps(token: CancelToken) -> Generator[Step, None, None]:
        yield Content("Oslo")
        yield Content(" never shown")
        raise AssertionError("the call was ended before this step")

    stream = EventStream(steps)
    events = iter(stream)
    assert next(events) == Content("Oslo")
    cancel_all([stream._token], ClientClosed("closed"))  # as a close from the consumer's own thread
    with pytest.raises(ClientClosed) as caught:
        next(events)
    assert caught.value.content == "Oslo"


@pytest.mark.asyncio
async def test_the_async_stream_carries_the_text_as_the_blocking_one_does() -> None:
    events: list[ChatEvent] = [Reasoning("a"), Content("b"), RESEND, Reasoning("x"), Content("y"), Content("z")]
    async with async_ending_in(events, Cancelled("stop")) as stream:
        with pytest.raises(Cancelled) as caught:
            await stream.run(lambda event: None)
    assert (caught.value.content, caught.value.reasoning) == ("yz", "x")


@pytest.mark.asyncio
async def test_the_async_stream_cancelled_while_a_step_waits_carries_the_text_handed_out_before() -> None:
    waiting = asyncio.Event()

    async def steps(token: CancelToken) -> AsyncGenerator[Step, None]:
        yield Content("Oslo")
        waiting.set()
        await asyncio.sleep(30)  # a wait the token knows nothing of: the task is cancelled in it
        yield Content(" never shown")

    async with AsyncEventStream(steps) as stream:
        loop = aiter(stream)
        assert await anext(loop) == Content("Oslo")
        step = asyncio.ensure_future(anext(loop))
        await waiting.wait()
        stream._token.cancel(ClientClosed("closed"))
        with pytest.raises(ClientClosed) as caught:
            await step
    assert caught.value.content == "Oslo"


# -- the copy ---------------------------------------------------------------------------------------


def test_the_copy_keeps_the_class_message_cause_and_traceback_and_leaves_the_original_as_it_was() -> None:
    try:
        try:
            raise OSError("connection reset")
        except OSError as broken:
            raise ClientClosed("the client was closed while the call ran") from broken
    except ClientClosed as error:
        original = error
    copy = original.carrying("Oslo", "Hmm.")
    assert type(copy) is ClientClosed and copy is not original
    assert (str(copy), copy.args) == (str(original), original.args)
    assert (copy.content, copy.reasoning) == ("Oslo", "Hmm.")
    assert copy.__cause__ is original.__cause__ and copy.__suppress_context__
    assert copy.__traceback__ is original.__traceback__
    assert (original.content, original.reasoning) == ("", "")


def test_a_subclass_with_an_init_of_its_own_is_copied_with_its_attributes() -> None:
    class Stopped(Cancelled):
        def __init__(self, who: str) -> None:
            super().__init__(f"stopped by {who}")
            self.who = who

    copy = Stopped("the user").carrying("Oslo", "")
    assert type(copy) is Stopped and copy.who == "the user" and str(copy) == "stopped by the user"
    assert copy.content == "Oslo"


def test_a_cause_is_kept_on_the_error_the_stream_raises() -> None:
    broken = OSError("connection reset")

    def steps(token: CancelToken) -> Generator[Step, None, None]:
        yield Content("Oslo")
        raise Cancelled("the call was cancelled") from broken

    with EventStream(steps) as stream, pytest.raises(Cancelled) as caught:
        stream.run(lambda event: None)
    assert caught.value.__cause__ is broken and caught.value.content == "Oslo"
