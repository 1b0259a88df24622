"""Refusal lines: a line each for the first ten a second, then one summary a second, driven by a hand-moved clock."""

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from adapters.proxy.refusals import RefusalLines
from adapters.proxy.testing import ManualClock

RATE = "accept rate limit (burst 10, refill 2/s)"
FULL = "8 connections already open"
SUMMARY = re.compile(r"^refused (\d+) more connections? within 1 s \[(.*)\]$")


def refuse(lines: RefusalLines, count: int, reason: str = RATE) -> list[str]:
    out: list[str] = []
    for _ in range(count):
        out += lines.refused(reason)
    return out


def accounted(lines: list[str]) -> int:
    """Refusals a log accounts for: one per line of its own, the count of each summary."""
    total = 0
    for line in lines:
        if match := SUMMARY.match(line):
            parts = [part.rsplit(": ", 1) for part in match[2].split("; ")]
            assert sum(int(n) for _, n in parts) == int(match[1]), line
            total += int(match[1])
        else:
            assert line.startswith("refused a connection: "), line
            total += 1
    return total


def test_the_first_ten_refusals_in_a_second_get_a_line_each() -> None:
    lines = RefusalLines(ManualClock())
    assert refuse(lines, 10) == [f"refused a connection: {RATE}"] * 10
    assert not lines.summarising


def test_past_ten_in_a_second_refusals_are_counted_and_summarised_with_their_reasons_when_the_second_ends() -> None:
    clock = ManualClock()
    lines = RefusalLines(clock)
    refuse(lines, 10)
    assert refuse(lines, 5, RATE) + refuse(lines, 2, FULL) + refuse(lines, 1, RATE) == []
    assert lines.seconds_until_due() == pytest.approx(1.0)
    clock.advance(0.5)
    assert lines.due() == []
    assert lines.seconds_until_due() == pytest.approx(0.5)
    clock.advance(0.5)
    assert lines.due() == [f"refused 8 more connections within 1 s [{RATE}: 6; {FULL}: 2]"]
    assert lines.due() == []  # said once
    assert lines.seconds_until_due() is None


def test_a_flood_of_a_hundred_thousand_refusals_over_ten_seconds_costs_ten_lines_and_one_summary_a_second() -> None:
    clock = ManualClock()
    lines = RefusalLines(clock)
    out: list[str] = []
    for _ in range(100):  # 1000 refusals every 0.1 s
        out += refuse(lines, 1000)
        clock.advance(0.1)
        out += lines.due()
    out += lines.flush()
    assert out[:10] == [f"refused a connection: {RATE}"] * 10
    assert (
        out[10:]
        == [f"refused 9990 more connections within 1 s [{RATE}: 9990]"]
        + [f"refused 10000 more connections within 1 s [{RATE}: 10000]"] * 9
    )
    assert accounted(out) == 100_000


def test_lines_of_their_own_come_back_only_after_a_whole_second_without_a_refusal() -> None:
    clock = ManualClock()
    lines = RefusalLines(clock)
    refuse(lines, 11)
    clock.advance(1.0)
    assert lines.due() == [f"refused 1 more connection within 1 s [{RATE}: 1]"]
    clock.advance(0.9)
    assert refuse(lines, 1) == []  # still summarising: the second after the summary was not quiet
    clock.advance(0.1)
    assert lines.due() == [f"refused 1 more connection within 1 s [{RATE}: 1]"]
    clock.advance(1.0)
    assert refuse(lines, 1) == [f"refused a connection: {RATE}"]
    assert not lines.summarising


def test_a_summary_written_late_covers_only_its_own_second_and_a_quiet_gap_ends_summarising() -> None:
    # Nothing woke the caller at the end of the second; the next refusal, 5 s later, first closes
    # that second and then, the gap being quiet, gets a line of its own.
    clock = ManualClock()
    lines = RefusalLines(clock)
    refuse(lines, 12)
    clock.advance(5.0)
    assert lines.refused(FULL) == [
        f"refused 2 more connections within 1 s [{RATE}: 2]",
        f"refused a connection: {FULL}",
    ]


def test_a_flood_that_pulses_costs_at_most_eleven_lines_per_two_seconds() -> None:
    clock = ManualClock()
    lines = RefusalLines(clock)
    out: list[str] = []
    for _ in range(50):  # a burst of 100 refusals every 2 s, for 100 s
        out += refuse(lines, 100)
        clock.advance(1.0)
        out += lines.due()
        clock.advance(1.0)
        out += lines.due()
    assert len(out) == 50 * 11
    assert accounted(out) == 50 * 100


def test_nothing_is_due_and_nothing_waits_while_nothing_is_counted() -> None:
    clock = ManualClock()
    lines = RefusalLines(clock)
    assert lines.seconds_until_due() is None
    refuse(lines, 10)
    assert lines.seconds_until_due() is None  # ten lines of their own: no summary to wait for
    assert lines.flush() == []


def test_flush_gives_what_is_still_counted_before_its_second_is_over() -> None:
    clock = ManualClock()
    lines = RefusalLines(clock)
    refuse(lines, 13)
    clock.advance(0.2)
    assert lines.flush() == [f"refused 3 more connections within 1 s [{RATE}: 3]"]
    assert lines.flush() == []


def test_a_clock_that_steps_back_reopens_no_second() -> None:
    readings = iter([100.0, 100.0, 99.0])
    lines = RefusalLines(lambda: next(readings), verbatim=1)
    assert lines.refused(RATE) == [f"refused a connection: {RATE}"]
    assert lines.refused(RATE) == []  # held at 100.0: still the same second, so counted


def test_unusable_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="verbatim"):
        RefusalLines(ManualClock(), verbatim=-1)
    with pytest.raises(ValueError, match="period"):
        RefusalLines(ManualClock(), period=0)


STEPS = st.lists(
    st.tuples(st.integers(0, 40), st.sampled_from([0.0, 0.01, 0.3, 0.99, 1.0, 1.7, 5.0]), st.booleans()),
    max_size=60,
)


@given(STEPS)
def test_every_refusal_is_accounted_for_exactly_once_however_late_the_summaries_are_asked_for(
    steps: list[tuple[int, float, bool]],
) -> None:
    clock = ManualClock()
    lines = RefusalLines(clock)
    out: list[str] = []
    total = 0
    for count, gap, poll in steps:
        for i in range(count):
            out += lines.refused(FULL if i % 3 else RATE)
        total += count
        clock.advance(gap)
        if poll:
            out += lines.due()
    out += lines.flush()
    assert accounted(out) == total


@given(STEPS)
@example(steps=[(1, 0.99, False), (2, 0.01, False), (10, 0.0, False)])  # lines either side of a period's end
@settings(max_examples=400)
def test_polled_as_the_accept_loop_polls_no_second_has_more_than_eleven_lines(
    steps: list[tuple[int, float, bool]],
) -> None:
    # The loop's select wakes when `seconds_until_due` says, so a summary is never late.
    clock = ManualClock()
    lines = RefusalLines(clock)
    stamps: list[float] = []
    for count, gap, _poll in steps:
        for i in range(count):
            stamps += [clock.now] * len(lines.refused(FULL if i % 3 else RATE))
        left = gap
        while (wait := lines.seconds_until_due()) is not None and wait <= left:
            clock.advance(wait)
            left -= wait
            stamps += [clock.now] * len(lines.due())
        clock.advance(left)
    assert all(sum(start <= s < start + 1.0 for s in stamps) <= 11 for start in stamps)
