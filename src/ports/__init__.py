"""What the domain must ask of the world, as small protocols in the domain's words."""

from ports.clock import AsyncClock, Clock
from ports.slot_probe import AsyncSlotProbe, SlotProbe, SlotState
from ports.stream import AsyncByteStream, ByteStream
from ports.transport import (
    TIMED_OUT,
    AsyncExchange,
    AsyncTransport,
    Exchange,
    ResponseHead,
    TimedOut,
    Transport,
)

__all__ = [
    "TIMED_OUT",
    "AsyncByteStream",
    "AsyncClock",
    "AsyncExchange",
    "AsyncSlotProbe",
    "AsyncTransport",
    "ByteStream",
    "Clock",
    "Exchange",
    "ResponseHead",
    "SlotProbe",
    "SlotState",
    "TimedOut",
    "Transport",
]
