"""End-to-end cost of the inference path against the real llama-server.

Time to first token and total time of one streamed answer through inferproxy + the client, side
by side in one run with the same request body sent straight to the server's TCP port (stdlib
`http.client`, reading the stream to `[DONE]`). Runs alternate so drift hits both paths alike.
"""

from __future__ import annotations

import http.client
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "device"))

import llama  # noqa: E402
from proxy import ProxyProcess  # noqa: E402

from app.client import Client  # noqa: E402
from app.config import parse_config  # noqa: E402
from app.container import Container  # noqa: E402
from domain.events import ChatEvent, Content, Reasoning  # noqa: E402
from domain.messages import ChatRequest, SystemMessage, UserMessage  # noqa: E402

REQUEST = ChatRequest(
    slot=0, messages=[SystemMessage("You are a helpful assistant."), UserMessage("Name three colours of the rainbow.")]
)


def direct(server: llama.LlamaServer, body: bytes) -> tuple[float, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = 0.0
    while True:
        line = resp.readline()
        if not line:
            break
        if not first and (b'"content":"' in line or b'"reasoning_content":"' in line):
            first = time.perf_counter() - started
        if line.startswith(b"data: [DONE]"):
            break
    conn.close()
    return first, time.perf_counter() - started


def through_proxy(client: Client) -> tuple[float, float]:
    first = 0.0
    started = time.perf_counter()

    def on_event(event: ChatEvent) -> None:
        nonlocal first
        if not first and isinstance(event, Content | Reasoning):
            first = time.perf_counter() - started

    client.chat(REQUEST, on_event)
    return first, time.perf_counter() - started


def run(quick: bool = False) -> list[tuple[str, str]]:
    rounds = 3 if quick else 8
    with (
        llama.start_server("tools") as server,
        ProxyProcess(f"{server.host}:{server.port}", extra_args=("--burst", "1000000", "--rate", "1000000")) as proxy,
    ):
        config = parse_config(
            {
                "proxy": {"burst": 1_000_000, "rate": 1_000_000},  # no accept limit to keep on this path
                "socket": proxy.socket_path,
                "model": llama.ALIAS,
                "limits": {"max_tokens": 48},
                "sampling": {"temperature": 0.0, "seed": 42},
                "expect": {"chat_template_sha256": "0" * 64, "n_ctx": llama.SLOT_CONTEXT, "total_slots": llama.SLOTS},
            }
        )
        client = Container(config=config).client()
        body = client.render(REQUEST)
        direct(server, body)  # warm the prompt cache for both paths alike
        ours: list[tuple[float, float]] = []
        theirs: list[tuple[float, float]] = []
        for _ in range(rounds):
            theirs.append(direct(server, body))
            ours.append(through_proxy(client))
    ttft_d = statistics.median(t for t, _ in theirs) * 1000
    ttft_o = statistics.median(t for t, _ in ours) * 1000
    total_d = statistics.median(t for _, t in theirs) * 1000
    total_o = statistics.median(t for _, t in ours) * 1000
    return [
        ("e2e time to first token, direct TCP (median ms)", f"{ttft_d:.1f}"),
        ("e2e time to first token, proxy + client (median ms)", f"{ttft_o:.1f}"),
        ("e2e first-token overhead (ms, ratio)", f"{ttft_o - ttft_d:+.1f} ms, {ttft_o / ttft_d:.3f}x"),
        ("e2e total, direct TCP (median ms)", f"{total_d:.1f}"),
        ("e2e total, proxy + client (median ms)", f"{total_o:.1f}"),
        ("e2e total overhead (ms, ratio)", f"{total_o - total_d:+.1f} ms, {total_o / total_d:.3f}x"),
    ]


if __name__ == "__main__":
    for name, value in run(quick="--quick" in sys.argv):
        print(f"{name:55} {value}")
