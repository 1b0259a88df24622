"""The calls a client has in flight (`app.calls`), without a server: a call's scope, the caller's
token and `close_all()` that end it, and `wait_idle(timeout)` that `close()` waits with.

On asyncio the cancel of a call's token also reaches an await that knows nothing of the token
(only a cancel of the task ends it): the task is cancelled while it waits inside the call, the
call raises the token's error, and that cancellation is taken back, so the task is not left
cancelling. An await that reports the task's cancellation as an I/O error of its own changes
none of that; a cancel of the task by its owner stays the owner's `asyncio.CancelledError`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import pytest

from app.calls import AsyncCalls, Calls
from domain.cancel import CancelToken
from domain.errors import Cancelled, ClientClosed, StreamClosedEarly

pytestmark = pytest.mark.timeout(10)

# The promise is 100 ms from cancel (or close) to return.
WITHIN_S = 0.1

Wait = Callable[[], Awaitable[None]]


async def deaf() -> None:
    """An await no token reaches: only a cancel of the task ends it."""
    await asyncio.Event().wait()


async def reports_cancel_as_error() -> None:
    """An await that turns the task's cancellation into an I/O error of its own."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise StreamClosedEarly("the read was interrupted") from None


async def small_call(calls: AsyncCalls, cancel: CancelToken | None, wait: Wait) -> None:
    async with calls.scope(cancel):
        await wait()


async def in_flight(calls: AsyncCalls, cancel: CancelToken | None, wait: Wait = deaf) -> asyncio.Task[None]:
    """A call started as a task of its own, once it waits inside its scope."""
    task = asyncio.create_task(small_call(calls, cancel, wait))
    await asyncio.sleep(0.01)
    assert calls.busy
    return task


async def ended(task: asyncio.Task[None]) -> None:
    await asyncio.wait({task}, timeout=2.0)
    if not task.done():
        task.cancel()
        pytest.fail("the call did not end")


# -- a cancel reaches any await of an asyncio call ----------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("wait", [deaf, reports_cancel_as_error], ids=["deaf", "reports_cancel_as_error"])
async def test_a_callers_token_cancelled_from_another_thread_ends_the_call_with_cancelled(wait: Wait) -> None:
    calls = AsyncCalls()
    caller = CancelToken()
    task = await in_flight(calls, caller, wait)

    cancelled_at = time.monotonic()
    threading.Thread(target=caller.cancel).start()
    await ended(task)

    assert time.monotonic() - cancelled_at < WITHIN_S
    assert type(task.exception()) is Cancelled
    assert task.cancelling() == 0, "the task's cancellation is taken back"
    assert not calls.busy


@pytest.mark.asyncio
@pytest.mark.parametrize("wait", [deaf, reports_cancel_as_error], ids=["deaf", "reports_cancel_as_error"])
async def test_close_all_ends_a_call_in_any_await_with_client_closed_and_refuses_new_ones(wait: Wait) -> None:
    calls = AsyncCalls()
    task = await in_flight(calls, None, wait)

    closed_at = time.monotonic()
    assert calls.close_all() is True, "there was a call to end"
    await ended(task)

    assert time.monotonic() - closed_at < WITHIN_S
    assert type(task.exception()) is ClientClosed
    assert task.cancelling() == 0
    reached = False
    with pytest.raises(ClientClosed):
        async with calls.scope(None):
            reached = True
    assert not reached, "a call begun after close_all() does not run"
    assert calls.close_all() is False, "nothing was left to end"


@pytest.mark.asyncio
@pytest.mark.parametrize("wait", [deaf, reports_cancel_as_error], ids=["deaf", "reports_cancel_as_error"])
async def test_the_owners_cancel_of_the_task_stays_a_cancelled_error_when_the_token_fires_with_it(
    wait: Wait,
) -> None:
    calls = AsyncCalls()
    caller = CancelToken()
    task = await in_flight(calls, caller, wait)

    caller.cancel()  # its wake-up of the task comes on the loop, after this
    task.cancel()
    await ended(task)

    assert task.cancelled(), "the owner asked for the task's end, not just the call's"
    assert not calls.busy


# -- wait_idle: what close() waits for --------------------------------------------------------------


@pytest.mark.asyncio
async def test_wait_idle_returns_at_once_when_no_call_is_in_flight() -> None:
    calls = AsyncCalls()
    started = time.monotonic()

    await asyncio.wait_for(calls.wait_idle(5.0), 2.0)

    assert time.monotonic() - started < WITHIN_S


@pytest.mark.asyncio
async def test_wait_idle_returns_once_the_last_call_has_ended() -> None:
    calls = AsyncCalls()
    first, second = CancelToken(), CancelToken()
    calls.begin(first, None)
    calls.begin(second, None)
    asyncio.get_running_loop().call_later(0.05, calls.end, first)
    asyncio.get_running_loop().call_later(0.15, calls.end, second)
    started = time.monotonic()

    await asyncio.wait_for(calls.wait_idle(5.0), 2.0)

    assert 0.15 <= time.monotonic() - started < 0.15 + WITHIN_S
    assert not calls.busy


@pytest.mark.asyncio
async def test_wait_idle_gives_up_after_its_timeout_on_a_call_that_does_not_end() -> None:
    calls = AsyncCalls()
    calls.begin(CancelToken(), None)
    started = time.monotonic()

    await asyncio.wait_for(calls.wait_idle(0.1), 2.0)

    assert 0.1 <= time.monotonic() - started < 0.1 + WITHIN_S
    assert calls.busy


def test_a_call_that_ends_after_the_loop_that_waited_for_it_has_closed_ends_cleanly() -> None:
    calls = AsyncCalls()
    token = CancelToken()
    calls.begin(token, None)
    asyncio.run(calls.wait_idle(0.05))  # gives up; its loop is then closed

    calls.end(token)

    assert not calls.busy


def test_blocking_wait_idle_returns_at_once_when_no_call_is_in_flight() -> None:
    calls = Calls()
    started = time.monotonic()

    calls.wait_idle(5.0)

    assert time.monotonic() - started < WITHIN_S


def test_blocking_wait_idle_returns_once_the_last_call_has_ended() -> None:
    calls = Calls()
    token = CancelToken()
    calls.begin(token, None)
    started = time.monotonic()  # before the timer starts: it ends the call 0.1 s after this at the earliest
    threading.Timer(0.1, calls.end, (token,)).start()

    calls.wait_idle(5.0)

    assert 0.1 <= time.monotonic() - started < 0.1 + WITHIN_S
    assert not calls.busy


def test_blocking_wait_idle_gives_up_after_its_timeout_on_a_call_that_does_not_end() -> None:
    calls = Calls()
    calls.begin(CancelToken(), None)
    started = time.monotonic()

    calls.wait_idle(0.1)

    assert 0.1 <= time.monotonic() - started < 0.1 + WITHIN_S
    assert calls.busy


def test_a_blocking_call_ended_by_the_callers_token_raises_its_error_in_place_of_the_broken_io() -> None:
    calls = Calls()
    caller = CancelToken()

    with pytest.raises(Cancelled) as caught, calls.scope(caller) as token:
        caller.cancel()
        assert token.cancelled, "the caller's token reaches the call's"
        raise StreamClosedEarly("the read was shut down")

    assert type(caught.value) is Cancelled
    assert isinstance(caught.value.__cause__, StreamClosedEarly)
    assert not calls.busy
