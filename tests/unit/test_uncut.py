"""`AsyncUncut.run`: a bounded step that a cancel must not cut short (the stop of a
generation) runs to its end, and the cancellation is raised after it; `Uncut.run`, its blocking
twin, runs it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from app.calls import AsyncInner, AsyncUncut, Uncut


class Step:
    """A step that ends when `release` is set, noting that it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.ended = False

    async def run(self) -> str:
        self.started.set()
        await self.release.wait()
        self.ended = True
        return "stopped"


def test_a_step_not_cancelled_returns_its_result() -> None:
    async def scene() -> str:
        step = Step()
        step.release.set()
        return await AsyncUncut.run(step.run)

    assert asyncio.run(scene()) == "stopped"


def test_a_cancel_waits_for_the_step_then_is_raised() -> None:
    async def scene() -> tuple[bool, bool]:
        step = Step()
        waiting = asyncio.ensure_future(AsyncUncut.run(step.run))
        await step.started.wait()
        waiting.cancel()
        await asyncio.sleep(0)
        waiting.cancel()  # twice: still not cut
        await asyncio.sleep(0)
        ended_before_release = step.ended or waiting.done()
        step.release.set()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return ended_before_release, step.ended

    assert asyncio.run(scene()) == (False, True)


def test_the_steps_own_error_comes_out() -> None:
    async def failing() -> None:
        raise LookupError("the step failed")

    async def scene() -> None:
        await AsyncUncut.run(failing)

    with pytest.raises(LookupError, match="the step failed"):
        asyncio.run(scene())


def test_a_step_cancelled_itself_is_made_once_more_then_is_a_cancel() -> None:
    runs: list[None] = []

    async def cancelled() -> None:
        runs.append(None)
        raise asyncio.CancelledError

    async def scene() -> None:
        await AsyncUncut.run(cancelled)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scene())
    assert len(runs) == 2


def test_a_step_under_way_when_asyncio_run_ends_still_runs_to_its_end() -> None:
    # The end of `asyncio.run` cancels every task, the step's own among them: the step is made
    # again in a task the end does not cancel, and the end awaits it.
    ended: list[str] = []
    left: list[asyncio.Future[None]] = []

    async def stop() -> None:
        await asyncio.sleep(0.01)
        ended.append("stopped")

    async def scene() -> None:
        left.append(asyncio.ensure_future(AsyncUncut.run(stop)))
        await asyncio.sleep(0)  # the step's task is made; the scene ends while it runs

    asyncio.run(scene())
    assert ended == ["stopped"]


def test_the_blocking_twin_runs_the_step_with_its_arguments() -> None:
    ran: list[tuple[str, int]] = []

    def stop(name: str, *, times: int) -> str:
        ran.append((name, times))
        return "stopped"

    assert Uncut.run(stop, "c-1", times=2) == "stopped"
    assert ran == [("c-1", 2)]


def test_inner_steps_running_already_are_left_to_the_close_under_way() -> None:
    async def scene() -> bool:
        closing = asyncio.Event()
        ended = asyncio.Event()

        async def inner() -> AsyncGenerator[int, None]:
            try:
                yield 1
            finally:
                closing.set()
                await ended.wait()

        steps = inner()
        await anext(steps)
        first = asyncio.ensure_future(steps.aclose())  # a close under way, inside its finally
        await closing.wait()
        await AsyncInner.close(steps)  # would raise "already running" if it closed them again
        ended.set()
        await first
        return steps.ag_running

    assert asyncio.run(scene()) is False


def test_inner_steps_are_left_to_the_loop_while_it_closes_every_generator() -> None:
    closed: list[str] = []

    async def scene() -> None:
        async def inner() -> AsyncGenerator[int, None]:
            try:
                yield 1
            finally:
                closed.append("by its own close")

        steps = inner()
        await anext(steps)
        loop = asyncio.get_running_loop()
        loop._asyncgens_shutdown_called = True  # type: ignore[attr-defined]  # as shutdown_asyncgens marks it
        try:
            await AsyncInner.close(steps)
            assert closed == [], "left to the loop's own close"
        finally:
            loop._asyncgens_shutdown_called = False  # type: ignore[attr-defined]
        await steps.aclose()

    asyncio.run(scene())
    assert closed == ["by its own close"]


def test_inner_steps_otherwise_are_closed() -> None:
    closed: list[bool] = []

    async def scene() -> None:
        async def inner() -> AsyncGenerator[int, None]:
            try:
                yield 1
            finally:
                closed.append(True)

        steps = inner()
        await anext(steps)
        await AsyncInner.close(steps)

    asyncio.run(scene())
    assert closed == [True]
