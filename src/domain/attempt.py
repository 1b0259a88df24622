"""The life of one chat call as a sans-IO state machine: every phase, every move between them in
one table, every decision a move needs (re-attach, re-send, load, give up), and every budget the
call spends, held and charged here.

The driver (`app._async.call`) runs one loop: it does the `action` of the phase (`ACTIONS`),
tells the machine what happened (`happened(Input.X)`, or one of the deciding methods) and goes
round again. A move the table does not hold is the driver's bug (`AttemptStateError`), never a
server's: a server's fault arrives as an `InferError`.

    QUEUED ─SLOT_FREE─> PREPARING ─PREPARED─> SENDING ─SENT─> AWAITING_HEAD ─HEAD─> STREAMING
      ^ │                  │                     ^               (POLLED)            │ │
      │ └─MODEL_NOT_LOADED─┴─> LOADING           │ REFUSED (re-sent at once)         │ COMPLETED
      │                          │ LOADED        │                                CUT│ └─> DONE
      ├──────────────────────────┘          REATTACHING <──────REATTACH──── BACKING_OFF
      │                                          │ PICKED_UP -> STREAMING; CUT -> BACKING_OFF
      └───────────────────RESEND (back through the gate)─────────────────── BACKING_OFF

From every phase but DONE and FAILED: RETRY -> BACKING_OFF (a failure worth a re-send), and
GAVE_UP -> FAILED (an error raised, a cancel).

The budgets: the time queued at the gate is charged to `busy_wait_ms`; a router's load
(`load_wait`) to `load_wait_ms` and, behind another model, `busy_wait_ms`; the preparation (the
cache prediction, a checkpoint restored within what `load_wait_ms` has left) to whatever the
first poll of the head wait sees, as the wait runs from the slot taken (`sent`). None resets
another. The head wait is the `FirstByteWait` it builds, `liveness_ms` the `ChatStream`'s. One
retry schedule (`domain.retry.Attempts`) is spent by re-attaches and re-sends alike:
- `cut_at`: the stream broke after its head: a re-attach from the bytes consumed, or raised.
- `refused`: the server cannot give the rest of the stream: a re-send at once, or the cut raised.
- `failed`: anything else: a re-send after the policy's wait, when the call may re-send
  (`chat_with_retry`, or a proxy's first refusal); a router without the model: LOADING (once).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, NoReturn

from domain.errors import ConnectError, InferError, ModelNotLoaded, ProxyRefused, StreamClosedEarly
from domain.events import Retrying
from domain.limits import ClientLimits
from domain.retry import Attempts
from domain.waiting import Charged, FirstByteWait, WaitDecision
from ports.slot_probe import SlotState

__all__ = [
    "ACTIONS",
    "TRANSITIONS",
    "Action",
    "AttemptMachine",
    "AttemptStateError",
    "Input",
    "Next",
    "Phase",
]


class _Member(enum.Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own is a Python call per lookup


class Phase(_Member):
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


class Input(_Member):
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


class Action(_Member):
    """What the driver does in a phase, until the machine moves on."""

    ENTER = "enter"  # render the body (once), take the slot at the gate: Queued while queued
    PREPARE = "prepare"  # the cache prediction, a checkpoint restored: PREPARED
    LOAD = "load"  # have a router load the model, Waiting each poll: `loaded`
    SEND = "send"  # open a connection, write the request under a new id: `sent`
    POLL = "poll"  # read the head until the next poll is due; none: probe the slot, `polled`
    READ = "read"  # read the stream, feed it, emit its steps: COMPLETED, or `cut_at`
    SLEEP = "sleep"  # the retry's wait, emitted as `Retrying` already: `slept`
    REATTACH = "reattach"  # ask for the rest of the stream: PICKED_UP, `cut_at`, or `refused`
    DONE = "done"  # the Completion emitted: stop the loop
    STOP = "stop"  # the error raised already (never seen by a driver: `give_up` raises)


ACTIONS: Final[dict[Phase, Action]] = {
    P.QUEUED: Action.ENTER,
    P.PREPARING: Action.PREPARE,
    P.LOADING: Action.LOAD,
    P.SENDING: Action.SEND,
    P.AWAITING_HEAD: Action.POLL,
    P.STREAMING: Action.READ,
    P.BACKING_OFF: Action.SLEEP,
    P.REATTACHING: Action.REATTACH,
    P.DONE: Action.DONE,
    P.FAILED: Action.STOP,
}


class AttemptStateError(RuntimeError):
    """The driver reported an input the phase cannot take: a bug in the driver, not the server."""


@dataclass(frozen=True, slots=True)
class Next:
    """A retry decided: emit `event`, wait `after_s`, then tell the machine `then` and do it."""

    event: Retrying
    then: Input
    error: InferError  # what the retry follows (a failed re-attach's connect error, as the cut)
    after_s: float


class AttemptMachine:
    """One call's attempts on `slot`: its phase, the retry schedule it spends, whether it may send
    the request again (`resend`: `chat_with_retry`; `chat` only re-attaches), `cut` (the break a
    re-attach under way would mend), `pending` (the retry decided, slept on in BACKING_OFF) and
    the budgets: `charged` (what a router's load cost), `wait` (the running head or load wait)."""

    __slots__ = (
        "_queued_s",
        "_since",
        "attempts",
        "charged",
        "cut",
        "limits",
        "pending",
        "phase",
        "resend",
        "slot",
        "wait",
    )

    def __init__(self, tries: Attempts, limits: ClientLimits, slot: int, *, resend: bool) -> None:
        self.attempts = tries
        self.limits = limits
        self.slot = slot
        self.resend = resend
        self.phase = Phase.QUEUED
        self.cut: InferError | None = None
        self.pending: Next | None = None
        self.charged = Charged()
        self.wait: FirstByteWait | None = None
        self._queued_s = 0.0
        self._since: float | None = None  # when the slot was taken, until the request is sent

    def __repr__(self) -> str:
        return f"AttemptMachine({self.phase.value}, attempt {self.attempts.number})"

    @property
    def action(self) -> Action:
        return ACTIONS[self.phase]

    # -- the budgets --------------------------------------------------------------------------

    def slot_free(self, queued_s: float, now: float) -> None:
        """The slot taken at `now`, after `queued_s` at the gate (charged to `busy_wait_ms`)."""
        self.happened(Input.SLOT_FREE)
        self._queued_s, self._since = queued_s, now

    def preparing_left_s(self, now: float) -> float:
        """PREPARING: how long a restore may wait at `now` for its answer: what `load_wait_ms`
        has left after a load and the time since the slot was taken (charged to the head wait)."""
        if self.phase is not Phase.PREPARING or self._since is None:
            raise AttemptStateError(f"nothing prepared while {self.phase.value}")
        spent = self.charged.load_s + (now - self._since)
        return max(self.limits.load_wait_s - spent, 0.0)

    def sent(self, now: float) -> FirstByteWait:
        """The request sent at `now`: the wait for its head. The first request after the gate
        carries what the gate and a load charged, and runs from the slot taken, so that the
        preparation's time is charged too; a re-send within the attempt (a refused re-attach)
        finds the slot held and starts afresh."""
        self.happened(Input.SENT)
        since, self._since = self._since, None
        if since is None:
            self.wait = self.limits.first_byte_wait(now, self.slot)
        else:
            since = min(since, now)
            self.wait = self.limits.first_byte_wait(since, self.slot, self._queued_s, self.charged)
        return self.wait

    def polled(self, now: float, state: SlotState) -> WaitDecision:
        """No head by the poll: the time since the last one charged to the slot's `state`."""
        if self.phase is not Phase.LOADING:
            self.happened(Input.POLLED)  # (outside AWAITING_HEAD: the driver's bug)
        decision = self._waiting().on_poll(now, state)
        if self.phase is Phase.LOADING:
            self.charged.carry(self._waiting())
        return decision

    def load_wait(self, now: float) -> FirstByteWait:
        """LOADING: the wait for a router's load asked at `now`, on the call's budgets."""
        if self.phase is not Phase.LOADING:
            raise AttemptStateError(f"no load to wait for while {self.phase.value}")
        self.wait = self.limits.first_byte_wait(now, self.slot, before=self.charged)
        return self.wait

    def loaded(self) -> None:
        """The model loaded: what its wait charged kept for the chat's wait; back to the gate."""
        self.charged.carry(self._waiting())
        self.charged.loaded = True
        self.happened(Input.LOADED)

    def _waiting(self) -> FirstByteWait:
        if self.wait is None:
            raise AttemptStateError(f"no wait running while {self.phase.value}")
        return self.wait

    # -- the moves and the retry decisions ----------------------------------------------------

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
        if self.cut is None:  # the break a re-attach mends, not the re-attaches failed after it
            self.cut = error
        decision = self.attempts.next(error, now)
        if not decision.retry:
            self.give_up(error)
        self.happened(Input.CUT)
        event = _retrying(decision.attempt, decision.after_s, error, resend=False)
        self.pending = Next(event, Input.REATTACH, error, decision.after_s)
        return self.pending

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
        """The break a refused re-attach would have mended (not a re-attach failed after it)."""
        if self.cut is None:
            raise AttemptStateError(f"no cut to mend while {self.phase.value}")
        return self.cut

    def name_cut(self, named: InferError) -> None:
        """The cut, named for what the server says it was (`domain.router_api.unloaded_cut`)."""
        self.cut = named

    def failed(self, error: InferError, now: float) -> Next | None:
        """An error the attempt could not mend at `now`: a re-send after the policy's wait, back
        through the gate, or `error` raised (also when the call may not re-send). A router that
        has not loaded the model, before sending: None, LOADING (raised if it was loaded once:
        evicted again at once, not waited for twice)."""
        if isinstance(error, ModelNotLoaded) and self.phase in (Phase.QUEUED, Phase.PREPARING):
            if self.charged.loaded:
                self.give_up(error)
            self.happened(Input.MODEL_NOT_LOADED)
            return None
        # A proxy's refusal reached no server: even a call that sends once tries again, once.
        refusal = isinstance(error, ProxyRefused) and not self.attempts.asked
        if not (self.resend or refusal):
            self.give_up(error)
        decision = self.attempts.next(error, now)
        if not decision.retry:
            self.give_up(error)
        self.happened(Input.RETRY)
        self.cut = None
        event = _retrying(decision.attempt, decision.after_s, error, resend=True)
        self.pending = Next(event, Input.RESEND, error, decision.after_s)
        return self.pending

    def slept(self) -> Phase:
        """The retry's wait over: re-attach or re-send, as decided."""
        if self.pending is None or self.phase is not Phase.BACKING_OFF:
            raise AttemptStateError(f"no retry to make while {self.phase.value}")
        then, self.pending = self.pending.then, None
        return self.happened(then)

    def give_up(self, error: BaseException) -> NoReturn:
        """FAILED, and `error` raised."""
        if self.phase in _LIVE:
            self.happened(Input.GAVE_UP)
        raise error


def _retrying(attempt: int, after_s: float, error: InferError, *, resend: bool) -> Retrying:
    """The event, its wait in the milliseconds it speaks (`after_s` is a whole number of them)."""
    text = f"{type(error).__name__}: {error}"
    return Retrying(attempt=attempt, after_ms=round(after_s * 1000), error=text, resend=resend)
