"""One chat-completions stream, sans-IO: response body bytes in, what to do next out.

The caller owns the I/O, as with h11. A blocking loop, a generator and an async loop all drive
it the same way:

    stream = ChatStream(limits, max_tokens, now)          # when the response head arrived
    while True:
        data = read(timeout=stream.timeout(now))
        if data timed out: stream.silence(now); continue   # raises Stalled at the limit
        for step in stream.feed(data, now):                # b"" at the end of the body
            ChatEvent        -> emit it
            PostReasoningEnd -> post reasoning_end for step.completion_id, then emit
                                stream.control_answered(refusal) (raises ThinkingOverrun)
            Completion       -> the answer: return it
            InferError       -> raise it

Invariants:
- `feed` returns the steps of every SSE event in `data`, in order, and ends the list at the
  first `Completion` or error: nothing after the final chunk is looked at, so nothing after it
  can change the answer, and an error comes after the events that preceded it on the wire.
- The liveness rule: the silence limit restarts only when a feed advanced the generation (the
  assembler's `advanced`, see `domain.assembler`); a feed that brings nothing new, or a keep-alive
  comment, moves no deadline, and once the limit is reached it ends in `Stalled`.
- The thinking cap is checked after every chunk that advanced while reasoning; its decision is
  a `PostReasoningEnd` step, so the control call is made right after the chunk that reached the
  cap and before the next chunk is handed out.
- After a `Completion` or an error the stream is over: feeding it again is a `ProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from domain.assembler import Assembler
from domain.completion import Completion
from domain.errors import InferError, ProtocolError
from domain.events import ChatEvent, ThinkingCapped
from domain.sse import SseData, SseDecoder, SseDone, parse_chunk
from domain.thinking import Action, ThinkingCap
from domain.waiting import Liveness


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What bounds one stream. The defaults live in the config: every field is required but
    `tool_calls`, whose default (the config's) keeps limits written before it existed working."""

    liveness_ms: int
    sse_line_bytes: int
    answer_bytes: int
    thinking_cap: int
    thinking_overrun: int
    tool_calls: int = 128


@dataclass(frozen=True, slots=True)
class PostReasoningEnd:
    """The thinking cap was reached: post `reasoning_end` for `completion_id` now, then hand the
    outcome to `ChatStream.control_answered` before going on with the steps."""

    completion_id: str


Step: TypeAlias = ChatEvent | PostReasoningEnd | Completion | InferError


class ChatStream:
    __slots__ = ("_assembler", "_cap", "_decoder", "_liveness", "_over")

    def __init__(self, limits: StreamLimits, max_tokens: int, now: float) -> None:
        self._decoder = SseDecoder(max_line=limits.sse_line_bytes)
        self._assembler = Assembler(
            max_answer_bytes=limits.answer_bytes, max_predicted=max_tokens, max_tool_calls=limits.tool_calls
        )
        self._cap = ThinkingCap(limits.thinking_cap, limits.thinking_overrun)
        self._liveness = Liveness(limits.liveness_ms, now)
        self._over = False

    @property
    def completion_id(self) -> str | None:
        return self._assembler.completion_id

    def timeout(self, now: float) -> float:
        """Seconds the next read may wait: the silence left before `Stalled`."""
        return self._liveness.timeout(now)

    def silence(self, now: float) -> None:
        """A read brought nothing by `now`; raises `Stalled` once the silence reached the limit."""
        if self._liveness.expired(now):
            self._over = True
            raise self._liveness.error(now)

    def feed(self, data: bytes, now: float) -> list[Step]:
        """The steps `data` (received at `now`; `b""` at the end of the body) brings."""
        if self._over:
            raise ProtocolError("the stream is over: no more bytes are taken")
        out: list[Step] = []
        try:
            if not data:
                self._decoder.end()  # raises a decoder failure still pending
                return self._end(out, self._result())
            advanced = self._steps(data, out)
        except InferError as exc:
            return self._end(out, exc)
        if self._over:
            return out
        if advanced:
            self._liveness.on_data(now)
        elif self._liveness.expired(now):
            return self._end(out, self._liveness.error(now))
        return out

    def control_answered(self, refusal: str | None) -> ThinkingCapped:
        """The outcome of the `reasoning_end` call (None: `success: true`): the event to emit,
        or `ThinkingOverrun` raised."""
        if self._cap.control_answer(refusal is None) is Action.OVERRUN:
            self._over = True
            raise self._cap.control_error(refusal or "")
        return ThinkingCapped(tokens=self._assembler.reasoning_tokens)

    # -- inside one feed -------------------------------------------------------------------------

    def _steps(self, data: bytes, out: list[Step]) -> bool:
        """Append the steps of `data` to `out` (ending the stream at its final chunk); returns
        whether any chunk advanced the generation."""
        assembler = self._assembler
        assemble = assembler.feed
        advanced = False
        for event in self._decoder.feed(data):
            if type(event) is SseData:
                out += assemble(parse_chunk(event.data))
                if assembler.finished:
                    self._end(out, self._result())
                    return True
                if assembler.advanced:
                    advanced = True
                    if assembler.in_reasoning and self._thinking(out):
                        return True
            elif type(event) is SseDone:
                self._end(out, self._result())
                return True
        return advanced

    def _thinking(self, out: list[Step]) -> bool:
        """Apply the thinking cap after a reasoning chunk; True if it ended the stream."""
        assembler = self._assembler
        action = self._cap.observe(assembler.reasoning_tokens, assembler.in_reasoning)
        if action is Action.POST_REASONING_END:
            if assembler.completion_id is None:
                self._cap.control_answer(False)
                self._end(out, self._cap.control_error("the stream carried no completion id"))
                return True
            out.append(PostReasoningEnd(assembler.completion_id))
        elif action is Action.OVERRUN:
            self._end(out, self._cap.overrun_error(assembler.reasoning_tokens))
            return True
        return False

    def _result(self) -> Completion:
        return self._assembler.result(thinking_capped=self._cap.capped)

    def _end(self, out: list[Step], last: Completion | InferError) -> list[Step]:
        self._over = True
        out.append(last)
        return out
