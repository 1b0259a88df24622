"""One chat-completions stream, sans-IO: response body bytes in, what to do next out.

The caller owns the I/O, as with h11. A blocking loop, a generator and an async loop all drive
it the same way:

    stream = ChatStream(limits, max_tokens, now,          # when the response head arrived
                        max_prompt_tokens=prompt_token_bound(len(body), n_ctx))
    while True:
        data = read(timeout=stream.timeout(now))
        if data timed out: stream.silence(now); continue   # raises Stalled at the limit
        for step in stream.feed(data, now):                # b"" at the end of the body
            ChatEvent        -> emit it
            PostReasoningEnd -> post reasoning_end for step.completion_id, then emit
                                stream.control_answered(refusal) (raises ThinkingOverrun)
            Completion       -> the answer: return it
            Stalled          -> the silence limit passed: as the timeout's, re-attach or raise
            InferError       -> raise it

Invariants:
- `feed` returns the steps of every SSE event in `data`, in order, and ends the list at the
  first `Completion` or error: nothing after the final chunk is looked at, so nothing after it
  can change the answer, and an error comes after the events that preceded it on the wire.
- The liveness rule: the silence limit restarts only when a feed advanced the generation (the
  assembler's `advanced`, see `domain.assembler`); a feed that brings nothing new, or a keep-alive
  comment, moves no deadline, and once the limit is reached it ends in `Stalled`: raised by
  `silence` after a read that timed out, the last step of a `feed` whose bytes came too late
  (pings past the limit). Either way the stream is stalled, not over: `resumed` goes on with it.
- The thinking cap is checked after every chunk that carried reasoning, whatever else it carried
  (an answer's text, a tool call, the `finish_reason`): a server cannot slip reasoning past it by
  pairing each piece with something else. Its decision is a `PostReasoningEnd` step, so the
  control call is made right after the chunk that reached the cap and before the next chunk is
  handed out; reached by the final chunk, it is `ThinkingCapped` alone (the answer is whole:
  there is nothing left to end), and past the overrun there, `ThinkingOverrun` as anywhere.
- After a `Completion` or an error the stream is over, and after a stall until it is resumed:
  feeding it then is a `ProtocolError`.
- Progress is bounded by numbers the client knows, never by the server's word alone: the
  `predicted_n` that counts is at most `max_tokens` (what the request asked for), and the
  `prompt_progress` that counts is at most `max_prompt_tokens` (`prompt_token_bound`), so a
  server reporting a prompt of 2**62 tokens cannot keep a call alive for as long as it likes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from domain.assembler import Assembler
from domain.completion import Completion
from domain.errors import HttpError, InferError, ProtocolError, StreamClosedEarly
from domain.events import ChatEvent, ThinkingCapped
from domain.limits import StreamLimits
from domain.llama_api import STREAM_PATH
from domain.sse import SseData, SseDecoder, SseDone, parse_chunk
from domain.thinking import Action, ThinkingCap
from domain.waiting import Liveness

# A re-attach asks for this much of what the stream already read again, and checks that the
# replay begins with it: a replay from the wrong place in the body (or of another body) is told
# even where its bytes would still parse.
REPLAY_OVERLAP_BYTES: Final = 64
# The tokens a chat template may add of its own to the caller's text: role markers, the
# preamble that introduces the tools, a thinking block's tags. Templates add a few hundred.
PROMPT_TEMPLATE_TOKENS: Final = 4096
# Tokens per byte of the request body, at most (see `prompt_token_bound`).
PROMPT_TOKENS_PER_BODY_BYTE: Final = 2


def prompt_token_bound(body_len: int, n_ctx: int | None) -> int:
    """The most tokens the prompt of a request whose body is `body_len` bytes can have, on a slot
    of `n_ctx` tokens (`None` when unknown): what `ChatStream`'s `max_prompt_tokens` should be.

    The bound comes from the body: each token of the rendered prompt stands for at least one byte
    of its text (a tokenizer falls back to single bytes, never to less), apart from the
    template's special tokens. That text is the body's text with its JSON quoting removed, which
    never makes it longer, except where the template renders JSON again (tool schemas, tool-call
    arguments), with at most a space after each separator: less than twice the bytes. Hence
    `PROMPT_TOKENS_PER_BODY_BYTE` tokens a body byte, plus `PROMPT_TEMPLATE_TOKENS` for the
    template's own text. A prompt cannot have more tokens than the slot's context either
    (llama-server refuses a longer one): with `n_ctx` known, the smaller of the two. So a
    context the server claims (`/props`, when the config pins none) can only tighten it.
    """
    if body_len < 0:
        raise ValueError(f"body_len must not be negative, got {body_len}")
    bound = PROMPT_TOKENS_PER_BODY_BYTE * body_len + PROMPT_TEMPLATE_TOKENS
    if n_ctx is not None:
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        return min(n_ctx, bound)
    return bound


@dataclass(frozen=True, slots=True)
class PostReasoningEnd:
    """The thinking cap was reached: post `reasoning_end` for `completion_id` now, then hand the
    outcome to `ChatStream.control_answered` before going on with the steps."""

    completion_id: str


Step: TypeAlias = ChatEvent | PostReasoningEnd | Completion | InferError


class ChatStream:
    """One stream, from the response head on. `max_tokens` is the request's; `max_prompt_tokens`
    bounds the prompt progress that counts as advancing, and the client passes
    `prompt_token_bound(len(body), n_ctx)`. Left `None`, the `total` of the server's first
    progress report is the only bound."""

    __slots__ = (
        "_assembler",
        "_cap",
        "_decoder",
        "_error_bytes",
        "_last",
        "_liveness",
        "_over",
        "_overlap",
        "_reasoning",
        "_stalled",
        "timeout",
    )

    def __init__(
        self,
        limits: StreamLimits,
        max_tokens: int,
        now: float,
        *,
        max_prompt_tokens: int | None = None,
        budget_sent: bool = False,
    ) -> None:
        self._decoder = SseDecoder(max_line=limits.sse_line_bytes)
        self._assembler = Assembler(
            max_answer_bytes=limits.answer_bytes,
            max_predicted=max_tokens,
            max_tool_calls=limits.tool_calls,
            max_prompt_tokens=max_prompt_tokens,
        )
        self._cap = ThinkingCap(
            limits.thinking_cap, limits.thinking_overrun, budget_sent=budget_sent
        )
        self._reasoning = False  # the last chunk that advanced was reasoning
        self._liveness = Liveness(limits.liveness_s, now)
        # `timeout(now)`: seconds the next read may wait, the silence left before `Stalled`. The
        # liveness's own method: it is asked once a read, so nothing stands in front of it.
        self.timeout: Callable[[float], float] = self._liveness.timeout
        self._error_bytes = limits.error_body_bytes  # what an error sent inside the stream keeps
        self._over = False
        self._stalled = False
        self._last = b""  # the last bytes fed, at least the overlap's worth where there are as many
        self._overlap = b""  # what a re-attach's replay must begin with, still to come

    @property
    def completion_id(self) -> str | None:
        return self._assembler.completion_id

    def silence(self, now: float) -> None:
        """A read brought nothing by `now`; raises `Stalled` once the silence reached the limit.
        A stalled stream takes no more bytes unless it is `resumed`."""
        if self._liveness.expired(now):
            self._stalled = True
            raise self._liveness.error(now)

    def replay(self, consumed: int) -> tuple[int, bytes]:
        """Where a re-attach asks for the body from, `consumed` bytes of it read (less what a
        replay under way had still to repeat), and what its replay must begin with: the last
        `REPLAY_OVERLAP_BYTES` fed, across reads (fewer only if fewer came), given to `resumed`."""
        tail = self._last[-REPLAY_OVERLAP_BYTES:]
        return consumed + len(self._overlap) - len(tail), tail

    def resumed(self, now: float, overlap: bytes = b"") -> None:
        """The body starts (the head came: a stream is made while its request is in the air) or
        goes on, from the bytes fed so far, on another connection (a re-attach after a cut or a
        stall): the silence limit restarts at `now`. A re-attach asks for the last bytes fed
        again (`replay`): its replay must begin with them (`overlap`), which are checked and not
        fed twice; a replay that begins elsewhere is a `ProtocolError`. A stream that ended (its
        `Completion` or an error) cannot be resumed."""
        if self._over:
            raise ProtocolError("the stream is over: it cannot be resumed")
        self._stalled = False
        self._overlap = overlap
        self._liveness.on_data(now)

    def feed(self, data: bytes, now: float) -> list[Step]:
        """The steps `data` (received at `now`; `b""` at the end of the body) brings."""
        if self._over or self._stalled or self._overlap:
            if self._over or self._stalled:
                raise ProtocolError("the stream is over: no more bytes are taken")
            rest = self._past_overlap(data)
            if not rest:
                return []
            self._last, data = (self._last + rest)[-REPLAY_OVERLAP_BYTES:], rest
        elif len(data) >= REPLAY_OVERLAP_BYTES:
            self._last = data
        else:  # a short read: the bytes fed before it make up the overlap
            self._last = (self._last + data)[-REPLAY_OVERLAP_BYTES:]
        out: list[Step] = []
        try:
            if not data:
                self._decoder.end()  # raises a decoder failure still pending
                return self._end(out, self._result())
            advanced = self._steps(data, out)
            if not self._decoder.clean and not self._over:
                self._decoder.feed(
                    b""
                )  # a failure held back behind the events handed out: now, not later
        except HttpError as exc:  # one the server sent inside the stream
            return self._end(out, exc.kept(self._error_bytes))
        except InferError as exc:
            return self._end(out, exc)
        if self._over:
            return out
        if advanced:
            self._liveness.on_data(now)
        elif self._liveness.expired(
            now
        ):  # bytes that advance nothing, come past the limit: a stall
            self._stalled = True  # as a silent read's, and resumable as one
            out.append(self._liveness.error(now))
        return out

    def control_answered(self, refusal: str | None) -> ThinkingCapped:
        """The outcome of the `reasoning_end` call (None: `success: true`): the event to emit,
        or `ThinkingOverrun` raised."""
        if self._cap.control_answer(refusal is None) is Action.OVERRUN:
            self._over = True
            raise self._cap.control_error(refusal or "")
        return ThinkingCapped(tokens=self._cap.capped_at)  # the count the call was decided at

    def _past_overlap(self, data: bytes) -> bytes:
        """`data` past the replay's overlap, which it must match as far as it goes."""
        want = self._overlap
        if not data:
            self._over = True
            raise StreamClosedEarly(
                f"GET {STREAM_PATH}: the replay ended inside the bytes it was to begin with"
            )
        n = min(len(want), len(data))
        if data[:n] != want[:n]:
            self._over = True
            raise ProtocolError(
                f"GET {STREAM_PATH}: the replay does not begin where the stream broke"
                f" (its first {len(want)} bytes are not the last ones read)"
            )
        self._overlap = want[n:]
        return data[n:]

    # -- inside one feed -------------------------------------------------------------------------

    def _steps(self, data: bytes, out: list[Step]) -> bool:
        """Append the steps of `data` to `out` (ending the stream at its final chunk); returns
        whether any chunk advanced the generation."""
        assembler = self._assembler
        assemble = assembler.feed_into
        advanced = False
        for event in self._decoder.feed(data):
            if type(event) is SseData:
                mark = assemble(parse_chunk(event.data), out)
                if (
                    self._reasoning
                    and not assembler.in_reasoning
                    and self._cap.ended(assembler.reasoning_tokens)
                ):
                    out.insert(
                        mark, ThinkingCapped(tokens=assembler.reasoning_tokens)
                    )  # the budget ended it
                self._reasoning = assembler.in_reasoning
                if (
                    assembler.reasoned
                    and assembler.reasoning_tokens >= self._cap.acts_from
                    and self._thinking(out)
                ):
                    return True
                if assembler.finished:
                    self._end(out, self._result())
                    return True
                if assembler.advanced:
                    advanced = True
            elif type(event) is SseDone:
                self._end(out, self._result())
                return True
        return advanced

    def _thinking(self, out: list[Step]) -> bool:
        """Apply the thinking cap after a chunk with reasoning; True if it ended the stream."""
        assembler = self._assembler
        action = self._cap.observe(assembler.reasoning_tokens, assembler.reasoned)
        if action is Action.POST_REASONING_END:
            if assembler.finished:  # the answer is whole: the cap is reported, nothing is posted
                out.append(ThinkingCapped(tokens=self._cap.capped_at))
            elif assembler.completion_id is None:
                self._cap.control_answer(False)
                self._end(out, self._cap.control_error("the stream carried no completion id"))
                return True
            else:
                out.append(PostReasoningEnd(assembler.completion_id))
        elif action is Action.OVERRUN:
            self._end(out, self._cap.overrun_error(assembler.reasoning_tokens))
            return True
        return False

    def _result(self) -> Completion:
        return self._assembler.result(thinking_capped=self._cap.capped)

    def _end(self, out: list[Step], last: Completion | InferError) -> list[Step]:
        self._over = True
        if type(last) is Completion:  # whole: a control call decided in the same read is moot
            out[:] = [
                ThinkingCapped(self._cap.capped_at) if type(s) is PostReasoningEnd else s
                for s in out
            ]
        out.append(last)
        return out
