"""The slot's prompt cache, decided before a request is sent: how much of what the slot's previous
request left there the next one will reuse, and why not the rest; and what a slot checkpoint
holds and whether it may be restored.

llama-server reuses the longest common token prefix of what the slot holds and the new prompt.
After a request the slot holds that request's prompt, exactly as the server rendered and
tokenized it (`Rendered`, from `POST /apply-template` and `POST /tokenize` of the very body the
chat sends), then its answer's tokens but the last (sampled, never decoded into the slot): so
`Timings.total - 1` tokens. Measured on the real server, the prediction below is exact when the
prompts diverge inside the previous prompt (7 of 7 runs) and when the next prompt carries the
answer as it was generated:

- the prompts diverge inside the previous prompt: the common prefix is what is reused; the cause
  is the first message that changed (or the tools or the thinking switch), else the template
  renders the turn after the previous messages differently from the generation prompt it sent
  (a template that drops the previous answer's reasoning does exactly that);
- the next prompt holds all of the previous one and then the answer as it was generated (its
  text, reasoning first when there was any): all the slot holds is reused;
- otherwise the previous prompt is reused and the answer is not (the template renders it
  differently, or the caller sent another answer back);
- a slot that holds fewer tokens than that (`/slots` `n_prompt_tokens`: the server restarted, or
  a unified KV cache cleared it when another slot started a task) caps it: `SLOT_EMPTIED`.

Pure: token lists and texts in, values out; the I/O is in `app._async.prompt_cache`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from domain.completion import Completion, Timings
from domain.events import CacheCause, CachePrediction, ChatEvent
from domain.hashing import sha256
from domain.llama_api import Props
from domain.messages import AssistantMessage, ChatMessage, ChatRequest

__all__ = [
    "CacheSettings",
    "Checkpoint",
    "Prepared",
    "Rendered",
    "SlotTurn",
    "checkpoint_filename",
    "common_prefix",
    "covered",
    "covers",
    "held_after_restore",
    "predict",
    "prompt_digest",
    "restore_refusal",
]

_ANSWER_START = 64
COVER_TAIL = 16  # characters of the answer's start looked for after the previous prompt


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """`predict`: render and tokenize each request before sending it, to emit `CachePrediction`
    (two small requests and a `/slots` read per turn). `loss_tokens`: a shortfall up to this many
    tokens is no loss (`cache_loss_tokens`)."""

    predict: bool
    loss_tokens: int


@dataclass(frozen=True, slots=True)
class Rendered:
    """A request's prompt as the server renders it (`text`) and tokenizes it (`tokens`)."""

    text: str
    tokens: Sequence[int]

    @classmethod
    def of(cls, text: str, tokens: Sequence[int]) -> Rendered:
        return cls(text, array("q", tokens))


def _key(message: ChatMessage) -> tuple[object, ...]:
    """A message as a comparable value (a list of tool calls equals the same tuple)."""
    if isinstance(message, AssistantMessage):
        return (
            "assistant",
            message.content or None,
            message.reasoning_content,
            tuple(message.tool_calls),
        )
    return (type(message).__name__, *(getattr(message, name) for name in message.__slots__))


def _sent(req: ChatRequest) -> tuple[ChatMessage, ...]:
    """The messages the request's body carries: a prefill is the last of them, as the server
    renders it (the prediction is the one for the same request with the prefill as a message)."""
    if req.prefill is None:
        return tuple(req.messages)
    return (*req.messages, AssistantMessage(req.prefill))


def _options(req: ChatRequest) -> tuple[object, ...]:
    return (tuple(req.tools), req.thinking, req.tool_choice)


def _answer(content: str | None, calls: Sequence[object]) -> tuple[object, ...]:
    """An answer as the next request may send it back: its content and its calls."""
    return (content or None, tuple(calls))


