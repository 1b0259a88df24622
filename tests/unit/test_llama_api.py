"""llama_api's readers: the exact words of their errors and the edges of what they accept."""

from __future__ import annotations

import orjson
import pytest

from domain.errors import ProtocolError
from domain.llama_api import (
    SlotInfo,
    Token,
    control_refusal,
    parse_props,
    parse_slot_action,
    parse_slots,
    parse_token_ids,
    parse_tokens,
    reattach_path,
    shown_target,
    stop_path,
)

SETTINGS = {"default_generation_settings": {"n_ctx": 4096}}


def props(**fields: object) -> bytes:
    return orjson.dumps({"chat_template": "{{ x }}", "total_slots": 2, **SETTINGS, **fields})


def test_a_missing_count_is_called_missing() -> None:
    raw = orjson.dumps({"chat_template": "t", **SETTINGS})
    with pytest.raises(ProtocolError) as caught:
        parse_props(raw)
    assert str(caught.value) == "/props.total_slots is missing, not a positive integer up to 2147483647"


def test_a_zero_slot_count_is_refused_because_it_must_be_positive() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_props(props(total_slots=0))
    assert str(caught.value) == "/props.total_slots is 0, not a positive integer up to 2147483647"


def test_a_slot_id_of_zero_is_a_valid_count() -> None:
    assert parse_slots(b'[{"id": 0, "is_processing": false}]') == [SlotInfo(0, False)]


def test_a_model_alias_that_is_not_text_reads_as_none() -> None:
    parsed = parse_props(props(model_alias=5, model_path="/m.gguf"))
    assert parsed.model_alias is None
    assert parsed.model_path == "/m.gguf"


def test_a_missing_template_is_called_missing() -> None:
    raw = orjson.dumps({"total_slots": 1, **SETTINGS})
    with pytest.raises(ProtocolError) as caught:
        parse_props(raw)
    assert str(caught.value) == "/props.chat_template is missing, not a string"


def test_a_template_that_is_not_text_is_quoted_in_the_error() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_props(props(chat_template=5))
    assert str(caught.value) == "/props.chat_template is 5, not a string"


def test_a_slot_entry_that_is_not_an_object_is_named_by_its_index() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_slots(b'[{"id": 0, "is_processing": true}, 7]')
    assert str(caught.value) == "/slots[1] is 7, not an object"


@pytest.mark.parametrize(
    ("n_ctx", "expected"),
    [(1, 1), (4096, 4096), (0, None), (-5, None), ("4096", None), (True, None), (None, None)],
)
def test_a_slot_context_counts_only_when_it_is_a_positive_integer(n_ctx: object, expected: int | None) -> None:
    raw = orjson.dumps([{"id": 3, "is_processing": True, "n_ctx": n_ctx}])
    assert parse_slots(raw) == [SlotInfo(3, True, expected)]


def test_tokens_that_are_not_a_list_are_named_in_the_error() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_tokens(b'{"tokens": {"id": 1}}')
    assert str(caught.value) == "/tokenize.tokens is {'id': 1}, not a list"


def test_a_byte_list_piece_takes_every_byte_value_from_0_to_255() -> None:
    tokens = parse_tokens(b'{"tokens": [{"id": 1, "piece": [0, 104, 255]}]}')
    assert tokens == [Token(1, "\x00h\ufffd", b"\x00h\xff")]


@pytest.mark.parametrize("byte", [-1, 256])
def test_a_byte_list_piece_with_a_value_outside_a_byte_is_refused(byte: int) -> None:
    raw = orjson.dumps({"tokens": [{"id": 1, "piece": [104, byte]}]})
    with pytest.raises(ProtocolError) as caught:
        parse_tokens(raw)
    assert str(caught.value) == f"/tokenize.tokens[0].piece is [104, {byte}], neither text nor a list of byte values"


