"""Every JSON tree a caller hands in is held to one rule: a tool's `parameters` and a
`response_format` refuse the same things, with a `RequestError` that names the path, and a body
is never built (so never sent) around a bad one."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest

from domain.errors import RequestError
from domain.json_check import INT64_MIN, MAX_JSON_DEPTH, MAX_JSON_VALUES, UINT64_MAX, json_tree
from domain.messages import ChatRequest, ToolSchema, UserMessage
from domain.request import RequestSettings, build_chat_body

SETTINGS = RequestSettings(model="m", max_tokens=16)


def with_parameters(parameters: dict[str, Any]) -> ChatRequest:
    return ChatRequest(slot=0, messages=[UserMessage("u")], tools=[ToolSchema("f", "d", parameters)])


def with_schema(schema: dict[str, Any]) -> ChatRequest:
    return ChatRequest(slot=0, messages=[UserMessage("u")], response_format={"type": "json_object", "schema": schema})


def refusal(req: ChatRequest) -> str:
    with pytest.raises(RequestError) as caught:
        build_chat_body(req, SETTINGS, total_slots=1)
    return str(caught.value)


class Opaque:
    pass


# (the bad value placed at key "x", what the message says after the path)
BAD: dict[str, tuple[object, str]] = {
    "nan": (float("nan"), " must be a finite number, not nan"),
    "infinity": (float("-inf"), " must be a finite number, not -inf"),
    "a set": ({1, 2}, " is a set, not a JSON value"),
    "bytes": (b"x", " is a bytes, not a JSON value"),
    "an object": (Opaque(), " is a Opaque, not a JSON value"),
    "an integer past 64 bits": (UINT64_MAX + 1, f" must be an integer from {INT64_MIN} to {UINT64_MAX}, not"),
    "an integer below 64 bits": (INT64_MIN - 1, f" must be an integer from {INT64_MIN} to {UINT64_MAX}, not"),
    "an integer past the float range": (10**400, " must be an integer from"),
    "an integer with no repr": (10**5000, " must be an integer from"),  # past Python's 4300 digits
    "a lone surrogate": ("\ud800", " holds text that is not valid Unicode (surrogates not allowed)"),
    "an integer key": ({1: "a", "1": "b"}, " has a key that is not a string: 1"),
    "a bool key": ({True: 1}, " has a key that is not a string: True"),
    "a tuple key": ({("a",): 1}, " has a key that is not a string: ('a',)"),
    "a None key": ({None: 1}, " has a key that is not a string: None"),
    "a lone surrogate key": ({"\udc80": 1}, " key holds text that is not valid Unicode (surrogates not allowed)"),
    "a bad value in a list": ([1, [2, float("nan")]], "[1][1] must be a finite number, not nan"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_tool_parameters_and_response_format_refuse_the_same_value_naming_its_path(case: str) -> None:
    value, message = BAD[case]
    tool_message = refusal(with_parameters({"type": "object", "properties": {"x": value}}))
    format_message = refusal(with_schema({"type": "object", "properties": {"x": value}}))
    assert tool_message.startswith("tools[0].parameters.properties.x" + message), tool_message
    assert format_message.startswith("response_format.schema.properties.x" + message), format_message
    assert tool_message.removeprefix("tools[0].parameters") == format_message.removeprefix("response_format.schema")


def test_a_duplicate_key_through_an_integer_is_refused_not_sent_twice() -> None:
    # `json.dumps` would have sent {"1":...,"1":...}: one key twice.
    parameters = {"type": "object", "properties": {1: {"type": "string"}, "1": {"type": "integer"}}}
    assert refusal(with_parameters(parameters)) == "tools[0].parameters.properties has a key that is not a string: 1"


def test_the_second_tool_is_named_by_its_index() -> None:
    tools = [ToolSchema("f", "d", {"type": "object"}), ToolSchema("g", "d", {"enum": [float("inf")]})]
    req = ChatRequest(slot=0, messages=[UserMessage("u")], tools=tools)
    assert refusal(req) == "tools[1].parameters.enum[0] must be a finite number, not inf"


def test_parameters_nested_to_the_limit_are_sent_and_one_level_more_is_refused() -> None:
    # `parameters` is level 0, so the innermost of these is level MAX_JSON_DEPTH - 1.
    fine: dict[str, Any] = {}
    for _ in range(MAX_JSON_DEPTH - 1):
        fine = {"a": fine}
    body = json.loads(build_chat_body(with_parameters(fine), SETTINGS, total_slots=1))
    assert body["tools"][0]["function"]["parameters"] == fine
    assert refusal(with_parameters({"a": fine})).startswith(
        f"tools[0].parameters is nested more than {MAX_JSON_DEPTH} levels deep (at tools[0].parameters.a"
    )


def test_a_cycle_in_tool_parameters_is_refused() -> None:
    cycle: dict[str, Any] = {"type": "object"}
    cycle["properties"] = {"self": cycle}
    assert refusal(with_parameters(cycle)).startswith(f"tools[0].parameters is nested more than {MAX_JSON_DEPTH}")


def shared(levels: int) -> list[Any]:
    """A tree of 2**levels leaves built from `levels` lists, each holding the next one twice."""
    tree: list[Any] = [0]
    for _ in range(levels):
        tree = [tree, tree]
    return tree


@pytest.mark.parametrize("make", [with_parameters, with_schema], ids=["parameters", "response_format"])
def test_a_tree_that_holds_one_subtree_many_times_is_refused_by_its_size(make: Any) -> None:
    message = refusal(make({"enum": shared(20)}))  # 2**21 values from 21 small lists
    root = "tools[0].parameters" if make is with_parameters else "response_format"
    assert message.startswith(f"{root} holds more than {MAX_JSON_VALUES} values (at ")


def test_a_tree_of_exactly_the_most_values_is_taken() -> None:
    # The root, the "enum" list, and its items: MAX_JSON_VALUES values in all.
    tree = {"enum": list(range(MAX_JSON_VALUES - 2))}
    assert json_tree(tree, "p") == tree
    with pytest.raises(RequestError, match=f"^p holds more than {MAX_JSON_VALUES} values"):
        json_tree({"enum": list(range(MAX_JSON_VALUES - 1))}, "p")


def test_json_values_are_sent_as_json_in_the_callers_order() -> None:
    parameters = {
        "z": (1, 2),
        "a": MappingProxyType({"y": None, "b": True}),
        "m": [INT64_MIN, UINT64_MAX, -0.5, "żółw 🐢"],
    }
    raw = build_chat_body(with_parameters(parameters), SETTINGS, total_slots=1)
    expected = (
        '"parameters":{"z":[1,2],"a":{"y":null,"b":true},'
        '"m":[-9223372036854775808,18446744073709551615,-0.5,"żółw 🐢"]}'
    )
    assert expected.encode() in raw


def test_the_checked_tree_is_a_copy_made_of_plain_json_types() -> None:
    source = {"a": (1, {"b": [2]})}
    tree = json_tree(source, "p")
    assert tree == {"a": [1, {"b": [2]}]}
    assert type(tree["a"]) is list and tree["a"][1] is not source["a"][1]
