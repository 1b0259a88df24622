"""The plain values that bound the client, built from the config by the container.

Every field is required: the defaults live in the config (`app.config`) and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.chat_stream import StreamLimits


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """`poll_ms` … `idle_grace_ms` bound the wait for the response head (`domain.waiting`);
    `body_bytes` caps a body that is not a stream and `error_body_bytes` what an `HttpError`
    keeps; `stream` bounds the stream itself."""

    poll_ms: int
    busy_wait_ms: int
    load_wait_ms: int
    idle_grace_ms: int
    body_bytes: int
    error_body_bytes: int
    stream: StreamLimits
