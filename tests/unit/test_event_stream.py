"""The iterator over a call's steps (`app.event_stream`), in both flavours, without a client: a
step generator stands in for the call, and is handed the stream's own `CancelToken`.

A stream runs its call only when iterated: closed before its first step it never starts it. The
steps end with their `Completion`; steps that end without one are an error, not a clean end. On
asyncio a cancel of the stream's token reaches a step waiting in an await the token knows nothing
of (the task is cancelled while it waits inside the call, and that is taken back), in whichever task
waits now (the iteration may move from task to task; `run`'s loop looks its own up once); a cancel of the
task by its owner stays the owner's, and a token's wake-up arriving after it cancels nothing more.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Generator

import pytest

from app.event_stream import AsyncEventStream, EventStream, Step
from domain.cancel import CancelToken
from domain.completion import Completion, FinishReason, Timings
from domain.errors import Cancelled
from domain.events import Content

pytestmark = pytest.mark.timeout(10)

WITHIN_S = 0.1
COMPLETION = Completion("chatcmpl-1", "Hi", None, (), FinishReason.STOP, Timings(0, 3, 1), 0, False)


def test_a_stream_closed_before_its_first_step_never_starts_the_call_and_a_loop_then_raises() -> None:
    started: list[CancelToken] = []

    def steps(token: CancelToken) -> Generator[Step, None, None]:
        started.append(token)
        yield COMPLETION

    with EventStream(steps) as stream:
        stream.close()
        with pytest.raises(Cancelled, match="closed before it was read to its end"):
            list(stream)  # never as if the answer had come whole, and empty

    assert started == []
    with pytest.raises(RuntimeError, match="no completion"):
        stream.completion  # noqa: B018


@pytest.mark.asyncio
async def test_an_async_stream_closed_before_its_first_step_never_starts_the_call_and_a_loop_then_raises() -> None:
    started: list[CancelToken] = []

    async def steps(token: CancelToken) -> AsyncGenerator[Step, None]:
        started.append(token)
        yield COMPLETION

    async with AsyncEventStream(steps) as stream:
        await stream.aclose()
        with pytest.raises(Cancelled, match="closed before it was read to its end"):
            [event async for event in stream]

    assert started == []
    with pytest.raises(RuntimeError, match="no completion"):
        stream.completion  # noqa: B018


def test_steps_that_end_without_their_completion_are_an_error_not_a_clean_end() -> None:
    def steps(token: CancelToken) -> Generator[Step, None, None]:
        yield Content("Hi")

    with EventStream(steps) as stream:
        events = iter(stream)
        assert next(events) == Content("Hi")
        with pytest.raises(RuntimeError, match=r"^the call ended without a completion$"):
            next(events)

    with pytest.raises(RuntimeError, match="no completion"):
        stream.completion  # noqa: B018


class DeafSteps:
    """Steps whose first wait no token reaches (only a cancel of the task ends it); the token the
    stream handed them, and whether they were closed."""

    def __init__(self) -> None:
        self.token: CancelToken | None = None
        self.closed = False

    async def __call__(self, token: CancelToken) -> AsyncGenerator[Step, None]:
        self.token = token
        try:
            await asyncio.Event().wait()
            yield COMPLETION
        finally:
            self.closed = True


@pytest.mark.asyncio
async def test_a_cancel_of_the_streams_token_reaches_a_step_waiting_where_the_token_does_not() -> None:
    steps = DeafSteps()
    stream = AsyncEventStream(steps)
    task = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.01)
    assert steps.token is not None

    cancelled_at = time.monotonic()
    threading.Thread(target=steps.token.cancel).start()
    await asyncio.wait({task}, timeout=2.0)

    assert task.done(), "the cancel ended the step"
    assert time.monotonic() - cancelled_at < WITHIN_S
    assert type(task.exception()) is Cancelled
    assert task.cancelling() == 0, "the task's cancellation is taken back"
    assert steps.closed


@pytest.mark.asyncio
async def test_a_token_firing_just_after_the_owner_cancelled_the_task_cancels_nothing_more() -> None:
    steps = DeafSteps()
    stream = AsyncEventStream(steps)

    async def consume_then_go_on() -> str:
        try:
            await anext(stream)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            assert me is not None
            me.uncancel()  # the owner's cancel, handled: the task goes on
        await asyncio.sleep(0.05)  # the task's own await: nothing may cancel it now
        return "went on"

    task = asyncio.create_task(consume_then_go_on())
    await asyncio.sleep(0.01)
    assert steps.token is not None

    task.cancel()
    steps.token.cancel()  # its wake-up of the task comes on the loop, after the owner's cancel

    assert await asyncio.wait_for(task, 2.0) == "went on"
    assert steps.closed


class FirstThenDeaf(DeafSteps):
    """One event, then `DeafSteps`' wait."""

    async def __call__(self, token: CancelToken) -> AsyncGenerator[Step, None]:
        yield Content("Hi")
        async for step in super().__call__(token):
            yield step


async def _cancelled_in_its_new_task(stream: AsyncEventStream, steps: DeafSteps, waiter: asyncio.Task[object]) -> None:
    await asyncio.sleep(0.01)
    assert steps.token is not None and not waiter.done()
    threading.Thread(target=steps.token.cancel).start()
    await asyncio.wait({waiter}, timeout=2.0)
    assert waiter.done(), "the cancel reached the task waiting now, not the one that took the first event"
    assert type(waiter.exception()) is Cancelled
    assert steps.closed


@pytest.mark.asyncio
async def test_a_cancel_reaches_the_task_that_waits_when_the_iteration_moved_to_another_task() -> None:
    steps = FirstThenDeaf()
    stream = AsyncEventStream(steps)
    assert await asyncio.create_task(anext(stream)) == Content("Hi")  # the first step, in a task now done

    await _cancelled_in_its_new_task(stream, steps, asyncio.create_task(anext(stream)))


@pytest.mark.asyncio
async def test_a_cancel_reaches_run_in_its_own_task_after_an_event_was_taken_in_another() -> None:
    steps = FirstThenDeaf()
    stream = AsyncEventStream(steps)
    assert await asyncio.create_task(anext(stream)) == Content("Hi")
    seen: list[object] = []

    await _cancelled_in_its_new_task(stream, steps, asyncio.create_task(stream.run(seen.append)))
    assert seen == []
