"""The accept token bucket, driven by a hand-moved clock."""

import itertools

import pytest

from adapters.proxy.bucket import TokenBucket
from adapters.proxy.testing import ManualClock


def take_all(bucket: TokenBucket) -> int:
    taken = 0
    while bucket.take():
        taken += 1
    return taken


def test_a_new_bucket_grants_the_whole_burst_then_refuses() -> None:
    bucket = TokenBucket(burst=10, rate=2.0, clock=ManualClock())
    assert [bucket.take() for _ in range(11)] == [True] * 10 + [False]


def test_half_a_second_at_two_per_second_refills_exactly_one_token() -> None:
    clock = ManualClock()
    bucket = TokenBucket(burst=10, rate=2.0, clock=clock)
    take_all(bucket)
    clock.advance(0.25)
    assert not bucket.take()
    clock.advance(0.25)
    assert bucket.take()
    assert not bucket.take()


def test_refills_summed_from_small_clock_steps_add_up_to_whole_tokens() -> None:
    # 0.1 s five times is not exactly 0.5 s in floating point; the token must still be there.
    clock = ManualClock(start=0.3)
    bucket = TokenBucket(burst=10, rate=2.0, clock=clock)
    take_all(bucket)
    attempts = []
    for _ in range(5):
        clock.advance(0.1)
        attempts.append(bucket.take())
    assert attempts == [False, False, False, False, True]


def test_a_long_idle_refills_only_up_to_the_burst() -> None:
    clock = ManualClock()
    bucket = TokenBucket(burst=10, rate=2.0, clock=clock)
    take_all(bucket)
    clock.advance(3600)
    assert take_all(bucket) == 10


def test_a_steady_storm_gets_the_burst_then_two_per_second() -> None:
    clock = ManualClock()
    bucket = TokenBucket(burst=10, rate=2.0, clock=clock)
    granted_at: list[float] = []
    for step in range(1001):  # an attempt every 10 ms from 0 s to 10 s inclusive
        if bucket.take():
            granted_at.append(step / 100)
        clock.advance(0.01)
    assert len(granted_at) == 10 + 2 * 10
    assert granted_at[:10] == [step / 100 for step in range(10)]
    gaps = [b - a for a, b in itertools.pairwise(granted_at[10:])]
    assert all(gap == pytest.approx(0.5, abs=0.011) for gap in gaps)


def test_a_clock_that_steps_back_mints_nothing() -> None:
    clock = ManualClock(start=100.0)
    bucket = TokenBucket(burst=2, rate=2.0, clock=clock)
    take_all(bucket)
    clock.now = 50.0  # the clock jumps back 50 s
    assert not bucket.take()
    clock.now = 50.5  # still behind the last reading: no time has passed for the bucket
    assert not bucket.take()
    clock.now = 100.5
    assert bucket.take()


def test_tokens_reports_without_taking() -> None:
    clock = ManualClock()
    bucket = TokenBucket(burst=3, rate=1.0, clock=clock)
    bucket.take()
    assert bucket.tokens == pytest.approx(2.0)
    assert bucket.tokens == pytest.approx(2.0)


@pytest.mark.parametrize(("burst", "rate"), [(0, 2.0), (-1, 2.0), (10, 0.0), (10, -1.0)])
def test_a_burst_below_one_or_a_rate_not_above_zero_is_rejected(burst: int, rate: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(burst=burst, rate=rate, clock=ManualClock())


def test_the_manual_clock_refuses_to_go_back() -> None:
    with pytest.raises(ValueError, match="does not go back"):
        ManualClock().advance(-0.001)
