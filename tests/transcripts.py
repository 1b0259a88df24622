"""Load the transcripts that ``scripts/record_transcripts.py`` recorded from the real llama-server.

    from transcripts import load_case, case_names   # with tests/ on sys.path
    case = load_case("tool_call")
    case.inputs          # what the request builder consumes (slot, messages, tools, thinking, ...)
    case.request         # the exact request body bytes sent (b"" for a GET)
    case.response_raw    # the bytes exactly as received: status line, headers, body before de-chunking
    case.body            # the response body, de-chunked
    case.events()        # the decoded ``data:`` payloads of a stream, up to ``[DONE]``
    case.nonstream       # the server's own answer to the same request with ``stream: false``
    request_from(case.inputs)   # those inputs as the typed request and settings the builder takes

Fixture layout and the meaning of each file are in ``tests/fixtures/transcripts/README.md``.
The de-chunking here is deliberately small and strict (it is a test oracle, not the client's
HTTP code): it raises ``ValueError`` naming the offset of anything malformed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from domain.messages import (
    AssistantMessage,
    ChatMessage,
    ChatRequest,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)
from domain.request import RequestSettings

TRANSCRIPTS = Path(__file__).resolve().parent / "fixtures" / "transcripts"
MISSING = "no recorded transcripts: tests/fixtures/transcripts/index.json is missing (run `make transcripts`)"


@dataclass(frozen=True)
class RawResponse:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)


def dechunk(data: bytes) -> bytes:
    """Decode a complete ``Transfer-Encoding: chunked`` body (extensions and trailers ignored)."""
    out = bytearray()
    pos = 0
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            raise ValueError(f"chunk size line not terminated at offset {pos}")
        size_text = data[pos:line_end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ValueError(f"bad chunk size {size_text!r} at offset {pos}") from None
        pos = line_end + 2
        if size == 0:
            # Trailer section: header lines up to an empty line.
            while True:
                line_end = data.find(b"\r\n", pos)
                if line_end < 0:
                    raise ValueError(f"trailer not terminated at offset {pos}")
                if line_end == pos:
                    pos += 2
                    break
                pos = line_end + 2
            if pos != len(data):
                raise ValueError(f"{len(data) - pos} bytes after the last chunk at offset {pos}")
            return bytes(out)
        if pos + size + 2 > len(data):
            raise ValueError(f"chunk of {size} bytes at offset {pos} runs past the end ({len(data)})")
        out += data[pos : pos + size]
        if data[pos + size : pos + size + 2] != b"\r\n":
            raise ValueError(f"chunk data at offset {pos} not followed by CRLF")
        pos += size + 2


def split_response(raw: bytes) -> RawResponse:
    """Status line, headers and the decoded body of one complete HTTP/1.1 response."""
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        raise ValueError("no end of headers in the response")
    lines = raw[:head_end].decode("latin-1").split("\r\n")
    version, status, *reason = lines[0].split(" ", 2)
    if not version.startswith("HTTP/1."):
        raise ValueError(f"bad status line {lines[0]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line!r}")
        headers.append((name.strip(), value.strip()))
    rest = raw[head_end + 4 :]
    response = RawResponse(int(status), reason[0] if reason else "", headers, b"")
    encoding = (response.header("Transfer-Encoding") or "").lower()
    length = response.header("Content-Length")
    if "chunked" in encoding:
        body = dechunk(rest)
    elif length is not None:
        if len(rest) != int(length):
            raise ValueError(f"Content-Length {length} but {len(rest)} body bytes")
        body = rest
    else:
        body = rest
    return RawResponse(response.status, response.reason, headers, body)


def sse_payloads(body: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body in order, ``[DONE]`` included if the server sent it."""
    payloads: list[str] = []
    data: list[str] = []
    # Only CR, LF and CRLF end lines (str.splitlines would also split on U+2028 inside JSON).
    for raw_line in re.split(r"\r\n|\r|\n", body.decode("utf-8")):
        if raw_line == "":
            if data:
                payloads.append("\n".join(data))
                data = []
            continue
        if raw_line.startswith(":"):
            continue
        name, _, value = raw_line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))
    if data:
        payloads.append("\n".join(data))
    return payloads


