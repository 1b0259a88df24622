r"""Serve a recorded llama-server response on a Unix socket, for trying a client against it.

    python -m adapters.fake_server --socket /tmp/llama.sock \
        --transcript tests/fixtures/transcripts/plain_answer

`--transcript` is a raw HTTP response (`response.raw`) or a transcript folder holding one. It is
served verbatim for every `POST` to `--path`, paced by `--delay-ms` between the pieces llama-server
wrote (or `--piece-bytes` long pieces). `GET /slots` answers idle slots, `GET /health` ok.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from adapters.fake_server.script import json_reply, raw_reply, slots_reply
from adapters.fake_server.server import FakeServer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m adapters.fake_server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--socket", required=True, help="path of the Unix socket to listen on")
    parser.add_argument("--transcript", required=True, help="response.raw, or a transcript folder")
    parser.add_argument(
        "--path", default="/v1/chat/completions", help="route to serve it on (POST)"
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="delay before each piece")
    parser.add_argument(
        "--piece-bytes", type=int, default=None, help="fixed piece size instead of chunks"
    )
    parser.add_argument("--slots", type=int, default=2, help="idle slots that GET /slots reports")
    args = parser.parse_args(argv)

    source = Path(args.transcript)
    if source.is_dir():
        source = source / "response.raw"
    try:
        raw = source.read_bytes()
    except OSError as exc:
        print(f"cannot read {source}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.piece_bytes is not None and args.piece_bytes < 1:
        parser.error("--piece-bytes must be positive")
    if not 0.0 <= args.delay_ms < float("inf"):
        parser.error(f"--delay-ms must be a finite number of 0 or more, got {args.delay_ms:g}")
    if not 1 <= args.slots <= 4096:
        parser.error(f"--slots must be from 1 to 4096, got {args.slots}")

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server = FakeServer(socket_path=args.socket)
    server.route(
        "POST",
        args.path,
        raw_reply(raw, delay_s=args.delay_ms / 1000, piece_bytes=args.piece_bytes),
    )
    server.route("GET", "/slots", slots_reply([False] * args.slots))
    server.route("GET", "/health", json_reply({"status": "ok"}))
    try:
        server.start()
    except OSError as exc:
        print(f"cannot listen on {args.socket}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        print(f"serving {source} ({len(raw)} bytes) on {server.socket_path}", flush=True)
        stop.wait()
    finally:
        server.stop()
    print(f"stopped after {len(server.requests)} requests", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
