"""The assembler's liveness rule (`advanced`), its reasoning-token floor and its answer cap.

`advanced` is what keeps a stream alive: only a chunk that moves the generation on sets it, so a
server that repeats empty events is as silent as one that sends nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from client_support import ROLE, chunk
from domain.assembler import Assembler
from domain.errors import ProtocolError


def fed(*chunks: dict[str, Any], **options: int) -> list[bool]:
    assembler = Assembler(**options)
    out = []
    for c in chunks:
        assembler.feed(c)
        out.append(assembler.advanced)
    return out


def test_new_text_of_each_kind_advances() -> None:
    assert fed(chunk({"content": "a"}), chunk({"reasoning_content": "b"})) == [True, True]


def test_empty_role_only_and_usage_chunks_do_not_advance() -> None:
    assert (
        fed({}, {"choices": []}, chunk(ROLE), chunk({}), chunk({"content": ""}), chunk({"reasoning_content": ""}))
        == [False] * 6
    )


def test_predicted_n_advances_only_when_it_grows_and_stays_within_max_tokens() -> None:
    assert fed(
        chunk(ROLE, n=1),
        chunk(ROLE, n=1),
        chunk(ROLE, n=2),
        chunk(ROLE, n=1),
        chunk(ROLE, n=3),
        chunk(ROLE, n=4),
        max_predicted=3,
    ) == [True, False, True, False, True, False]


def test_prompt_progress_advances_only_while_processed_grows_up_to_the_first_total() -> None:
    assert fed(
        chunk(ROLE, progress=(100, 0, 10)),
        chunk(ROLE, progress=(100, 0, 10)),
        chunk(ROLE, progress=(100, 0, 50)),
        chunk(ROLE, progress=(100, 0, 40)),
        chunk(ROLE, progress=(100, 0, 100)),
        chunk(ROLE, progress=(10**9, 0, 200)),
    ) == [True, False, True, False, True, False]


def test_a_first_progress_at_zero_advances() -> None:
    assert fed(chunk(ROLE, progress=(100, 0, 0))) == [True]


def test_a_tool_call_advances_by_its_first_name_and_each_arguments_piece_not_by_its_id() -> None:
    def call(**fields: Any) -> dict[str, Any]:
        return chunk({"tool_calls": [{"index": 0, **fields}]})

    assert fed(
        call(id="c1"),
        call(function={"name": "f"}),
        call(function={"name": "f"}),
        call(function={"arguments": ""}),
        call(function={"arguments": "{"}),
    ) == [False, True, False, False, True]


def test_the_final_chunk_advances() -> None:
    assert fed(chunk(finish="stop")) == [True]


def test_advanced_is_reset_by_every_feed() -> None:
    assert fed(chunk({"content": "a"}), {}) == [True, False]


@pytest.mark.parametrize("predicted", [None, 1, 0])
def test_reasoning_tokens_are_at_least_the_reasoning_chunks_when_predicted_n_lies(predicted: int | None) -> None:
    assembler = Assembler()
    for _ in range(5):
        assembler.feed(chunk({"reasoning_content": "x"}, n=predicted))

    assert assembler.reasoning_tokens == 5


def test_reasoning_tokens_follow_a_predicted_n_that_runs_ahead_and_never_fall() -> None:
    assembler = Assembler()
    counts = []
    for n in (3, 9, 4, 12):
        assembler.feed(chunk({"reasoning_content": "x"}, n=n))
        counts.append(assembler.reasoning_tokens)

    assert counts == [3, 9, 9, 12]


def test_the_answer_cap_counts_utf8_bytes_of_every_kind_of_text() -> None:
    assembler = Assembler(max_answer_bytes=10)
    assembler.feed(chunk({"content": "é" * 2}))  # 4 bytes
    assembler.feed(chunk({"reasoning_content": "ab"}))  # 6
    assembler.feed(chunk({"tool_calls": [{"index": 0, "id": "i", "function": {"name": "n", "arguments": "xy"}}]}))

    with pytest.raises(ProtocolError, match="past the 10-byte limit"):
        assembler.feed(chunk({"content": "z"}))


def test_an_answer_exactly_at_the_cap_is_whole() -> None:
    assembler = Assembler(max_answer_bytes=3)
    assembler.feed(chunk({"content": "abc"}))
    assembler.feed(chunk(finish="stop"))

    assert assembler.result().content == "abc"


def test_reasoning_after_the_answer_began_counts_only_its_own_tokens() -> None:
    # predicted_n counts every token generated: the content's too.
    assembler = Assembler()
    for n in range(1, 4):
        assembler.feed(chunk({"reasoning_content": "r"}, n=n))
    for n in range(4, 54):
        assembler.feed(chunk({"content": "c"}, n=n))
    assembler.feed(chunk({"reasoning_content": "r"}, n=54))
    assert assembler.reasoning_tokens == 4
