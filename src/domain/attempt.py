"""The life of one chat call as a sans-IO state machine: every phase, every move between them in
one table, and every decision a move needs (re-attach, re-send, give up).

The driver (`app._async.call` and the client's `_steps`) does the I/O and tells the machine what
happened (`happened(Input.X)`, or one of the deciding methods); the machine moves its `phase` by
`TRANSITIONS` and says what to do next. A move the table does not hold is the driver's bug
(`AttemptStateError`), never a server's: a server's fault arrives as an `InferError`.

    QUEUED ─SLOT_FREE─> PREPARING ─PREPARED─> SENDING ─SENT─> AWAITING_HEAD ─HEAD─> STREAMING ─COMPLETED─> DONE
      ^ │                  │                     ^               (POLLED)              │
      │ └─MODEL_NOT_LOADED─┴─> LOADING           │ REFUSED (re-sent at once)           │ CUT
      │                          │ LOADED        │                                     v
      ├──────────────────────────┘          REATTACHING <──────REATTACH──────── BACKING_OFF
      │                                          │ PICKED_UP -> STREAMING; CUT -> BACKING_OFF
      └───────────────────RESEND (back through the gate)─────────────────────── BACKING_OFF

From every phase but DONE and FAILED: RETRY -> BACKING_OFF (a failure worth a re-send), and
GAVE_UP -> FAILED (an error raised, a cancel).

The decisions spend one retry schedule (`domain.retry.Attempts`: `retry.attempts`, `delays_ms`,
`total_ms`) for re-attaches and re-sends alike:
- `cut(error, now, offset)`: the stream broke after its head (a cut, a stall, a re-attach that
  failed): a re-attach from body byte `offset`, the slot held, or the error raised. `chat()`
  re-attaches too: a cut it can mend is no failure of the call.
- `refused()`: the server cannot give the rest of the stream (404, 400): the request re-sent at
  once within the running attempt when the call may re-send, else the cut it would have mended
  raised.
- `failed(error, now)`: anything else the attempt could not mend (a break before the head, an
  HTTP 503, a `LoadTimeout`): a re-send back through the gate after the policy's wait, when the
  call may re-send (`chat_with_retry`) and the policy allows, else the error raised.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, NoReturn

from domain.errors import ConnectError, InferError, StreamClosedEarly
from domain.events import Retrying
from domain.retry import Attempts

__all__ = ["TRANSITIONS", "AttemptMachine", "AttemptStateError", "Input", "Next", "Phase"]


class Phase(enum.Enum):
    QUEUED = "queued"  # at this client's slot gate
    PREPARING = "preparing"  # the slot held: the cache prediction, a checkpoint restored
    LOADING = "loading"  # a router loads the model the call needs before it is sent
    SENDING = "sending"  # the request written, under a new conversation id
    AWAITING_HEAD = "awaiting_head"  # the response head awaited, the slot probed each poll
    STREAMING = "streaming"  # the stream read and fed to the `ChatStream`
    BACKING_OFF = "backing_off"  # the retry policy's wait before a re-attach or a re-send
    REATTACHING = "reattaching"  # the rest of the stream asked for, from the bytes consumed
    DONE = "done"  # the `Completion` returned
    FAILED = "failed"  # an error raised


class Input(enum.Enum):
    """What the driver saw happen (or decided, for RETRY, REATTACH and RESEND)."""

    SLOT_FREE = "slot_free"
    MOVED_UP = "moved_up"
    PREPARED = "prepared"
    MODEL_NOT_LOADED = "model_not_loaded"
    LOADED = "loaded"
    SENT = "sent"
    POLLED = "polled"
    HEAD = "head"
    CUT = "cut"
    REATTACH = "reattach"
    PICKED_UP = "picked_up"
    REFUSED = "refused"
    RETRY = "retry"
    RESEND = "resend"
    COMPLETED = "completed"
    GAVE_UP = "gave_up"


P, In = Phase, Input
_LIVE = tuple(phase for phase in Phase if phase not in (P.DONE, P.FAILED))
# Every legal move: (phase, input) -> phase.
TRANSITIONS: Final[dict[tuple[Phase, Input], Phase]] = {
    (P.QUEUED, In.MOVED_UP): P.QUEUED,
    (P.QUEUED, In.SLOT_FREE): P.PREPARING,
    (P.QUEUED, In.MODEL_NOT_LOADED): P.LOADING,  # the slot count, read before the gate
    (P.PREPARING, In.PREPARED): P.SENDING,
    (P.PREPARING, In.MODEL_NOT_LOADED): P.LOADING,  # the prediction's requests
    (P.LOADING, In.LOADED): P.QUEUED,  # back through the gate, the model loaded
    (P.SENDING, In.SENT): P.AWAITING_HEAD,
    (P.AWAITING_HEAD, In.POLLED): P.AWAITING_HEAD,
    (P.AWAITING_HEAD, In.HEAD): P.STREAMING,
    (P.STREAMING, In.CUT): P.BACKING_OFF,
    (P.STREAMING, In.COMPLETED): P.DONE,
    (P.BACKING_OFF, In.REATTACH): P.REATTACHING,
    (P.BACKING_OFF, In.RESEND): P.QUEUED,
    (P.REATTACHING, In.PICKED_UP): P.STREAMING,
    (P.REATTACHING, In.CUT): P.BACKING_OFF,
    (P.REATTACHING, In.REFUSED): P.SENDING,  # the slot still held
    **{(phase, In.RETRY): P.BACKING_OFF for phase in _LIVE},
    **{(phase, In.GAVE_UP): P.FAILED for phase in _LIVE},
}


class AttemptStateError(RuntimeError):
    """The driver reported an input the phase cannot take: a bug in the driver, not the server."""


@dataclass(frozen=True, slots=True)
class Next:
    """A retry decided: emit `event` (logged by the driver), wait `after_s`, then tell the
    machine `then` (REATTACH or RESEND) and do it."""

    event: Retrying
    then: Input
    error: InferError  # what the retry follows (a failed re-attach's connect error, as the cut)
    after_s: float


class AttemptMachine:
    """One call's attempts: its phase, the retry schedule it spends, whether it may send the
    request again (`resend`: `chat_with_retry`; `chat` only re-attaches), and `cut`, the break a
    re-attach under way would mend."""

    __slots__ = ("attempts", "cut", "phase", "resend")

    def __init__(self, attempts: Attempts, *, resend: bool) -> None:
        self.attempts = attempts
        self.resend = resend
        self.phase = Phase.QUEUED
        self.cut: InferError | None = None

    def __repr__(self) -> str:
        return f"AttemptMachine({self.phase.value}, attempt {self.attempts.number})"

    def happened(self, what: Input) -> Phase:
        """Move by the table; `AttemptStateError` if the phase cannot take `what`."""
        target = TRANSITIONS.get((self.phase, what))
        if target is None:
            raise AttemptStateError(f"{what.value} cannot happen while {self.phase.value}")
        if what is Input.PICKED_UP:
            self.cut = None  # mended
        self.phase = target
        return target

    def cut_at(self, error: InferError, now: float, offset: int) -> Next:
        """The stream broke after its head at `now` (or a re-attach failed): a re-attach from body
        byte `offset`, or the error raised when the policy allows no more. A re-attach that could
        not connect is still the cut stream (`StreamClosedEarly`, retried alike)."""
        if isinstance(error, ConnectError):
            error = StreamClosedEarly(f"the stream could not be picked up again: {error}")
        if self.cut is None:  # the break a re-attach mends: the failed re-attaches after it are not it
            self.cut = error
        decision = self.attempts.next(error, now)
        if not decision.retry:
            self.give_up(error)
        self.happened(Input.CUT)
        event = _retrying(decision.attempt, decision.after_s, error, resend=False)
        return Next(event, Input.REATTACH, error, decision.after_s)

    def refused(self) -> Retrying:
        """A re-attach the server cannot serve: the `Retrying` of a re-send at once within the
        running attempt, or the break it would have mended raised. `cut` is left set, for
        `refused_cut` to name it first."""
        cut = self.refused_cut()
        if not self.resend:
            self.give_up(cut)
        self.happened(Input.REFUSED)
        self.cut = None
        return _retrying(self.attempts.number, 0.0, cut, resend=True)

    def refused_cut(self) -> InferError:
        """The break a refused re-attach would have mended (not a re-attach that failed after it)."""
        if self.cut is None:
            raise AttemptStateError(f"no cut to mend while {self.phase.value}")
        return self.cut

    def name_cut(self, named: InferError) -> None:
        """The cut, named for what the server says it was (`domain.router_api.unloaded_cut`)."""
        self.cut = named

    def failed(self, error: InferError, now: float) -> Next:
        """An error the attempt could not mend at `now`: a re-send after the policy's wait, back
        through the gate, or `error` raised (also when the call may not re-send)."""
        if not self.resend:
            self.give_up(error)
        decision = self.attempts.next(error, now)
        if not decision.retry:
            self.give_up(error)
        self.happened(Input.RETRY)
        self.cut = None
        event = _retrying(decision.attempt, decision.after_s, error, resend=True)
        return Next(event, Input.RESEND, error, decision.after_s)

    def give_up(self, error: BaseException) -> NoReturn:
        """FAILED, and `error` raised."""
        if self.phase in _LIVE:
            self.happened(Input.GAVE_UP)
        raise error


def _retrying(attempt: int, after_s: float, error: InferError, *, resend: bool) -> Retrying:
    """The event, its wait in the milliseconds it speaks (`after_s` is a whole number of them)."""
    after_ms = round(after_s * 1000)
    return Retrying(attempt=attempt, after_ms=after_ms, error=f"{type(error).__name__}: {error}", resend=resend)
