"""A TCP relay between inferproxy and the real llama-server that sees every request line, and can
reset the first chat stream after a given number of response bytes.

    with Relay(server.host, server.port, reset_after=5000) as relay:
        ProxyProcess(f"127.0.0.1:{relay.port}") ...
    relay.requests  # ["POST /v1/chat/completions", "GET /v1/stream?conv_id=...&from=4731", ...]

Each accepted connection is forwarded to the server on a connection of its own, both ways, by
two threads; the request line is read off the first bytes the client sends. The first connection
whose request is a chat POST is cut with a TCP reset (SO_LINGER 0) once `reset_after` bytes of
its response have been forwarded, on both sides. With `hold_at_content`, the first chat stream
is held after the event that carries its first piece of content, until `released` is set: what
the client does then (kill its proxy) cuts the stream however fast the server and slow the
client, instead of racing the rest of the answer into the client's socket.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from types import TracebackType

CHAT_LINE = b"POST /v1/chat/completions "
FIRST_CONTENT = re.compile(rb'"content":"[^"]')
HOLD_S = 60.0


def _arm_reset(sock: socket.socket) -> None:
    """Make the coming close a reset, and wake a thread blocked reading it (a close alone would
    neither wake it nor, while that read holds the socket, send anything)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)


class Relay:
    def __init__(self, host: str, port: int, *, reset_after: int | None = None) -> None:
        self.upstream = (host, port)
        self.reset_after = reset_after
        self.hold_at_content = False  # set before the chat: its stream is held (see the module)
        self.held = False
        self.released = threading.Event()
        self.requests: list[str] = []
        self.resets = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._accepter = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Relay:
        self._accepter.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._accepter.join(5)

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, client: socket.socket) -> None:
        try:
            up = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            client.close()
            return
        first = client.recv(65536)
        line = first.split(b"\r\n", 1)[0]
        with self._lock:
            self.requests.append(line.rsplit(b" ", 1)[0].decode("latin-1"))
            cut = self.reset_after if first.startswith(CHAT_LINE) and self.resets == 0 else None
            if cut is not None:
                self.resets = 1
            hold = self.hold_at_content and first.startswith(CHAT_LINE) and not self.held
            if hold:
                self.held = True
        up.sendall(first)
        upward = threading.Thread(target=self._pump, args=(client, up), daemon=True)
        upward.start()
        sent = 0
        seen = b""  # what came back, while a hold looks for the first content
        try:
            while True:
                piece = up.recv(65536)
                if not piece:
                    break
                if cut is not None and sent + len(piece) >= cut:
                    client.sendall(piece[: cut - sent])
                    _arm_reset(client)
                    _arm_reset(up)
                    return  # the finally joins the other direction, then the closes reset
                if hold:
                    seen += piece
                    if (found := FIRST_CONTENT.search(seen)) and (end := seen.find(b"\n\n", found.end())) >= 0:
                        upto = end + 2 - (len(seen) - len(piece))
                        client.sendall(piece[:upto])
                        self.released.wait(HOLD_S)
                        piece, hold = piece[upto:], False
                client.sendall(piece)
                sent += len(piece)
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            upward.join(30)
            for sock in (client, up):
                with contextlib.suppress(OSError):
                    sock.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                piece = src.recv(65536)
                if not piece:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(piece)
        except OSError:
            return
