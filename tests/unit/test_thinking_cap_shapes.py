"""The thinking cap holds whatever else a reasoning chunk carries: an answer's text or a tool call
in the same delta, an answer already begun, the finish_reason, many tokens at once. The count of
reasoning tokens is what the cap is checked against, on every chunk that carried reasoning."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters.fake_server import CHUNK_ID, chunk
from client_support import stream_limits
from domain.assembler import Assembler
from domain.chat_stream import ChatStream, PostReasoningEnd, Step
from domain.completion import Completion
from domain.errors import InferError, ThinkingOverrun
from domain.events import Content, Reasoning, ThinkingCapped
from domain.thinking import END_TAG_TOKENS, ThinkingCap

CAP, OVERRUN = 10, 4
POSTED = "reasoning_end posted"


def event(c: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(c) + b"\n\n"


def paired(i: int, n: int | None = None) -> dict[str, Any]:
    """A chunk whose delta carries a reasoning piece and an answer piece."""
    return chunk({"reasoning_content": f"r{i}", "content": f"c{i}"}, n=i if n is None else n)


def with_call(i: int) -> dict[str, Any]:
    """A chunk whose delta carries a reasoning piece and a piece of a tool call's arguments."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": f"a{i}"}}
    return chunk({"reasoning_content": f"r{i}", "tool_calls": [call]}, n=i)


def drive(chunks: list[dict[str, Any]], *, budget_sent: bool = False) -> list[Step | str]:
    """Each chunk in a read of its own, a control call answered `success: true` where one is
    asked for (`POSTED` marks where); up to the stream's end."""
    stream = ChatStream(stream_limits(thinking_cap=CAP, thinking_overrun=OVERRUN), 10_000, 0.0, budget_sent=budget_sent)
    out: list[Step | str] = []
    for c in chunks:
        for step in stream.feed(event(c), 0.0):
            if isinstance(step, PostReasoningEnd):
                assert step.completion_id == CHUNK_ID
                out += [POSTED, stream.control_answered(None)]
            else:
                out.append(step)
            if isinstance(step, Completion | InferError):
                return out
    return out


def ending(steps: list[Step | str]) -> Step | str:
    assert isinstance(steps[-1], Completion | InferError), steps[-1]
    return steps[-1]


def overran(steps: list[Step | str], went_on_to: int, posted_at: int) -> None:
    """The stream ended in `ThinkingOverrun` at `went_on_to` tokens, the call made at `posted_at`."""
    overrun = ending(steps)
    assert isinstance(overrun, ThinkingOverrun)
    went_on = f"reasoning went on to {went_on_to} tokens after reasoning_end was posted at {posted_at} "
    assert str(overrun).startswith(went_on), str(overrun)


# -- reasoning and an answer (or a tool call) in one delta ------------------------------------------

SHAPES = {"with content": paired, "with a tool call": with_call}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_reasoning_sharing_a_delta_posts_reasoning_end_at_the_cap(shape: Any) -> None:
    steps = drive([*(shape(i) for i in range(1, CAP + 3)), chunk(finish="stop", n=CAP + 2)])
    posted = steps.index(POSTED)
    assert Reasoning(f"r{CAP}") in steps[posted - 3 : posted]  # right after the chunk that reached it
    assert steps[posted + 1] == ThinkingCapped(CAP)
    assert steps.count(POSTED) == 1
    completion = ending(steps)
    assert isinstance(completion, Completion)
    assert (completion.thinking_capped, completion.reasoning_tokens) == (True, CAP + 2)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_reasoning_sharing_a_delta_past_the_overrun_is_thinking_overrun(shape: Any) -> None:
    steps = drive([shape(i) for i in range(1, 300)])
    overran(steps, CAP + OVERRUN + 1, CAP)
    assert Reasoning(f"r{CAP + OVERRUN + 1}") in steps and Reasoning(f"r{CAP + OVERRUN + 2}") not in steps


def test_a_chunk_of_reasoning_and_content_counts_its_reasoning_tokens() -> None:
    assembler = Assembler()
    for i in range(1, 4):
        assert assembler.feed(paired(i)) == (Reasoning(f"r{i}"), Content(f"c{i}"))
        assert (assembler.reasoning_tokens, assembler.reasoned, assembler.in_reasoning) == (i, True, False)
    assembler.feed(chunk({"content": "answer"}, n=4))
    assert (assembler.reasoning_tokens, assembler.reasoned) == (3, False)


def test_a_chunk_says_whether_it_carried_reasoning_whatever_else_it_carried() -> None:
    assembler = Assembler()
    carried = [
        (chunk({"reasoning_content": "r"}), True),
        (chunk({"content": "c"}), False),
        (with_call(2), True),
        (chunk({"reasoning_content": ""}), False),
        (chunk({"reasoning_content": "r"}, finish="stop"), True),
    ]
    seen = []
    for c, _ in carried:
        assembler.feed(c)
        seen.append(assembler.reasoned)
    assert seen == [reasoned for _, reasoned in carried]


# -- reasoning after the answer began ----------------------------------------------------------------


def answer_then(reasoning: Any) -> list[dict[str, Any]]:
    """Five tokens of answer, then chunks of `reasoning(i, n)` after them."""
    return [
        *(chunk({"content": f"a{n}"}, n=n) for n in range(1, 6)),
        *(reasoning(i, 5 + i) for i in range(1, 300)),
    ]


