"""HTTP/1.1 and SSE over a Unix socket: the real `Transport` and `SlotProbe`."""