@dataclass(frozen=True, slots=True)
class SlotTurn:
    """What the client remembers of the last request it completed on a slot."""

    messages: tuple[tuple[object, ...], ...]
    options: tuple[object, ...]
    body: bytes
    rendered: Rendered | None
    timings: Timings  # the prompt and the answer
    answer: tuple[object, ...]  # `_answer` of the completion
    thought: bool  # the answer had reasoning
    answer_start: str  # how the answer's text begins: its reasoning, else its content

    @property
    def total(self) -> int:
        """The tokens the request left in the slot, its last one included."""
        return self.timings.total

    @classmethod
    def of(
        cls, req: ChatRequest, body: bytes, rendered: Rendered | None, completion: Completion
    ) -> SlotTurn:
        reasoning = completion.reasoning_content or ""
        start = (reasoning or completion.content or "").strip()[:_ANSWER_START]
        return cls(
            messages=tuple(_key(m) for m in _sent(req)),
            options=_options(req),
            body=body,
            rendered=rendered,
            timings=completion.timings,
            answer=_answer(completion.content, completion.tool_calls),
            thought=bool(reasoning.strip()),
            answer_start=start,
        )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # a[:low] == b[:low]; slices compare in C, so 30,000 tokens take microseconds
        mid = (low + high + 1) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _in_prompt(previous: SlotTurn, req: ChatRequest) -> tuple[int | None, CacheCause | None]:
    """Where and why prompts diverge inside the previous prompt: at the first message that differs
    (another conversation, an edit), else at the options (the tools, the thinking switch)."""
    now = [_key(m) for m in _sent(req)]
    for index, (before, after) in enumerate(zip(previous.messages, now, strict=False)):
        if before != after:
            return index, CacheCause.MESSAGE_CHANGED
    if len(now) < len(previous.messages):
        return len(now), CacheCause.MESSAGE_CHANGED
    if _options(req) != previous.options:
        return None, CacheCause.OPTIONS_CHANGED
    # Every message kept: the template renders what follows them unlike the generation prompt.
    return len(previous.messages), CacheCause.REASONING_DROPPED if previous.thought else None


def _sent_back(previous: SlotTurn, req: ChatRequest) -> bool:
    """The request's message after the previous ones is the previous answer (its content, calls)."""
    index = len(previous.messages)
    messages = _sent(req)
    sent = messages[index] if index < len(messages) else None
    return (
        isinstance(sent, AssistantMessage)
        and _answer(sent.content, sent.tool_calls) == previous.answer
    )


def _goes_on(previous: SlotTurn, before: Rendered, req: ChatRequest, now: Rendered) -> bool:
    """The new prompt text goes on from the previous one with the answer as it was generated."""
    if not (now.text.startswith(before.text) and _sent_back(previous, req)):
        return False
    return now.text[len(before.text) :].lstrip().startswith(previous.answer_start)


def _in_answer(previous: SlotTurn, req: ChatRequest) -> tuple[int | None, CacheCause | None]:
    """Why a prompt that holds all of the previous one does not go on with its answer."""
    index = len(previous.messages)
    if not _sent_back(previous, req):
        return index, CacheCause.MESSAGE_CHANGED
    return index, CacheCause.REASONING_DROPPED if previous.thought else None


def predict(
    previous: SlotTurn,
    before: Rendered,
    req: ChatRequest,
    now: Rendered,
    held: int | None,
    loss_tokens: int,
    *,
    restored: int = 0,
) -> CachePrediction:
    """The `CachePrediction` for `req` (rendered `now`) after `previous` (rendered `before`), the
    slot holding `held` tokens now (None: unknown)."""
    total = previous.total
    common = common_prefix(before.tokens, now.tokens)
    where: tuple[int | None, CacheCause | None]
    if common < len(before.tokens):
        reused, where = common, _in_prompt(previous, req)
    elif _goes_on(previous, before, req, now):
        reused, where = max(common, total - 1), (None, None)
    else:
        reused, where = common, _in_answer(previous, req)
    reused = min(
        reused, total
    )  # a /tokenize that disagrees with the server's own count claims no more
    if held is not None and held < reused:
        if reused - held > loss_tokens:
            where = (None, CacheCause.SLOT_EMPTIED)
        reused = held
    lost = total - reused > loss_tokens
    message, cause = where if lost else (None, None)
    return CachePrediction(reused, total, lost, message, cause, restored)


