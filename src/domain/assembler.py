"""Folds the decoded chunks of one chat-completions stream into events and one `Completion`.

Sans-IO: the caller decodes SSE and JSON and feeds each chunk (a dict) to `feed`, which returns
the events it carries; `result` gives the `Completion` once the final chunk has been seen.

Invariants:
- One chunk may carry `prompt_progress` (top level) and a delta; its events come in that order:
  `Progress`, then `Reasoning`, `Content`, `ToolCallDelta`s. Role-only and empty deltas, and
  chunks with `choices: []` (usage), yield nothing.
- Tool-call deltas merge by `index`: `id` and `name` are set by the first delta that carries
  them (a later equal value is ignored, a different one is a `ProtocolError`); `arguments`
  pieces are concatenated; `type` is never concatenated.
- `timings` are the latest seen on any chunk. `reasoning_tokens` never falls and is at least
  both the `timings.predicted_n` of the latest chunk that carried `reasoning_content` and the
  number of chunks that carried reasoning text, so a server whose `predicted_n` is stuck or
  missing cannot hold the thinking cap off; `in_reasoning` is true from a reasoning delta until a
  content or tool-call delta or the final chunk.
- `advanced` says whether the last chunk fed moved the generation on (the liveness rule): new
  text in content or reasoning, a tool call's first name or an arguments piece, a
  `prompt_progress` whose `processed` grew (up to the `total` its first one gave, and never past
  `max_prompt_tokens`, a bound the client knows: a server's `total` alone could be 2**62), a
  `timings.predicted_n` that grew (up to `max_predicted`: the server can hold text back while
  tokens advance), or the final chunk. A role-only or empty delta, `{}`, `choices: []`, a repeated
  progress or an id alone advance nothing, exactly like a keep-alive comment.
- The assembled answer (content, reasoning, tool-call ids, names and arguments, in UTF-8 bytes)
  is capped at `max_answer_bytes`; past it, `ProtocolError`. At most `max_tool_calls` distinct
  tool-call indexes are taken; one more is a `ProtocolError` (an index costs memory even when
  its deltas carry no byte of answer).
- Memory follows the answer's size, not the number of chunks: streamed text (content, reasoning,
  each call's arguments) is kept as UTF-8 in one growing buffer each, never as an object per
  delta: at most about `max_answer_bytes` (and an eighth), plus the `Completion`'s `str`s.
- An error chunk (`{"error": ...}`) raises `HttpError(code, the chunk as JSON)`; a malformed
  chunk raises `ProtocolError`. After either, the assembler refuses further input.
- `finished` turns true on the chunk with a `finish_reason`; `result` before that raises
  `StreamClosedEarly`.

`feed` runs once per token, so it avoids validation libraries and allocates only the events.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from domain.completion import Completion, FinishReason, Timings
from domain.errors import InferError, ProtocolError, StreamClosedEarly, shown, stream_error
from domain.events import ChatEvent, Content, Progress, Reasoning, ToolCallDelta
from domain.messages import ToolCall

_FINISH = {reason.value: reason for reason in FinishReason}
_NOTHING: tuple[ChatEvent, ...] = ()


class _Call:
    """One tool call being assembled."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments = bytearray()  # UTF-8


def _set_once(index: int, field: str, old: str | None, new: object) -> str | None:
    if new is None or new == "":
        return old
    if type(new) is not str:
        raise ProtocolError(f"tool call {index}: {field} is a {type(new).__name__}, not a string")
    if old is not None and old != new:
        raise ProtocolError(f"tool call {index} changed its {field} from {shown(old)} to {shown(new)}")
    return new


def _int_field(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key, 0)
    if type(value) is not int:
        raise ProtocolError(f"{where}.{key} is {shown(value)}, not an integer")
    return value


