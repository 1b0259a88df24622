"""The thinking cap replayed over the recorded forced end to reasoning.

The `reasoning_end` case was recorded with the control call posted once `predicted_n` reached
`control_at_predicted_n`; the server then sent a token or two more of reasoning and moved on to
content. Fed the same chunks through the assembler, a cap at that count decides to post exactly
there, once, and the tolerated overrun is never exceeded.
"""

from __future__ import annotations

import pytest

from domain.assembler import Assembler
from domain.thinking import Action, ThinkingCap
from transcripts import TRANSCRIPTS, index, load_case

OVERRUN = 8

pytestmark = pytest.mark.skipif(
    not (TRANSCRIPTS / "index.json").exists() or "reasoning_end" not in index().get("cases", {}),
    reason="no recorded reasoning_end transcript under tests/fixtures/transcripts (run `make transcripts`)",
)


def test_cap_posts_once_where_the_recording_did_and_never_overruns() -> None:
    case = load_case("reasoning_end")
    at = index()["cases"]["reasoning_end"]["control_at_predicted_n"]
    asm = Assembler()
    cap = ThinkingCap(at, OVERRUN)
    actions = []
    for chunk in case.events():
        asm.feed(chunk)
        action = cap.observe(asm.reasoning_tokens, asm.in_reasoning)
        if action is not Action.NONE:
            actions.append((action, asm.reasoning_tokens))
    assert actions == [(Action.POST_REASONING_END, at)]
    done = asm.result(thinking_capped=cap.capped)
    assert done.thinking_capped
    assert at <= done.reasoning_tokens <= at + OVERRUN
    assert done.content  # the answer came after the thinking block ended


def test_a_cap_the_stream_never_reached_does_nothing() -> None:
    case = load_case("reasoning_end")
    asm = Assembler()
    cap = ThinkingCap(10_000, OVERRUN)
    for chunk in case.events():
        asm.feed(chunk)
        assert cap.observe(asm.reasoning_tokens, asm.in_reasoning) is Action.NONE
    assert not cap.capped
