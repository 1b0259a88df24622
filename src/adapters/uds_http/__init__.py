"""HTTP/1.1 and SSE over a Unix socket: the real `Transport` and `SlotProbe`."""

from adapters.uds_http.slot_probe import UdsSlotProbe
from adapters.uds_http.sse import SseComment, SseData, SseDecoder, SseDone, SseEvent, parse_chunk
from adapters.uds_http.transport import UdsExchange, UdsTransport

__all__ = [
    "SseComment",
    "SseData",
    "SseDecoder",
    "SseDone",
    "SseEvent",
    "UdsExchange",
    "UdsSlotProbe",
    "UdsTransport",
    "parse_chunk",
]
