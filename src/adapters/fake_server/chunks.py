"""llama-server's streamed chat chunks, built by hand: what `/v1/chat/completions` sends with
`stream: true` (and `timings_per_token`, `return_progress`), as dicts for `sse_reply` and the
assembler. `sse_event(chunk(...))` gives one as the bytes of an SSE event (`data: ...\\n\\n`).

    chunk(ROLE, n=0, progress=(42, 0, 42))      # the prompt processed: a role-only delta
    chunk({"content": "Paris"}, n=1)            # a delta, with the timings after 1 token
    chunk(finish="stop", n=2)                   # the final chunk

The keys come in llama-server's order (`choices`, `created`, `id`, `model`, `system_fingerprint`,
`object`, `timings`, `prompt_progress`), so a stream written with `sse_event` has the size of a
real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CHUNK_CREATED", "CHUNK_ID", "CHUNK_MODEL", "ROLE", "chunk", "chunk_timings"]

CHUNK_ID = "chatcmpl-e52Fn0Tt6dIR9JxXjCGDYjcBiSKXIs7Y"
CHUNK_CREATED = 1796010845
CHUNK_MODEL = "test-model"
ROLE: Mapping[str, Any] = {"role": "assistant", "content": None}
"""The delta of llama-server's first chunk (and of its prompt-progress chunks): the role alone."""


def chunk_timings(
    n: int,
    *,
    cache_n: int = 0,
    prompt_n: int = 42,
    prompt_ms: float = 124.4,
    token_ms: float = 7.3,
    rates: bool = False,
) -> dict[str, Any]:
    """The `timings` of a chunk after `n` predicted tokens, each taking `token_ms`. `rates` adds
    the per-token and per-second figures llama-server derives from them, as it computes them."""
    out: dict[str, Any] = {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms}
    if rates:
        out["prompt_per_token_ms"] = prompt_ms / prompt_n
        out["prompt_per_second"] = 1e3 / prompt_ms * prompt_n
    out["predicted_n"] = n
    out["predicted_ms"] = token_ms * n
    if rates:
        out["predicted_per_token_ms"] = token_ms
        out["predicted_per_second"] = 1e3 / token_ms
    return out


def chunk(
    delta: Mapping[str, Any] | None = None,
    *,
    finish: str | None = None,
    n: int | None = None,
    progress: tuple[int, int, int] | None = None,
    cid: str = CHUNK_ID,
    cache_n: int = 0,
    prompt_n: int = 42,
    timings: Mapping[str, Any] | None = None,
    progress_ms: int = 3,
    created: int = CHUNK_CREATED,
    model: str = CHUNK_MODEL,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """A llama-server chunk: `n` is `timings.predicted_n` (with `cache_n` and `prompt_n`, see
    `chunk_timings`), or `timings` is given whole; `progress` is (total, cache, processed) of
    `prompt_progress`, which took `progress_ms`; `fingerprint` is the `system_fingerprint`, which
    llama-server sends and most chunks here leave out."""
    out: dict[str, Any] = {
        "choices": [
            {"finish_reason": finish, "index": 0, "delta": delta if delta is not None else {}}
        ],
        "created": created,
        "id": cid,
        "model": model,
    }
    if fingerprint is not None:
        out["system_fingerprint"] = fingerprint
    out["object"] = "chat.completion.chunk"
    if timings is not None:
        out["timings"] = dict(timings)
    elif n is not None:
        out["timings"] = chunk_timings(n, cache_n=cache_n, prompt_n=prompt_n)
    if progress is not None:
        total, cache, processed = progress
        out["prompt_progress"] = {
            "total": total,
            "cache": cache,
            "processed": processed,
            "time_ms": progress_ms,
        }
    return out
