"""HTTP/1.1 over a Unix socket: the real `Transport` and `SlotProbe`."""

from adapters.uds_http.slot_probe import UdsSlotProbe
from adapters.uds_http.transport import UdsExchange, UdsTransport

__all__ = ["UdsExchange", "UdsSlotProbe", "UdsTransport"]