AFTER_ANSWER = {
    "alone": lambda i, n: chunk({"reasoning_content": f"r{i}"}, n=n),
    "with content": paired,
}


@pytest.mark.parametrize("reasoning", AFTER_ANSWER.values(), ids=AFTER_ANSWER.keys())
def test_reasoning_after_the_answer_began_is_capped_on_its_own_tokens(reasoning: Any) -> None:
    steps = drive(answer_then(reasoning))
    posted = steps.index(POSTED)
    assert Reasoning(f"r{CAP}") in steps[posted - 2 : posted]
    assert steps[posted + 1] == ThinkingCapped(CAP)
    overran(steps, CAP + OVERRUN + 1, CAP)


# -- reasoning in the final chunk ----------------------------------------------------------------------


def reasoning(first: int, last: int) -> list[dict[str, Any]]:
    return [chunk({"reasoning_content": f"r{n}"}, n=n) for n in range(first, last + 1)]


@pytest.mark.parametrize("tokens", [CAP, 30 * CAP], ids=["at the cap", "many tokens"])
def test_a_final_chunk_whose_reasoning_reaches_the_cap_is_capped_without_a_call(tokens: int) -> None:
    # The answer is whole: there is nothing left to end, and so no call to make.
    last = chunk({"reasoning_content": "end"}, finish="stop", n=tokens)
    steps = drive([*reasoning(1, CAP - 1), last])
    assert POSTED not in steps
    assert steps[-3:-1] == [Reasoning("end"), ThinkingCapped(tokens)]
    completion = ending(steps)
    assert isinstance(completion, Completion)
    assert (completion.thinking_capped, completion.reasoning_tokens) == (True, tokens)


def test_a_final_chunk_whose_reasoning_goes_past_the_overrun_is_thinking_overrun() -> None:
    last = chunk({"reasoning_content": "x"}, finish="stop", n=CAP + OVERRUN + 1)
    steps = drive([*reasoning(1, CAP), last])
    assert steps.count(POSTED) == 1
    overran(steps, CAP + OVERRUN + 1, CAP)


def test_a_final_chunk_of_reasoning_and_content_within_the_overrun_completes_capped() -> None:
    last = chunk({"reasoning_content": "r", "content": "done"}, finish="stop", n=CAP + OVERRUN)
    steps = drive([*reasoning(1, CAP), last])
    completion = ending(steps)
    assert isinstance(completion, Completion)
    assert (completion.thinking_capped, completion.content) == (True, "done")
    assert steps.count(POSTED) == 1


# -- many tokens in one chunk ----------------------------------------------------------------------------


def test_one_chunk_of_many_reasoning_tokens_beside_content_posts_at_the_count_it_brought() -> None:
    steps = drive([paired(1, n=1), paired(2, n=5 * CAP), paired(3, n=5 * CAP + OVERRUN + 1)])
    posted = steps.index(POSTED)
    assert steps[posted - 2 : posted + 2] == [Reasoning("r2"), Content("c2"), POSTED, ThinkingCapped(5 * CAP)]
    overran(steps, 5 * CAP + OVERRUN + 1, 5 * CAP)


# -- with the server's own budget ---------------------------------------------------------------------------


def test_a_server_that_ignores_the_budget_with_paired_chunks_gets_the_fallback_call() -> None:
    trigger = CAP + END_TAG_TOKENS
    steps = drive([paired(i) for i in range(1, 300)], budget_sent=True)
    posted = steps.index(POSTED)
    assert steps[posted - 2 : posted + 2] == [
        Reasoning(f"r{trigger}"),
        Content(f"c{trigger}"),
        POSTED,
        ThinkingCapped(trigger),
    ]
    assert not any(isinstance(s, ThinkingCapped) for s in steps[:posted])
    overran(steps, trigger + OVERRUN + 1, trigger)


def test_reasoning_past_the_fallback_point_in_the_chunk_the_answer_began_in_gets_the_call() -> None:
    # A budget honoured ends the block at the cap (its end tag counted below the fallback point);
    # the same chunk reaching past that point is reasoning the budget did not stop: the call.
    steps = drive(
        [*reasoning(1, CAP - 1), paired(CAP, n=CAP + END_TAG_TOKENS), chunk(finish="stop", n=CAP + END_TAG_TOKENS)],
        budget_sent=True,
    )
    assert steps.count(ThinkingCapped(CAP + END_TAG_TOKENS)) == 1
    assert steps.count(POSTED) == 1
    assert ThinkingCap(CAP, OVERRUN, budget_sent=True).ended(CAP + END_TAG_TOKENS) is False
    assert ThinkingCap(CAP, OVERRUN, budget_sent=True).ended(CAP + END_TAG_TOKENS - 1) is True


def test_a_budget_that_ended_the_block_in_a_chunk_of_reasoning_and_content_is_reported_once() -> None:
    steps = drive([*reasoning(1, CAP - 1), paired(CAP), chunk(finish="stop", n=CAP)], budget_sent=True)
    assert POSTED not in steps
    assert steps.count(ThinkingCapped(CAP)) == 1
    completion = ending(steps)
    assert isinstance(completion, Completion) and completion.thinking_capped