# -- checkpoints --------------------------------------------------------------------------------


def checkpoint_filename(slot: int, model: str) -> str:
    """The file (in the server's `--slot-save-path` folder) that holds slot `slot`'s checkpoint
    for `model`: a router's models share the folder, each with its own slot 0 (the model's name,
    which may hold any character, as a short digest: the server takes no folders in a name)."""
    return f"inferpath-{sha256(model.encode('utf-8')).hex()[:16]}-slot-{slot}.bin"


def prompt_digest(tokens: Sequence[int]) -> str:
    """The SHA-256 of a token list, as hex."""
    return sha256(array("q", tokens).tobytes()).hex()


def covered(prompt: Sequence[int]) -> tuple[int, str]:
    """What a checkpoint taken after a request with this prompt covers: its tokens but the last
    `COVER_TAIL` (the generation prompt, which the next turn renders with the answer after it, and
    may tokenize differently where they meet), as a count and a digest."""
    count = max(0, len(prompt) - COVER_TAIL)
    return count, prompt_digest(prompt[:count])


def covers(checkpoint: Checkpoint, tokens: Sequence[int]) -> bool:
    """Does a prompt of `tokens` begin with what `checkpoint` covers?"""
    count = checkpoint.prompt_tokens
    return len(tokens) >= count and prompt_digest(tokens[:count]) == checkpoint.prompt_sha256


def server_model(props: Props) -> str:
    """The model a server runs, as `/props` names it."""
    return props.model_path or props.model_alias or ""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a slot checkpoint holds: `tokens` saved (`bytes` on the server's disk) under this
    template, model and context, covering the first `prompt_tokens` tokens (digest
    `prompt_sha256`) of the rendered prompt of the request the slot ran last (`covered`; 0 tokens:
    the client ran none)."""

    slot: int
    filename: str
    tokens: int
    bytes: int
    template_sha256: str
    model: str
    n_ctx: int
    prompt_tokens: int
    prompt_sha256: str


def restore_refusal(
    checkpoint: Checkpoint, props: Props, tokens: Sequence[int] | None
) -> str | None:
    """None when `checkpoint` may go back into a server that says `props`, before a request whose
    prompt is `tokens` (None: no request); else why not, in words that quote nothing the server
    sent (they are logged). The server checks none of it: a file saved under another template
    restores with 200 and then reuses nothing."""
    if props.chat_template_sha256 != checkpoint.template_sha256:
        return "the server's chat template is not the one it was saved under"
    if server_model(props) != checkpoint.model:
        return "the server runs another model than the one it was saved under"
    if props.n_ctx != checkpoint.n_ctx:
        return f"the server's slot context is {props.n_ctx}, not {checkpoint.n_ctx}"
    if tokens is not None and checkpoint.prompt_tokens == 0:  # saved with no prompt on record
        return "it has no prompt on record (only restore_slot puts it back)"
    if tokens is not None and not covers(checkpoint, tokens):
        return "the request does not begin with the prompt it covers"
    return None


def held_after_restore(before: Rendered, checkpoint: Checkpoint, restored: int) -> int:
    """What a slot holds of the previous request (rendered `before`) after `restored` tokens of
    `checkpoint` went back into it: all, if the checkpoint was taken after that request."""
    last = covered(before.tokens) == (checkpoint.prompt_tokens, checkpoint.prompt_sha256)
    return restored if last else min(restored, checkpoint.prompt_tokens)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What `AsyncPromptCache.before` made of a turn: the events to emit before it is sent (a
    session's move, save and restore, then the prediction), the prediction and the rendering."""

    events: tuple[ChatEvent, ...]
    prediction: CachePrediction | None
    rendered: Rendered | None

    @classmethod
    def of(
        cls,
        events: list[ChatEvent],
        prediction: CachePrediction | None,
        rendered: Rendered | None,
    ) -> Prepared:
        said = (*events, prediction) if prediction is not None else tuple(events)
        return cls(said, prediction, rendered)
