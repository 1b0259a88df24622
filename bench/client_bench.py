"""Client CPU per streamed chunk: `app.Client.chat` against openai-python and bare httpx, in one run.

Two llama-server streams, each served verbatim by the fake server in its own process over a Unix
socket: the recorded `response.raw` under `tests/fixtures/transcripts/` with the most events (when
one is recorded), and a synthetic 604-event stream of the same shape (progress, reasoning deltas,
content deltas, per-token timings), the length of a long answer, where the per-request costs
(connect, request, head) weigh less. `--transcript PATH` measures one given `response.raw`
instead. Each round reads the whole stream once with each stack, interleaved so all three see
the same machine. Then the client against itself reading every head by h11, none known beforehand
(`adapters.uds_http.response.KNOWN_HEAD`), each after the other for five times the rounds: what
knowing the stream head saves an answer.

    client   app.Client.chat: slot gate, UdsTransport, SseDecoder, orjson, Assembler, liveness and
             thinking cap, events to a sink, the final Completion
    openai   openai-python's streaming client on httpx.HTTPTransport(uds=...), accumulating the
             same message (content, reasoning, tool calls by index, finish reason, timings)
    httpx    bare httpx + httpx-sse + json.loads (decoding only, nothing accumulated)

CPU is `time.thread_time` of the reading thread from the request to the final message, divided
by the stream's data events. Goal: the client at most 0.15x openai-python's CPU per chunk. Each
run first checks that the client's Completion equals what openai-python accumulated.

Run: `.venv/bin/python bench/client_bench.py [--quick] [--transcript PATH]`. `run(quick)` returns
(name, value) rows for a combined table. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from common import (
    SRC,
    StackResult,
    Stream,
    chunked_response,
    data_events,
    fake_server,
    interleaved,
    recorded_stream,
    report,
    rounds_for,
)

sys.path.insert(0, str(SRC))

from adapters.fake_server import CHUNK_CREATED, CHUNK_ID, ROLE, chunk_timings, sse_event
from adapters.fake_server import chunk as stream_chunk
from adapters.uds_http.response import KNOWN_HEAD
from app.config import parse_config
from app.container import Container
from domain.completion import Completion
from domain.events import ChatEvent
from domain.messages import ChatRequest, SystemMessage, UserMessage

CHAT_PATH = "/v1/chat/completions"
MODEL = "test-model"
TIMEOUT_S = 10.0
GOAL = 0.15
REQUEST = ChatRequest(
    slot=0,
    messages=(SystemMessage("You are a helpful assistant."), UserMessage("Write a long story.")),
    thinking=True,
)


@dataclass
class Message:
    """What a stack accumulated: compared between the client and openai-python."""

    content: str | None
    reasoning: str | None
    tool_calls: list[tuple[str, str, str]]
    finish_reason: str | None
    predicted_n: int


# ---------------------------------------------------------------------------------------------
# The stream


def synthetic_stream(events: int = 604) -> Stream:
    """A stream shaped like llama-server's with `return_progress` and `timings_per_token` on:
    two progress chunks, a role-only chunk sharing its HTTP chunk with the first delta, half the
    tokens reasoning and half content (one delta per chunk, each with timings), the finish chunk
    and `[DONE]`; chunked framing, one HTTP chunk per event."""
    this = partial(stream_chunk, cid=CHUNK_ID, created=CHUNK_CREATED, model=MODEL, fingerprint="b0-unknown")

    def event(
        delta: Mapping[str, object] | None = None,
        *,
        finish: str | None = None,
        n: int | None = None,
        progress: tuple[int, int, int] | None = None,
        progress_ms: int = 0,
    ) -> bytes:
        timings = None if n is None else chunk_timings(n, prompt_ms=124.437, token_ms=7.3446, rates=True)
        return sse_event(this(delta, finish=finish, timings=timings, progress=progress, progress_ms=progress_ms))

    tokens = events - 4  # two progress chunks, the role-only chunk and the finish chunk
    thinking = tokens // 2
    chunks = [
        event(ROLE, n=0, progress=(42, 0, 0), progress_ms=0),
        event(ROLE, n=0, progress=(42, 0, 42), progress_ms=124),
    ]
    first = True
    for n in range(1, tokens + 1):
        word = f" w{n}" if n % 7 else f" w{n}.\n"
        delta = {"reasoning_content": word} if n <= thinking else {"content": word}
        piece = event(delta, n=n)
        if first:
            piece = event(ROLE) + piece
            first = False
        chunks.append(piece)
    chunks.append(event({}, finish="stop", n=tokens))
    chunks.append(b"data: [DONE]\n\n")
    head = (
        b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nX-Accel-Buffering: no\r\n"
        b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    raw = chunked_response(head, chunks)
    return Stream(f"synthetic ({events} events)", raw, data_events(raw))


# ---------------------------------------------------------------------------------------------
# The three stacks: each reads the stream to its end and returns what it accumulated


def client_stack(socket_path: str) -> Callable[[], Message]:
    config = parse_config(
        {
            "proxy": {"burst": 1_000_000, "rate": 1_000_000},  # no accept limit to keep on this path
            "socket": socket_path,
            "model": MODEL,
            "limits": {"poll_ms": int(TIMEOUT_S * 1000), "thinking_cap": 1 << 20},
            "expect": {"chat_template_sha256": "0" * 64, "n_ctx": 4096, "total_slots": 1},
        }
    )
    client = Container(config=config).client()
    sink: list[ChatEvent] = []

    def read_stream() -> Message:
        sink.clear()
        completion = client.chat(REQUEST, sink.append)
        return message_of(completion)

    return read_stream


def message_of(completion: Completion) -> Message:
    return Message(
        completion.content,
        completion.reasoning_content,
        [(c.id, c.name, c.arguments) for c in completion.tool_calls],
        completion.finish_reason.value,
        completion.timings.predicted_n,
    )


OPENAI_EXTRA_BODY = {
    "id_slot": 0,
    "cache_prompt": True,
    "return_progress": True,
    "timings_per_token": True,
    "reasoning_control": True,
    "chat_template_kwargs": {"enable_thinking": True},
}


def openai_messages() -> list[Any]:
    return [
        {"role": "system", "content": REQUEST.messages[0].content},
        {"role": "user", "content": REQUEST.messages[1].content},
    ]


class OpenAIAccumulator:
    """The message of an openai-python stream, chunk by chunk (`add`), as `Message`: content,
    reasoning, tool calls by index, finish reason and llama-server's timings."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list[Any]] = {}
        self.finish: str | None = None
        self.timings: dict[str, Any] | None = None

    def add(self, chunk: Any) -> None:
        extra = chunk.model_extra or {}
        if extra.get("timings") is not None:
            self.timings = extra["timings"]
        if not chunk.choices:
            return
        choice = chunk.choices[0]
        delta = choice.delta
        text = getattr(delta, "reasoning_content", None)
        if text:
            self.reasoning.append(text)
        if delta.content:
            self.content.append(delta.content)
        for call in delta.tool_calls or ():
            entry = self.calls.setdefault(call.index, [None, None, []])
            if call.id:
                entry[0] = call.id
            if call.function is not None:
                if call.function.name:
                    entry[1] = call.function.name
                if call.function.arguments:
                    entry[2].append(call.function.arguments)
        if choice.finish_reason is not None:
            self.finish = choice.finish_reason

    def message(self) -> Message:
        return Message(
            "".join(self.content) if self.content else None,
            "".join(self.reasoning) if self.reasoning else None,
            [(c[0] or "", c[1] or "", "".join(c[2])) for _, c in sorted(self.calls.items())],
            self.finish,
            int((self.timings or {}).get("predicted_n", 0)),
        )


