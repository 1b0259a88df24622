"""How long a request may wait: before its first data event, and between data events after it.

Both are pure state machines over times in seconds from a `Clock` (`now` values passed in); their
limits are seconds too, and messages name them by their config keys, in milliseconds.

**Before the first data event** (`FirstByteWait`). The caller reads with the timeout from
`timeout(now)`; each time that runs out it asks the slot's state and calls `on_poll(now, state)`,
which always returns one `Waiting` event to emit and, when a limit is reached, the error to raise
after emitting it.

The time since the previous poll (since sending, for the first poll) is charged to the state
seen at this poll, and each state has its own budget over the whole wait (two share one):

- busy (the slot works for another request, or a router runs another model's work before it
  loads ours: `BEHIND`): cumulative busy time reaching `busy_wait_ms` is `WaitTimeout`;
- unavailable (refused, restarting), loading (the model, or waking it) and unresponsive (it
  took the probe's connection and answered nothing in time: paused or stuck) share one budget:
  their cumulative time reaching `load_wait_ms` is `LoadTimeout`. Each is counted apart too, so
  the message says which was seen and for how long; a wait that saw only unavailable polls
  keeps the plain message;
- idle with no byte yet: cumulative idle time reaching `idle_grace_ms` is `Stalled`.

A change of state resets nothing, so a slot that flips between states cannot keep a request
waiting forever: the whole wait ends before `busy_wait_ms + load_wait_ms + idle_grace_ms` plus
one poll. A model load followed by a long queue gets both budgets (load time does not eat into
the busy budget). A glimpse of an idle slot between two other requests costs one poll interval
of the idle grace; an idle slot while our request is queued on it is the anomaly the grace is
for, so that is the intended price. Reaching a budget exactly is a timeout.

**After the first data event** (`Liveness`). Every data event (progress or delta) restarts the
silence timer; keep-alive comments are not data and restart nothing. Silence reaching
`liveness_ms` is `Stalled`. There is no total deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.errors import InferError, LoadTimeout, Stalled, WaitTimeout
from domain.events import ModelWait, Waiting
from ports.slot_probe import SlotState


@dataclass(frozen=True, slots=True)
class WaitDecision:
    """The outcome of one poll: emit `event`, then raise `error` if it is set."""

    event: Waiting
    error: InferError | None = None

    @property
    def slot_busy(self) -> bool:
        return self.event.slot_busy

    @property
    def give_up(self) -> bool:
        return self.error is not None


# Times are float seconds summed over polls; a budget reached to within a nanosecond is reached.
_EPS_S = 1e-9


def _reached(charged_s: float, limit_s: float) -> bool:
    return charged_s >= limit_s - _EPS_S


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return value


@dataclass(slots=True)
class Charged:
    """What one call's waits before sending (a router loading the model for it) charged to
    the budgets, carried into the wait for its response head so that none resets another."""

    behind_s: float = 0.0
    load_s: float = 0.0
    loaded: bool = False  # the call has had the model loaded once

    def carry(self, wait: FirstByteWait) -> None:
        self.behind_s = wait.behind_s
        self.load_s = wait.load_s


class FirstByteWait:
    """The wait for the first data event of one request sent at `sent_at` (seconds), after
    `queued_s` at this client's slot gate; the limits are in seconds and must be positive."""

    __slots__ = (
        "_behind",
        "_busy",
        "_busy_wait_s",
        "_idle",
        "_idle_grace_s",
        "_last",
        "_load_wait_s",
        "_loading",
        "_poll_s",
        "_polls",
        "_queued",
        "_sent_at",
        "_slot",
        "_unavailable",
        "_unresponsive",
        "_unresponsive_seen",
    )

    def __init__(
        self,
        *,
        poll_s: float,
        busy_wait_s: float,
        load_wait_s: float,
        idle_grace_s: float,
        sent_at: float,
        slot: int | None = None,
        queued_s: float = 0.0,
        loading_s: float = 0.0,
        behind_s: float = 0.0,
    ) -> None:
        self._poll_s = _positive("poll_s", poll_s)
        self._busy_wait_s = _positive("busy_wait_s", busy_wait_s)
        self._load_wait_s = _positive("load_wait_s", load_wait_s)
        self._idle_grace_s = _positive("idle_grace_s", idle_grace_s)
        self._sent_at = sent_at
        self._slot = slot
        self._last = sent_at
        # Time queued at this client's gate behind its own requests: the slot was busy then too,
        # and `busy_wait_s` bounds the two together.
        self._queued = max(queued_s, 0.0)
        # Time this call already waited behind another model's work, before sending (busy too).
        self._behind = max(behind_s, 0.0)
        self._busy = self._queued + self._behind
        # Time this call already waited for a router to load the model, before sending: the
        # load budget covers the two together.
        self._loading = max(loading_s, 0.0)
        self._unavailable = 0.0
        self._unresponsive = 0.0
        self._unresponsive_seen = False
        self._idle = 0.0
        self._polls = 0

    @property
    def busy_s(self) -> float:
        """Busy time charged so far."""
        return self._busy

    @property
    def unavailable_s(self) -> float:
        """Unavailable time charged so far (refused, loading, restarting)."""
        return self._unavailable

    @property
    def unresponsive_s(self) -> float:
        """Unresponsive time charged so far; it counts against `load_wait_ms` with
        `unavailable_s`."""
        return self._unresponsive

    @property
    def behind_s(self) -> float:
        """Time charged so far to waiting behind another model's work (part of `busy_s`)."""
        return self._behind

    @property
    def load_s(self) -> float:
        """Time charged so far to the load budget, all its states together."""
        return self._unavailable + self._unresponsive + self._loading

    @property
    def loading_s(self) -> float:
        """Time charged so far to the model loading (or waking), with what was given at the
        start."""
        return self._loading

    @property
    def idle_s(self) -> float:
        return self._idle

    def age_ms(self, now: float) -> float:
        """Milliseconds since the request was sent."""
        return (now - self._sent_at) * 1000

    def timeout(self, now: float) -> float:
        """Seconds until the next poll is due (0 if overdue): the read timeout to use, so bytes
        that are not data (a keep-alive comment, headers) do not shift the poll cadence."""
        return max(0.0, self._last + self._poll_s - now)

    def on_poll(self, now: float, state: SlotState) -> WaitDecision:
        """Charge the time since the last poll to `state` and decide."""
        interval = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._polls += 1
        if state is SlotState.BUSY or state is SlotState.BEHIND:
            self._busy += interval
            if state is SlotState.BUSY:
                event = Waiting(slot_busy=True)
            else:
                self._behind += interval
                event = Waiting(slot_busy=False, model=ModelWait.BEHIND)
            if _reached(self._busy, self._busy_wait_s):
                note = f"; {_ms(self._queued)} of it queued in this client" if self._queued else ""
                if self._behind:
                    note += f"; {_ms(self._behind)} of it behind another model"
                text = self._message("stayed busy", self._busy, self._busy_wait_s, note)
                error = WaitTimeout(text)
                return WaitDecision(event, error)
            return WaitDecision(event)
        if state in _LOAD_STATES:
            if state is SlotState.UNAVAILABLE:
                self._unavailable += interval
            elif state is SlotState.UNRESPONSIVE:
                self._unresponsive += interval
                self._unresponsive_seen = True
            else:
                self._loading += interval
            event = Waiting(
                slot_busy=False,
                unresponsive=state is SlotState.UNRESPONSIVE,
                model=_MODEL.get(state),
            )
            if _reached(self._unavailable + self._unresponsive + self._loading, self._load_wait_s):
                return WaitDecision(event, LoadTimeout(self._load_message()))
            return WaitDecision(event)
        event = Waiting(slot_busy=False)
        if state is SlotState.IDLE:
            self._idle += interval
            if _reached(self._idle, self._idle_grace_s):
                text = self._message("was idle with no answer", self._idle, self._idle_grace_s)
                return WaitDecision(event, Stalled(text))
            return WaitDecision(event)
        raise ValueError(f"unknown slot state {state!r}")

    def _message(self, what: str, charged: float, limit_s: float, note: str = "") -> str:
        slot = "the slot" if self._slot is None else f"slot {self._slot}"
        return f"{slot} {what} for {_ms(charged)} (limit {_ms(limit_s)}{note}); {self._sent()}"

    def _load_message(self) -> str:
        """The load budget's message: as it always was when every such poll was unavailable;
        otherwise the time of each state it covers that was seen."""
        if not self._unresponsive_seen and not self._loading:
            what = "was unavailable (loading or restarting)"
            return self._message(what, self._unavailable, self._load_wait_s)
        slot = "" if self._slot is None else f"slot {self._slot}: "
        parts = [f"the model was loading for {_ms(self._loading)}"] if self._loading else []
        if self._unresponsive_seen:
            parts.append(
                "the server accepted connections but answered nothing for"
                f" {_ms(self._unresponsive)} "
                "(unresponsive: paused or stuck)"
            )
        together = "them" if len(parts) > 1 else "the two"
        parts[-1] += f", unavailable for {_ms(self._unavailable)}"
        limit = f"limit {_ms(self._load_wait_s)} for {together} together"
        return f"{slot}{'; '.join(parts)}; {limit}; {self._sent()}"

    def _sent(self) -> str:
        return f"no data {_ms(self._last - self._sent_at)} after sending, {self._polls} polls"