class Assembler:
    """State of one stream. Read `completion_id`, `reasoning_tokens`, `in_reasoning`, `advanced`
    and `finished` between chunks; they are plain attributes for speed, not to be assigned.

    `max_answer_bytes` caps the assembled answer, `max_tool_calls` the number of tool calls;
    `max_predicted` bounds the `predicted_n` that still counts as progress (the request's
    `max_tokens`), `max_prompt_tokens` the `processed` of `prompt_progress` (see
    `domain.chat_stream.prompt_token_bound`). `None` leaves any of them unbounded."""

    __slots__ = (
        "_answer_bytes",
        "_answer_cap",
        "_calls",
        "_chunks",
        "_content",
        "_failed",
        "_finish",
        "_max_answer",
        "_max_calls",
        "_max_predicted",
        "_max_prompt",
        "_predicted",
        "_processed",
        "_progress_total",
        "_reasoning",
        "_reasoning_chunks",
        "_timings",
        "advanced",
        "completion_id",
        "finished",
        "in_reasoning",
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
        self.finished = False
        self.advanced = False
        self._max_answer = max_answer_bytes
        self._max_predicted = max_predicted
        self._max_calls = max_tool_calls
        self._max_prompt = max_prompt_tokens
        self._answer_bytes = 0
        self._answer_cap = sys.maxsize if max_answer_bytes is None else max_answer_bytes
        self._reasoning_chunks = 0
        self._predicted = 0
        self._processed = -1
        self._progress_total: int | None = None
        self._content = bytearray()  # UTF-8, as are the two below
        self._reasoning = bytearray()
        self._calls: dict[int, _Call] = {}
        self._timings: dict[str, Any] | None = None
        self._finish: FinishReason | None = None
        self._failed: InferError | None = None
        self._chunks = 0

    def feed(self, chunk: dict[str, Any]) -> tuple[ChatEvent, ...]:
        """The events `chunk` carries; raises `HttpError` for an error chunk, `ProtocolError`
        for a malformed one."""
        if self._failed is not None:
            raise ProtocolError(f"chunk after the stream failed ({self._failed})")
        self._chunks += 1
        self.advanced = False
        try:
            return self._feed(chunk)
        except InferError as exc:
            self._failed = exc
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            self._failed = ProtocolError(f"malformed chunk {self._chunks}: {exc!r}: {shown(chunk)}")
            raise self._failed from exc

    def _feed(self, chunk: dict[str, Any]) -> tuple[ChatEvent, ...]:
        if "error" in chunk:
            raise stream_error(chunk, json.dumps(chunk, ensure_ascii=False, separators=(",", ":")))
        if self.completion_id is None:
            cid = chunk.get("id")
            if type(cid) is str and cid:
                self.completion_id = cid
        timings = chunk.get("timings")
        predicted = None
        if timings is not None:
            self._timings = timings
            predicted = timings.get("predicted_n")
            if type(predicted) is int:
                if self._predicted < predicted and (self._max_predicted is None or predicted <= self._max_predicted):
                    self._predicted = predicted
                    self.advanced = True
            elif predicted is not None:
                raise ProtocolError(f"timings.predicted_n is {shown(predicted)}, not an integer")
        events = _NOTHING
        progress = chunk.get("prompt_progress")
        if progress is not None:
            events = (self._progress(progress),)
        choices = chunk.get("choices")
        if not choices:
            return events
        if type(choices) is not list:
            raise ProtocolError(f"chunk {self._chunks}: choices is a {type(choices).__name__}, not a list")
        if len(choices) != 1:
            raise ProtocolError(f"chunk {self._chunks} has {len(choices)} choices; one was asked for")
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            events = self._delta(delta, predicted, events)
        reason = choice.get("finish_reason")
        if reason is not None:
            finish = _FINISH.get(reason)
            if finish is None:
                raise ProtocolError(f"unknown finish_reason {shown(reason)}")
            self._finish = finish
            self.finished = True
            self.advanced = True
            self.in_reasoning = False
        return events

    def _delta(self, delta: dict[str, Any], predicted: object, events: tuple[ChatEvent, ...]) -> tuple[ChatEvent, ...]:
        """The events of one choice's `delta`, appended to `events`."""
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
                self.in_reasoning = True
                self.advanced = True
                self._reasoning_chunks += 1
                tokens = max(self.reasoning_tokens, self._reasoning_chunks)
                if type(predicted) is int and predicted > tokens:
                    tokens = predicted
                self.reasoning_tokens = tokens
                events = (*events, Reasoning(text))
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
                events = (*events, Content(text))
        calls = delta.get("tool_calls")
        if calls:
            self.in_reasoning = False
            events = (*events, *self._tool_deltas(calls))
        return events

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
        return ProtocolError(f"the answer grew past the {limit}-byte limit (answer_bytes) after {self._chunks} chunks")

    def _tool_deltas(self, calls: list[dict[str, Any]]) -> list[ChatEvent]:
        out: list[ChatEvent] = []
        for delta in calls:
            index = delta.get("index")
            if type(index) is not int or index < 0:
                raise ProtocolError(f"tool call delta has index {shown(index)}, not a non-negative integer")
            call = self._calls.get(index)
            if call is None:
                if self._max_calls is not None and len(self._calls) >= self._max_calls:
                    raise ProtocolError(
                        f"the answer grew past the {self._max_calls}-tool-call limit (tool_calls)"
                        f" with index {index} after {self._chunks} chunks"
                    )
                call = self._calls[index] = _Call()
            function = delta.get("function") or {}
            new_id = delta.get("id")
            name = function.get("name")
            old_id, old_name = call.id, call.name
            call.id = _set_once(index, "id", old_id, new_id)
            call.name = _set_once(index, "name", old_name, name)
            # `_set_once` refused a changed value, so a value is new only where there was none.
            if old_id is None and call.id is not None:
                self._grow(call.id)
            if old_name is None and call.name is not None:
                self._grow(call.name)
                self.advanced = True
            arguments = function.get("arguments")
            if arguments is None:
                arguments = ""
            elif type(arguments) is not str:
                raise ProtocolError(f"tool call {index}: arguments is a {type(arguments).__name__}")
            elif arguments:
                call.arguments += self._grow(arguments)
                self.advanced = True
            out.append(ToolCallDelta(index, new_id or None, name or None, arguments))
        return out

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
                f"the stream ended before its final chunk (no finish_reason after {self._chunks} chunks)"
            )
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if call.name is None:
                raise ProtocolError(f"tool call {index} never named its function")
            calls.append(ToolCall(call.id or "", call.name, call.arguments.decode("utf-8")))
        return Completion(
            id=self.completion_id or "",
            content=self._content.decode("utf-8") if self._content else None,
            reasoning_content=self._reasoning.decode("utf-8") if self._reasoning else None,
            tool_calls=tuple(calls),
            finish_reason=self._finish,
            timings=self.timings,
            reasoning_tokens=self.reasoning_tokens,
            thinking_capped=thinking_capped,
        )