def openai_stack(socket_path: str) -> Callable[[], Message]:
    import httpx
    import openai

    http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), timeout=TIMEOUT_S)
    client = openai.OpenAI(base_url="http://localhost/v1", api_key="none", http_client=http, max_retries=0)
    messages = openai_messages()

    def read_stream() -> Message:
        accumulated = OpenAIAccumulator()
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, extra_body=OPENAI_EXTRA_BODY
        )
        for chunk in stream:
            accumulated.add(chunk)
        return accumulated.message()

    return read_stream


def httpx_stack(socket_path: str) -> Callable[[], Message]:
    import httpx
    import httpx_sse

    http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), timeout=TIMEOUT_S)
    url = "http://localhost" + CHAT_PATH
    body = b'{"model":"test-model","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    headers = {"content-type": "application/json"}

    def read_stream() -> Message:
        with httpx_sse.connect_sse(http, "POST", url, content=body, headers=headers) as source:
            for sse in source.iter_sse():
                if sse.data == "[DONE]":
                    break
                json.loads(sse.data)
        return Message(None, None, [], None, 0)

    return read_stream


# ---------------------------------------------------------------------------------------------
# Measuring


def every_head_through_h11(read: Callable[[], Message]) -> Callable[[], Message]:
    """`read` with no stream head known beforehand: h11 reads every head, as it would if the
    server's heads differed from one answer to the next (`adapters.uds_http.response.KNOWN_HEAD`)."""

    def read_stream() -> Message:
        KNOWN_HEAD.clear()
        return read()

    return read_stream