@dataclass(frozen=True)
class Case:
    name: str
    meta: dict[str, Any]
    inputs: dict[str, Any] | None
    request: bytes
    request_raw: bytes
    response_raw: bytes
    response: RawResponse
    nonstream_request: bytes | None
    nonstream_bytes: bytes | None
    files: dict[str, bytes] = field(repr=False)

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def body(self) -> bytes:
        return self.response.body

    @property
    def request_json(self) -> Any:
        return json.loads(self.request) if self.request else None

    @property
    def nonstream(self) -> Any:
        return None if self.nonstream_bytes is None else json.loads(self.nonstream_bytes)

    def events(self) -> list[Any]:
        """Decoded JSON of each ``data:`` payload before ``[DONE]``."""
        out = []
        for payload in sse_payloads(self.body):
            if payload == "[DONE]":
                break
            out.append(json.loads(payload))
        return out


@cache
def index() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((TRANSCRIPTS / "index.json").read_bytes())
    return loaded


def case_names() -> list[str]:
    return sorted(index()["cases"])


def load_case(name: str) -> Case:
    meta = index()["cases"].get(name)
    if meta is None:
        raise KeyError(f"no transcript {name!r}; recorded: {', '.join(case_names())}")
    folder = TRANSCRIPTS / name
    files = {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}
    inputs = json.loads(files["inputs.json"]) if "inputs.json" in files else None
    raw = files["response.raw"]
    return Case(
        name=name,
        meta=meta,
        inputs=inputs,
        request=files.get("request.json", b""),
        request_raw=files["request.raw"],
        response_raw=raw,
        response=split_response(raw),
        nonstream_request=files.get("nonstream_request.json"),
        nonstream_bytes=files.get("nonstream.json"),
        files=files,
    )


def case_params(keep: Callable[[Case], bool], *, none_reason: str | None = None) -> list[Any]:
    """For `pytest.mark.parametrize`: the names of the recorded cases that `keep` accepts. With no
    recordings, one skipped placeholder that says so; with `none_reason`, one too when `keep`
    accepts none of them."""
    if not (TRANSCRIPTS / "index.json").exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=MISSING), id="no-transcripts")]
    names = [name for name in case_names() if keep(load_case(name))]
    if not names and none_reason is not None:
        return [pytest.param(None, marks=pytest.mark.skip(reason=none_reason), id="none")]
    return names


def message_from(data: dict[str, Any]) -> ChatMessage:
    """One message of ``inputs.json`` (OpenAI form) as its domain type."""
    role = data["role"]
    if role == "system":
        return SystemMessage(data["content"])
    if role == "user":
        return UserMessage(data["content"])
    if role == "tool":
        return ToolMessage(data["tool_call_id"], data["content"])
    calls = [
        ToolCall(call["id"], call["function"]["name"], call["function"]["arguments"])
        for call in data.get("tool_calls") or []
    ]
    return AssistantMessage(data.get("content"), data.get("reasoning_content"), calls)


def request_from(inputs: dict[str, Any]) -> tuple[ChatRequest, RequestSettings]:
    """A case's ``inputs.json`` as what ``build_chat_body`` takes: the request and its settings."""
    req = ChatRequest(
        slot=inputs["slot"],
        messages=[message_from(m) for m in inputs["messages"]],
        tools=[ToolSchema(t["name"], t["description"], t["parameters"]) for t in inputs["tools"]],
        thinking=inputs["thinking"],
        tool_choice=inputs["tool_choice"],
    )
    sampling = inputs["sampling"]
    settings = RequestSettings(
        model=inputs["model"],
        max_tokens=inputs["max_tokens"],
        temperature=sampling.get("temperature"),
        top_p=sampling.get("top_p"),
        top_k=sampling.get("top_k"),
        min_p=sampling.get("min_p"),
        seed=sampling.get("seed"),
    )
    return req, settings
