"""Folds the decoded chunks of one chat-completions stream into events and one `Completion`.
Sans-IO: the caller decodes SSE and JSON and feeds each chunk (a dict) to `feed` (its events) or
`feed_into` (appended to a list); `result` gives the `Completion` once the final chunk has come.

Invariants:
- A chunk's events come in order: `Progress` (its top-level `prompt_progress`), `Reasoning`,
  `Content`, `ToolCallDelta`s; role-only and empty deltas and `choices: []` yield none.
- Tool-call deltas merge by `index`: `id` and `name` are set by the first delta that carries them (a
  different later value is a `ProtocolError`); `arguments` pieces are concatenated.
- `timings` are the latest seen. `reasoning_tokens` never falls and is at least both the latest
  reasoning chunk's `timings.predicted_n` (less the tokens content took before it: reasoning after
  an answer began counts its own) and the count of chunks with reasoning text, so a stuck or missing
  `predicted_n` cannot hold the thinking cap off. A delta with reasoning and answer text (or a tool
  call) counts its new tokens as reasoning: the cap errs toward holding. `reasoned` says if the last
  chunk carried reasoning text, whatever else it carried: the cap is checked on every such chunk.
  `in_reasoning` holds from a reasoning delta to a content or tool-call delta or the final chunk.
- `advanced` says if the last chunk moved generation on (the liveness rule): new text, a tool call's
  first name, a `prompt_progress` whose `processed` grew (up to its first `total` and
  `max_prompt_tokens`, a bound the client knows), a `predicted_n` that grew (up to `max_predicted`),
  or the final chunk; never a role-only or empty delta, `{}`, `choices: []`, a repeated progress or
  an id alone, just like a keep-alive comment.
- At most `PIECES_PER_TOKEN` chunks that grow the answer per token of `max_predicted`, plus
  `PIECES_SLACK`; one more is a `ProtocolError`. llama-server sends a chunk per change a token makes
  (its reasoning, its content, each tool call it touches), so an honest stream never nears it, and
  text cannot keep a call alive past the tokens it asked for (one character each `liveness_ms` would
  otherwise go on for `answer_bytes` of them).
- The answer (content, reasoning, tool-call ids, names and arguments, in UTF-8 bytes) is capped at
  `max_answer_bytes`, tool-call indexes at `max_tool_calls`; past either, `ProtocolError`. Streamed
  text is kept as UTF-8 in one growing buffer each, never as an object per delta.
- Every chunk with an `id` carries the first one's: another is another generation (a re-attach
  answered with some other stream), a `ProtocolError`. Counts (`timings`' and `prompt_progress`')
  are non-negative integers, as llama-server's all are.
- An error chunk raises `HttpError(code, the chunk as JSON)`, a malformed one `ProtocolError`; then
  the assembler refuses input. `result` before the final chunk raises `StreamClosedEarly`.

`feed` runs once per token, so it avoids validation libraries and allocates only the events.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from domain.completion import Completion, FinishReason, Timings
from domain.errors import InferError, ProtocolError, StreamClosedEarly, shown, stream_error
from domain.events import ChatEvent, Content, EventList, Progress, Reasoning
from domain.tool_calls import ToolCalls

_FINISH = {reason.value: reason for reason in FinishReason}

# Chunks that grow the answer, per token of `max_predicted` and in all besides (see the module).
PIECES_PER_TOKEN = 4
PIECES_SLACK = 16


def _int_field(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key, 0)
    if type(value) is not int or value < 0:  # a count: llama-server's are never negative
        raise ProtocolError(f"{where}.{key} is {shown(value)}, not a non-negative integer")
    return value


class Assembler:
    """State of one stream. Read `completion_id`, `reasoning_tokens`, `reasoned`, `in_reasoning`,
    `advanced` and `finished` between chunks; plain attributes for speed, not to be assigned.

    `max_answer_bytes` caps the assembled answer, `max_tool_calls` the number of tool calls;
    `max_predicted` bounds the `predicted_n` that still counts as progress (the request's
    `max_tokens`), `max_prompt_tokens` the `processed` of `prompt_progress` (see
    `domain.chat_stream.prompt_token_bound`). `None` leaves any of them unbounded."""

    __slots__ = (
        "_answer_bytes",
        "_answer_cap",
        "_chunks",
        "_content",
        "_failed",
        "_finish",
        "_max_answer",
        "_max_pieces",
        "_max_predicted",
        "_max_prompt",
        "_outside",
        "_pieces",
        "_predicted",
        "_processed",
        "_progress_total",
        "_reasoning",
        "_reasoning_chunks",
        "_timings",
        "_tools",
        "advanced",
        "completion_id",
        "finished",
        "in_reasoning",
        "reasoned",
        "reasoning_tokens",
    )

    def __init__(
        self,
        *,
        max_answer_bytes: int | None = None,
        max_predicted: int | None = None,
        max_tool_calls: int | None = None,
        max_prompt_tokens: int | None = None,
    ) -> None:
        self.completion_id: str | None = None
        self.reasoning_tokens = 0
        self.in_reasoning = False
        self.reasoned = False  # the last chunk carried reasoning text
        self.finished = False
        self.advanced = False
        self._max_answer = max_answer_bytes
        self._max_predicted = max_predicted
        self._max_prompt = max_prompt_tokens
        self._answer_bytes = 0
        self._answer_cap = sys.maxsize if max_answer_bytes is None else max_answer_bytes
        self._reasoning_chunks = 0
        self._outside = 0  # of `predicted_n`, the tokens generated outside the reasoning
        self._pieces = 0  # chunks that grew the answer
        self._max_pieces = (
            sys.maxsize
            if max_predicted is None
            else PIECES_PER_TOKEN * max_predicted + PIECES_SLACK
        )
        self._predicted = 0
        self._processed = -1
        self._progress_total: int | None = None
        self._content = bytearray()  # UTF-8, as are the two below
        self._reasoning = bytearray()
        self._tools = ToolCalls(max_tool_calls)
        self._timings: dict[str, Any] | None = None
        self._finish: FinishReason | None = None
        self._failed: InferError | None = None
        self._chunks = 0

    def feed(self, chunk: dict[str, Any]) -> tuple[ChatEvent, ...]:
        """The events `chunk` carries; raises `HttpError` for an error chunk, `ProtocolError`
        for a malformed one."""
        out: list[ChatEvent] = []
        self.feed_into(chunk, out)
        return tuple(out)

    def feed_into(self, chunk: dict[str, Any], out: EventList) -> int:
        """`feed`, the events appended to `out` (none of a chunk that fails), no list of its own
        made per chunk; returns where in `out` they begin."""
        if self._failed is not None:
            raise ProtocolError(f"chunk after the stream failed ({self._failed})")
        self._chunks += 1
        self.advanced = self.reasoned = False
        mark = len(out)
        try:
            self._feed(chunk, out)
            return mark
        except InferError as exc:
            self._failed = exc
            del out[mark:]
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            self._failed = ProtocolError(f"malformed chunk {self._chunks}: {exc!r}: {shown(chunk)}")
            del out[mark:]
            raise self._failed from exc

    def _feed(self, chunk: dict[str, Any], out: EventList) -> None:
        if "error" in chunk:
            raise stream_error(chunk, json.dumps(chunk, ensure_ascii=False, separators=(",", ":")))
        cid = chunk.get("id")
        if cid != self.completion_id and cid is not None:
            if type(cid) is not str:  # never compared, it would let another generation in
                raise ProtocolError(f"chunk {self._chunks} has id {shown(cid)}, not a string")
            if self.completion_id is not None:  # a replay of another generation, spliced in
                raise ProtocolError(
                    f"chunk {self._chunks} has id {shown(cid)},"
                    f" not the stream's {self.completion_id!r}"
                )
            if cid:
                self.completion_id = cid
        timings = chunk.get("timings")
        predicted = None
        if timings is not None:
            self._timings = timings
            predicted = timings.get("predicted_n")
            if type(predicted) is int and predicted >= 0:
                if self._predicted < predicted and (
                    self._max_predicted is None or predicted <= self._max_predicted
                ):
                    self._predicted = predicted
                    self.advanced = True
            elif predicted is not None:
                raise ProtocolError(
                    f"timings.predicted_n is {shown(predicted)}, not a non-negative integer"
                )
        progress = chunk.get("prompt_progress")
        if progress is not None:
            out.append(self._progress(progress))
        choices = chunk.get("choices")
        if not choices:
            return
        if type(choices) is not list:
            raise ProtocolError(
                f"chunk {self._chunks}: choices is a {type(choices).__name__}, not a list"
            )
        if len(choices) != 1:
            raise ProtocolError(
                f"chunk {self._chunks} has {len(choices)} choices; one was asked for"
            )
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            grown = self._answer_bytes
            self._delta(delta, predicted, out)
            if self._answer_bytes != grown:
                self._pieces += 1
                if self._pieces > self._max_pieces:
                    raise ProtocolError(
                        f"the answer grew in {self._pieces} chunks,"
                        f" more than max_tokens={self._max_predicted} allows"
                        f" ({PIECES_PER_TOKEN} a token, plus {PIECES_SLACK})"
                    )
        reason = choice.get("finish_reason")
        if reason is not None:
            finish = _FINISH.get(reason)
            if finish is None:
                raise ProtocolError(f"unknown finish_reason {shown(reason)}")
            self._finish = finish
            self.finished = True
            self.advanced = True
            self.in_reasoning = False

    def _delta(self, delta: dict[str, Any], predicted: object, out: EventList) -> None:
        """The events of one choice's `delta`, appended to `out`."""
        text = delta.get("reasoning_content")
        if text is not None:
            if type(text) is not str:
                raise ProtocolError(f"reasoning_content is a {type(text).__name__}, not a string")
            if text:
                raw = text.encode()  # UTF-8 (the default; no argument is faster)
                self._answer_bytes += len(raw)
                if self._answer_bytes > self._answer_cap:
                    raise self._past_cap()
                self._reasoning += raw
                self.in_reasoning = self.reasoned = True
                self.advanced = True
                self._reasoning_chunks += 1
                tokens = max(self.reasoning_tokens, self._reasoning_chunks)
                if type(predicted) is int and predicted - self._outside > tokens:
                    tokens = predicted - self._outside
                self.reasoning_tokens = tokens
                out.append(Reasoning(text))
        text = delta.get("content")
        if text is not None:
            if type(text) is not str:
                raise ProtocolError(f"content is a {type(text).__name__}, not a string")
            if text:
                raw = text.encode()  # UTF-8
                self._answer_bytes += len(raw)
                if self._answer_bytes > self._answer_cap:
                    raise self._past_cap()
                self._content += raw
                self.in_reasoning = False
                self.advanced = True
                out.append(Content(text))
                self._spent_outside(predicted)
        calls = delta.get("tool_calls")
        if calls:
            self.in_reasoning = False
            grew, deltas = self._tools.feed(calls, self._grow, self._chunks)
            self.advanced = self.advanced or grew
            out.extend(deltas)
            self._spent_outside(predicted)

    def _spent_outside(self, predicted: object) -> None:
        """An answer's text or tool call came at `predicted`: reasoning after it counts its own."""
        if type(predicted) is int and predicted > self.reasoning_tokens + self._outside:
            self._outside = predicted - self.reasoning_tokens

    def _progress(self, progress: dict[str, Any]) -> Progress:
        event = Progress(
            _int_field(progress, "total", "prompt_progress"),
            _int_field(progress, "cache", "prompt_progress"),
            _int_field(progress, "processed", "prompt_progress"),
        )
        # Only growth up to the total the first report gave, and within the client's own bound,
        # counts: a server cannot keep a call alive by repeating or inflating its progress.
        if self._progress_total is None:
            bound = self._max_prompt
            self._progress_total = event.total if bound is None else min(event.total, bound)
        if self._processed < event.processed <= self._progress_total:
            self._processed = event.processed
            self.advanced = True
        return event

    def _grow(self, text: str) -> bytes:
        """`text` charged to the answer, as UTF-8."""
        raw = text.encode()  # UTF-8
        self._answer_bytes += len(raw)
        if self._answer_bytes > self._answer_cap:
            raise self._past_cap()
        return raw

    def _past_cap(self) -> ProtocolError:
        limit = self._max_answer
        return ProtocolError(
            f"the answer grew past the {limit}-byte limit (answer_bytes)"
            f" after {self._chunks} chunks"
        )

    @property
    def timings(self) -> Timings:
        """The latest per-chunk timings (zeros before any)."""
        t = self._timings
        if t is None:
            return Timings()
        if not isinstance(t, dict):
            raise ProtocolError(f"timings is {shown(t)}, not an object")
        return Timings(
            _int_field(t, "cache_n", "timings"),
            _int_field(t, "prompt_n", "timings"),
            _int_field(t, "predicted_n", "timings"),
        )

    def result(self, thinking_capped: bool = False) -> Completion:
        """The assembled message; `StreamClosedEarly` if the final chunk was never seen."""
        if self._failed is not None:
            raise ProtocolError(f"no result: the stream failed ({self._failed})")
        if self._finish is None:
            raise StreamClosedEarly(
                "the stream ended before its final chunk"
                f" (no finish_reason after {self._chunks} chunks)"
            )
        calls = self._tools.result()
        return Completion(
            id=self.completion_id or "",
            content=self._content.decode("utf-8") if self._content else None,
            reasoning_content=self._reasoning.decode("utf-8") if self._reasoning else None,
            tool_calls=calls,
            finish_reason=self._finish,
            timings=self.timings,
            reasoning_tokens=self.reasoning_tokens,
            thinking_capped=thinking_capped,
        )