def measure(stream: Stream, stacks: dict[str, Callable[[], Message]], rounds: int, warmup: int) -> list[StackResult]:
    timed = interleaved(stacks, rounds, warmup)
    return [StackResult(name, stream.events, t.wall_s, t.cpu_s) for name, t in timed.items()]


def check_same_message(stacks: dict[str, Callable[[], Message]]) -> None:
    ours, theirs = stacks["client"](), stacks["openai"]()
    if ours != theirs:
        raise RuntimeError(f"the client and openai-python disagree:\n  client {ours}\n  openai {theirs}")


def bench_stream(stream: Stream, quick: bool) -> list[tuple[str, str]]:
    rounds, warmup = rounds_for(quick)
    with fake_server(stream.raw, prefix="client-bench-") as socket_path:
        stacks = {
            "client": client_stack(socket_path),
            "openai": openai_stack(socket_path),
            "httpx": httpx_stack(socket_path),
        }
        check_same_message(stacks)
        results = measure(stream, stacks, rounds, warmup)
        known = known_head_rows(stream, socket_path, quick)
    return rows(stream, results) + known


def known_head_rows(stream: Stream, socket_path: str, quick: bool) -> list[tuple[str, str]]:
    """The client against itself with every head read by h11: two stacks, each after the other in
    turn, for more rounds than the comparison above (a few per cent is what is measured)."""
    rounds, warmup = rounds_for(quick)
    stacks = {"client": client_stack(socket_path), "h11": every_head_through_h11(client_stack(socket_path))}
    timed = interleaved(stacks, rounds * 5, warmup)
    client, h11 = (statistics.median(timed[name].cpu_s) * 1e6 / stream.events for name in stacks)
    tag = f"client [{stream.events} events]"
    return [
        (f"{tag}: the same, every head read by h11 (none known), CPU per chunk", f"{h11:.2f} µs"),
        (f"{tag}: CPU per chunk, client / the same reading every head by h11", f"{client / h11:.3f}x"),
    ]


def run(quick: bool = False, transcript: str | None = None) -> list[tuple[str, str]]:
    if transcript is not None:
        raw = Path(transcript).read_bytes()
        streams = [Stream(transcript, raw, data_events(raw))]
    else:
        recorded = recorded_stream()
        streams = [*([recorded] if recorded else []), synthetic_stream()]
    return [row for stream in streams for row in bench_stream(stream, quick)]


LABELS = {
    "client": "app.Client.chat (to the Completion)",
    "openai": "openai-python stream, accumulated",
    "httpx": "httpx + httpx-sse + json.loads",
}


def rows(stream: Stream, results: list[StackResult]) -> list[tuple[str, str]]:
    by_name = {r.name: r for r in results}
    per_event = len(stream.raw) / max(stream.events, 1)
    tag = f"client [{stream.events} events]"
    out = [(f"{tag}: stream", f"{stream.source}, {per_event:.0f} bytes/event")]
    for r in results:
        value = f"{r.cpu_us_per_event:.2f} µs ({r.wall_ms:.1f} ms/stream)"
        out.append((f"{tag}: {LABELS[r.name]} CPU per chunk", value))
    ratio = by_name["client"].cpu_us_per_event / by_name["openai"].cpu_us_per_event
    verdict = "met" if ratio <= GOAL else "MISSED"
    out.append((f"{tag}: CPU per chunk, client / openai-python (goal <= {GOAL})", f"{ratio:.3f}x ({verdict})"))
    out.append(
        (
            f"{tag}: CPU per chunk, client / bare httpx + httpx-sse",
            f"{by_name['client'].cpu_us_per_event / by_name['httpx'].cpu_us_per_event:.2f}x",
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10 rounds instead of 40")
    parser.add_argument("--transcript", help="measure this response.raw only")
    args = parser.parse_args()
    report(lambda: run(quick=args.quick, transcript=args.transcript))


if __name__ == "__main__":
    main()
