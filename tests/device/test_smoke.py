"""Smoke tests: the presets serve what the inference path relies on (see llama-server.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llama
import pytest

import transcripts

pytestmark = pytest.mark.device

SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 42}


def chat_body(
    messages: list[dict[str, Any]],
    *,
    slot: int = 0,
    stream: bool = True,
    thinking: bool = False,
    max_tokens: int = 32,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str = "auto",
) -> dict[str, Any]:
    """The fields the client sends on every request (the brief's list)."""
    return {
        "model": llama.ALIAS,
        "id_slot": slot,
        "messages": messages,
        "cache_prompt": True,
        "stream": stream,
        "return_progress": True,
        "timings_per_token": True,
        "reasoning_control": True,
        "max_tokens": max_tokens,
        **SAMPLING,
        "tools": tools or [],
        "tool_choice": tool_choice,
        "chat_template_kwargs": {"enable_thinking": thinking},
    }


def deltas(event: dict[str, Any]) -> dict[str, Any]:
    choices = event.get("choices") or [{}]
    delta: dict[str, Any] = choices[0].get("delta") or {}
    return delta


def finish_reason(event: dict[str, Any]) -> str | None:
    choices = event.get("choices") or [{}]
    reason: str | None = choices[0].get("finish_reason")
    return reason


def test_health_answers_ok_once_the_model_is_loaded(tools_server: llama.LlamaServer) -> None:
    assert tools_server.get_json("/health") == (200, {"status": "ok"})


@pytest.mark.parametrize("preset", ["tools", "thinking"])
def test_props_report_the_preset_template_slots_and_per_slot_context(
    preset: str, request: pytest.FixtureRequest
) -> None:
    server: llama.LlamaServer = request.getfixturevalue(f"{preset}_server")
    status, props = server.get_json("/props")
    template = llama.paths().template(llama.PRESETS[preset].template)

    assert status == 200
    assert props["chat_template"].strip() == template.read_text(encoding="utf-8").strip()
    assert props["total_slots"] == llama.SLOTS
    assert props["default_generation_settings"]["n_ctx"] == llama.SLOT_CONTEXT == 4096
    assert props["model_alias"] == llama.ALIAS
    assert Path(props["model_path"]).name == llama.setup.MODEL_FILE


def test_slots_list_every_slot_with_its_own_context(tools_server: llama.LlamaServer) -> None:
    status, slots = tools_server.get_json("/slots")

    assert status == 200
    assert [slot["id"] for slot in slots] == list(range(llama.SLOTS))
    assert all(slot["n_ctx"] == llama.SLOT_CONTEXT for slot in slots)
    assert all(isinstance(slot["is_processing"], bool) for slot in slots)


def test_streamed_completion_reports_prompt_progress_and_per_token_timings(
    tools_server: llama.LlamaServer,
) -> None:
    body = chat_body(
        [{"role": "user", "content": "Name three colours of the sea, one per line."}], slot=1, max_tokens=24
    )
    with tools_server.stream("/v1/chat/completions", body) as events:
        received = list(events)

    progress = [e["prompt_progress"] for e in received if "prompt_progress" in e]
    content = [e for e in received if deltas(e).get("content")]
    finish = [e for e in received if finish_reason(e)]
    assert progress, "no prompt_progress event"
    assert progress[-1]["processed"] == progress[-1]["total"] > 0
    assert content, "no content delta"
    # timings_per_token: every delta chunk carries timings; predicted_n counts up.
    assert all("timings" in e for e in content)
    predicted = [e["timings"]["predicted_n"] for e in content]
    assert predicted == sorted(predicted) and predicted[-1] >= len(content) - 1
    assert len(finish) == 1 and finish[0] is received[-1]
    timings = finish[0]["timings"]
    assert timings["cache_n"] + timings["prompt_n"] == progress[-1]["total"]
    assert len({e["id"] for e in received}) == 1


def test_control_call_ends_a_runaway_thinking_block(thinking_server: llama.LlamaServer) -> None:
    messages = [{"role": "user", "content": llama.LONG_STORY_PROMPT}]
    # Without the control call this prompt keeps thinking to the token limit.
    status, runaway = thinking_server.post_json(
        "/v1/chat/completions", chat_body(messages, stream=False, thinking=True, max_tokens=40)
    )
    assert status == 200
    assert runaway["choices"][0]["finish_reason"] == "length"
    assert runaway["choices"][0]["message"]["reasoning_content"]
    assert not runaway["choices"][0]["message"].get("content")

    control: dict[str, Any] = {}
    after: list[dict[str, Any]] = []
    body = chat_body(messages, thinking=True, max_tokens=80)
    with thinking_server.stream("/v1/chat/completions", body) as events:
        for event in events:
            if "reply" in control:
                after.append(event)
            elif deltas(event).get("reasoning_content") and event["timings"]["predicted_n"] >= 16:
                control["at"] = event["timings"]["predicted_n"]
                control["reply"] = thinking_server.post_json(
                    "/v1/chat/completions/control", {"id": event["id"], "action": "reasoning_end"}
                )

    assert control.get("reply") == (200, {"success": True}), control
    reasoning_after = [e for e in after if deltas(e).get("reasoning_content")]
    content_after = [e for e in after if deltas(e).get("content")]
    # A token or two more of reasoning, then the model has left the thinking block.
    assert len(reasoning_after) <= 8
    assert content_after or any(finish_reason(e) == "stop" for e in after)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_tool_prefill_gives_a_parsed_tool_call(tools_server: llama.LlamaServer, stream: bool) -> None:
    # The small model never calls a tool on its own. It completes a call the request opened
    # (TOOL_PREFILL), and tool_choice "required" lets the grammar end the turn after the call;
    # with "auto" it rambles on after </tool_call> and the server answers 500.
    body = chat_body(
        [
            {"role": "user", "content": "What time is it in Paris?"},
            {"role": "assistant", "content": llama.TOOL_PREFILL},
        ],
        stream=stream,
        max_tokens=64,
        tools=[llama.GET_TIME_TOOL],
        tool_choice="required",
    )
    calls: dict[int, dict[str, str]] = {}
    if stream:
        with tools_server.stream("/v1/chat/completions", body) as events:
            received = list(events)
        for event in received:
            for piece in deltas(event).get("tool_calls", []):
                call = calls.setdefault(piece["index"], {"name": "", "arguments": ""})
                call["name"] += piece.get("function", {}).get("name") or ""
                call["arguments"] += piece.get("function", {}).get("arguments") or ""
        reason = finish_reason(received[-1])
    else:
        status, answer = tools_server.post_json("/v1/chat/completions", body)
        assert status == 200, answer
        for index, call in enumerate(answer["choices"][0]["message"]["tool_calls"]):
            calls[index] = {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        reason = answer["choices"][0]["finish_reason"]

    assert reason == "tool_calls"
    assert calls and all(call["name"] == "get_time" for call in calls.values())
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_router_loads_the_small_model_on_the_first_request_that_names_it(
    router_server: llama.LlamaServer,
) -> None:
    status, models = router_server.get_json("/models")
    assert status == 200
    assert llama.ROUTER_MODEL in [m["id"] for m in models["data"]]

    status, answer = router_server.post_json(
        "/v1/chat/completions",
        {"model": llama.ROUTER_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert status == 200, answer
    assert answer["model"] == llama.ROUTER_MODEL
    status, models = router_server.get_json("/models")
    (entry,) = [m for m in models["data"] if m["id"] == llama.ROUTER_MODEL]
    assert entry["status"]["value"] == "loaded"
    # GETs are routed by ?model=; without it the router cannot choose.
    assert router_server.get_json("/slots")[0] == 400
    status, slots = router_server.get_json(f"/slots?model={llama.ROUTER_MODEL}")
    assert status == 200 and len(slots) == llama.SLOTS


def test_recorded_transcripts_come_from_this_build_and_reassemble(device_artifacts: None) -> None:
    meta = transcripts.index()
    paths = llama.paths()
    # The first line names the llama.cpp version; the second, the compiler, may differ per machine.
    version = llama.setup.binary_version(paths) or ""
    assert meta["server"]["version"].splitlines()[0] == version.splitlines()[0]
    assert meta["model"]["sha256"] == json.loads(paths.model_stamp.read_text())["sha256"]
    for name in transcripts.case_names():
        case = transcripts.load_case(name)
        assert case.status == case.meta["status"], name
        if case.inputs is None or case.status != 200:
            continue
        assert json.loads(case.request)["stream"] is True
        assert json.loads(case.nonstream_request or b"")["stream"] is False
        assert transcripts.sse_payloads(case.body)[-1] == "[DONE]", name
        assert case.events()[0]["id"] == case.meta["id"], name
