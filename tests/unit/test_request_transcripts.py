"""The request builder renders each recorded case's inputs to the request the recorder sent.

Compared as JSON values, not bytes: the recorder's key order is its own. The one pinned
difference: with no tools, the builder sends neither `tools` nor `tool_choice`, where the
recorder sent `"tools": []` and `"tool_choice": "auto"` (the template renders the same prompt
either way; the device tier checks the answers match).
"""

from __future__ import annotations

import json

import pytest

from domain.request import build_chat_body
from transcripts import case_params, load_case, request_from

SLOTS = 2  # every recorded server runs two slots
CHAT_CASES = case_params(lambda case: case.inputs is not None)


@pytest.mark.parametrize("name", CHAT_CASES)
def test_builder_renders_the_recorded_request(name: str) -> None:
    case = load_case(name)
    assert case.inputs is not None
    req, settings = request_from(case.inputs)
    mine = json.loads(build_chat_body(req, settings, total_slots=SLOTS))
    recorded = json.loads(case.request)
    if not case.inputs["tools"]:
        assert recorded.pop("tools") == []
        recorded.pop("tool_choice")
    assert mine == recorded


@pytest.mark.parametrize("name", CHAT_CASES)
def test_builder_output_is_byte_stable_for_the_recorded_inputs(name: str) -> None:
    case = load_case(name)
    assert case.inputs is not None
    first = build_chat_body(*request_from(case.inputs), total_slots=SLOTS)
    assert build_chat_body(*request_from(case.inputs), total_slots=SLOTS) == first
