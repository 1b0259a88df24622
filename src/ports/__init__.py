"""What the domain must ask of the world, as small protocols in the domain's words."""

from ports.clock import Clock
from ports.slot_probe import SlotProbe, SlotState
from ports.stream import ByteStream
from ports.transport import TIMED_OUT, Exchange, ResponseHead, TimedOut, Transport

__all__ = [
    "TIMED_OUT",
    "ByteStream",
    "Clock",
    "Exchange",
    "ResponseHead",
    "SlotProbe",
    "SlotState",
    "TimedOut",
    "Transport",
]