_LOAD_STATES = frozenset(
    {SlotState.UNAVAILABLE, SlotState.UNRESPONSIVE, SlotState.LOADING, SlotState.ASLEEP}
)
_MODEL = {SlotState.LOADING: ModelWait.LOADING, SlotState.ASLEEP: ModelWait.ASLEEP}


class Liveness:
    """Silence limit after the first data event; `now` is when that event arrived."""

    __slots__ = ("_last", "_limit")

    def __init__(self, liveness_s: float, now: float) -> None:
        self._limit = _positive("liveness_s", liveness_s)
        self._last = now

    def on_data(self, now: float) -> None:
        """A data event (progress or delta) arrived; not for keep-alive comments."""
        if now > self._last:
            self._last = now

    def silence(self, now: float) -> float:
        """Seconds since the last data event."""
        return max(0.0, now - self._last)

    def timeout(self, now: float) -> float:
        """Seconds left until the silence is `Stalled` (0 once expired): the read timeout to use."""
        left = self._last + self._limit - now  # `expired`'s test in line: asked once a read
        return left if left > _EPS_S else 0.0

    def expired(self, now: float) -> bool:
        """Whether the silence has reached the limit (reaching it exactly counts)."""
        return self._last + self._limit - now <= _EPS_S

    def error(self, now: float) -> Stalled:
        return Stalled(f"no data for {_ms(self.silence(now))} (liveness limit {_ms(self._limit)})")


def gate_timeout(slot: int, busy_wait_s: float) -> WaitTimeout:
    """A caller queued at the local slot gate for all of `busy_wait_s`: as long as a slot busy on
    the server may keep it."""
    return WaitTimeout(
        f"slot {slot} busy with this client's own requests for {_ms(busy_wait_s)} "
        f"(limit {_ms(busy_wait_s)}); nothing was sent"
    )
