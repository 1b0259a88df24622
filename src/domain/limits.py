"""The plain values that bound the client, built from the config by the container: the one home
of every limit and of every limit derived from another.

Every field is required: the defaults live in the config (`app.config`) and nowhere else. Times
are seconds: the config's milliseconds are turned into them once, where the config is read
(`app.container`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from domain.waiting import Charged, FirstByteWait

__all__ = ["PROBE_TIMEOUT_S", "STOP_WAIT_S", "ClientLimits", "FetchLimits", "StreamLimits"]

# The /slots probe answers fast or not at all; it never waits longer than this (nor than a poll).
PROBE_TIMEOUT_S: Final = 2.0
# Stopping a generation (`DELETE /v1/stream`) is answered at once (measured: 204 within 9 ms) or
# not at all; a call that ends never waits longer than this for it.
STOP_WAIT_S: Final = 0.25


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What bounds one stream (`domain.chat_stream`); every field is required."""

    liveness_s: float
    sse_line_bytes: int
    answer_bytes: int
    thinking_cap: int
    thinking_overrun: int
    tool_calls: int
    error_body_bytes: int  # what an error the server sends inside the stream keeps of its body


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """The limits of one small request (`domain.bodies`), derived by `ClientLimits`."""

    head_wait_s: float
    body_wait_s: float
    body_bytes: int
    error_body_bytes: int


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """`poll_s` … `idle_grace_s` (the config's `poll_ms` … `idle_grace_ms`) bound the wait for
    the response head (`domain.waiting`) and the wait at the local slot gate (`busy_wait_s`);
    `body_bytes` caps a body that is not a stream and `error_body_bytes` what an `HttpError`
    keeps; `stream` bounds the stream itself."""

    poll_s: float
    busy_wait_s: float
    load_wait_s: float
    idle_grace_s: float
    body_bytes: int
    error_body_bytes: int
    stream: StreamLimits

    @property
    def liveness_s(self) -> float:
        return self.stream.liveness_s

    def info(self) -> FetchLimits:
        """`/props`, `/slots`, `/tokenize`: they may meet a router loading the model."""
        live = self.liveness_s
        return FetchLimits(self.load_wait_s, live, self.body_bytes, self.error_body_bytes)

    def control(self) -> FetchLimits:
        """`reasoning_end`: made while the stream is not read, so it gets the liveness limit."""
        return FetchLimits(self.liveness_s, self.liveness_s, self.body_bytes, self.error_body_bytes)

    def stop_wait_s(self, left_s: float | None = None) -> float:
        """How long a `DELETE /v1/stream` may take in all, its answer's head included (its body
        is not read): `STOP_WAIT_S`, at most the liveness limit, at most what a close has left
        for the stops it makes one after another (`left_s`). None left: no wait, the stop still
        written if the socket takes it at once (a Unix socket connects at once or not at all, and
        the request is a few hundred bytes), its answer not awaited."""
        wait = min(STOP_WAIT_S, self.liveness_s)
        if left_s is not None:
            wait = min(wait, left_s)
        return max(wait, 0.0)

    @property
    def reattach_wait_s(self) -> float:
        """How long a re-attach may wait for its head: the server answers at once when it is up."""
        return min(self.poll_s, self.liveness_s)

    def probe(self) -> FetchLimits:
        """The `/slots` probe: the head and the body each within one short timeout."""
        timeout = min(self.poll_s, PROBE_TIMEOUT_S)
        return FetchLimits(timeout, timeout, self.body_bytes, self.error_body_bytes)

    def first_byte_wait(
        self, sent: float, slot: int, queued_s: float = 0.0, before: Charged | None = None
    ) -> FirstByteWait:
        """The wait for the response head of a chat request sent at `sent`, after `queued_s` at
        the gate and what a wait for the model to load charged `before` it."""
        before = before or Charged()
        return FirstByteWait(
            poll_s=self.poll_s,
            busy_wait_s=self.busy_wait_s,
            load_wait_s=self.load_wait_s,
            idle_grace_s=self.idle_grace_s,
            sent_at=sent,
            slot=slot,
            queued_s=queued_s,
            loading_s=before.load_s,
            behind_s=before.behind_s,
        )