def test_a_byte_list_piece_reads_as_its_text_when_it_is_whole_utf8() -> None:
    tokens = parse_tokens(orjson.dumps({"tokens": [{"id": 9, "piece": list("é".encode())}]}))
    assert tokens == [Token(9, "é", "é".encode())]


def test_a_refused_control_call_quotes_the_answer() -> None:
    assert control_refusal(b'{"success": false}') == "the server answered {'success': False}"


def test_a_control_answer_that_is_not_json_is_quoted_as_bytes() -> None:
    assert control_refusal(b"busy") == "the server answered non-JSON b'busy'"


def test_a_quoted_value_of_120_characters_is_shown_whole() -> None:
    answer = "a" * 118  # its repr, quotes included, is 120 characters
    assert control_refusal(orjson.dumps(answer)) == f"the server answered {answer!r}"


def test_a_quoted_value_over_120_characters_is_cut_with_an_ellipsis() -> None:
    answer = "a" * 119  # its repr is 121 characters
    assert control_refusal(orjson.dumps(answer)) == f"the server answered {answer!r}"[:-1] + "..."


# llama-server keeps slot counts, contexts and token ids in an int32: a larger number is not its
# own, and sent back (`id_slot`) it would wrap.
INT32_MAX = 2**31 - 1


def test_the_largest_int32_counts_are_taken() -> None:
    got = parse_props(props(total_slots=INT32_MAX, default_generation_settings={"n_ctx": INT32_MAX}))
    assert (got.total_slots, got.n_ctx) == (INT32_MAX, INT32_MAX)
    assert parse_token_ids(orjson.dumps({"tokens": [0, INT32_MAX]})) == [0, INT32_MAX]
    assert parse_slots(orjson.dumps([{"id": INT32_MAX, "is_processing": False}])) == [SlotInfo(INT32_MAX, False)]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (props(total_slots=2**40), "/props.total_slots is 1099511627776, not a positive integer up to 2147483647"),
        (
            props(default_generation_settings={"n_ctx": 2**62}),
            f"/props.default_generation_settings.n_ctx is {2**62}, not a positive integer up to 2147483647",
        ),
    ],
)
def test_a_props_count_past_an_int32_is_refused(raw: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_props(raw)
    assert str(caught.value) == message


def test_a_token_id_past_an_int32_is_refused() -> None:
    with pytest.raises(ProtocolError, match=r"/tokenize.tokens\[1\] is 2147483648, not a token id"):
        parse_token_ids(orjson.dumps({"tokens": [1, 2**31]}))
    with pytest.raises(ProtocolError, match=r"/tokenize.tokens\[0\].id is 9223372036854775808, not a non-negative"):
        parse_tokens(orjson.dumps({"tokens": [{"id": 2**63, "piece": "x"}]}))
    with pytest.raises(ProtocolError, match=r"/slots\[0\].id is 2147483648"):
        parse_slots(orjson.dumps([{"id": 2**31, "is_processing": False}]))


def test_a_slot_action_counts_tokens_in_an_int32_and_bytes_as_a_file_size() -> None:
    where = "POST /slots/0?action=save"
    assert parse_slot_action(
        orjson.dumps({"n_saved": INT32_MAX, "n_written": 2**40}), "n_saved", "n_written", where
    ) == (
        INT32_MAX,
        2**40,
    )
    with pytest.raises(ProtocolError, match=r"n_saved is 9223372036854775808, not a non-negative integer up to"):
        parse_slot_action(orjson.dumps({"n_saved": 2**63, "n_written": 1}), "n_saved", "n_written", where)


def test_a_path_is_shown_without_its_conversation_id() -> None:
    assert shown_target(reattach_path("f" * 32, 500)) == "/v1/stream?conv_id=...&from=500"
    assert shown_target(stop_path("f" * 32)) == "/v1/stream?conv_id=..."
    assert shown_target("/v1/stream?from=5&conv_id=abc") == "/v1/stream?from=5&conv_id=..."
    assert shown_target("/slots?model=m") == "/slots?model=m"
    assert shown_target("/props") == "/props"
