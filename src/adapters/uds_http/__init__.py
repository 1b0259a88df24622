"""HTTP/1.1 over a Unix socket: the real `Transport` and `SlotProbe`."""

from adapters.uds_http.exchange import HttpExchange
from adapters.uds_http.slot_probe import HttpSlotProbe
from adapters.uds_http.transport import SocketStream, UdsExchange, UdsTransport

__all__ = ["HttpExchange", "HttpSlotProbe", "SocketStream", "UdsExchange", "UdsTransport"]
