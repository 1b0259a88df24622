"""Bodies built by the request builder get the recorded answers from the real llama-server.

For every recorded chat case: start the server the case was recorded on (same preset, same
flags), erase the slot, send the exact bytes `build_chat_body` renders from the case's
`inputs.json`, assemble the stream with the project's SSE decoder and assembler, and compare with
the server's own non-stream answer recorded for the same request (temperature 0, so greedy
decoding repeats it). On a machine whose CPU kernels round differently from the recording
machine's (the server is built for the machine it runs on), greedy decoding can take another
path: the comparison is then with the server's non-stream answer to the same bytes, asked live.
A case recorded as an error must give the same error. The `reasoning_end` case is sent without
its control call, so its recorded non-stream answer (runaway thinking) is what it must give.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama  # the support module beside this file (conftest puts it on the path)
import pytest

from domain.assembler import Assembler
from domain.completion import FinishReason
from domain.request import build_chat_body
from domain.sse import SseData, SseDecoder, SseDone, parse_chunk
from transcripts import case_params, index, load_case, request_from

pytestmark = pytest.mark.device

CHAT_PATH = "/v1/chat/completions"
CHAT_CASES = case_params(lambda case: case.inputs is not None)


def _server_args(key: str, save_dir: Path) -> tuple[str, tuple[str, ...]]:
    """The preset and extra flags a case was recorded with (the recorder's server key:
    `<preset>` or `<preset>-b<batch>`), plus what erasing a slot needs."""
    preset, _, batch = key.partition("-b")
    extra: tuple[str, ...] = ("--slot-save-path", str(save_dir), "--cache-ram", "0")
    if batch:
        extra += ("-b", batch, "-ub", batch)
    return preset, extra


class Servers:
    """One server per recorded server key, started on first use and stopped at the end."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._running: dict[str, llama.LlamaServer] = {}

    def get(self, key: str) -> llama.LlamaServer:
        if key not in self._running:
            preset, extra = _server_args(key, self._root / "slot-save")
            (self._root / "slot-save").mkdir(exist_ok=True)
            try:
                self._running[key] = llama.launch(preset, extra_args=extra, log_dir=self._root / "logs")
            except llama.ServerStartError as exc:
                pytest.fail(str(exc), pytrace=False)
        return self._running[key]

    def stop(self) -> None:
        for server in self._running.values():
            server.stop()


@pytest.fixture(scope="module")
def servers(device_artifacts: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    # Not the session servers of conftest: reproducing a recorded answer needs the recording's
    # flags (an erasable slot, no RAM prompt cache, the same batch size), so each case decodes
    # its prompt from scratch exactly as it did when recorded.
    running = Servers(tmp_path_factory.mktemp("builder-device"))
    try:
        yield running
    finally:
        running.stop()


def send(server: llama.LlamaServer, body: bytes) -> tuple[int, bytes]:
    conn = server.connection(timeout=300.0)
    try:
        conn.request("POST", CHAT_PATH, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def assemble(body: bytes) -> Any:
    decoder = SseDecoder()
    assembler = Assembler()
    done = False
    for event in decoder.feed(body):
        if type(event) is SseData:
            assembler.feed(parse_chunk(event.data))
        elif type(event) is SseDone:
            done = True
    decoder.end()
    assert done, "the stream ended without [DONE]"
    return assembler.result()


def live_nonstream(server: llama.LlamaServer, slot: int, body: bytes) -> dict[str, Any]:
    """The server's non-stream answer (its one choice) to `body` with `stream: false`, decoded
    from scratch on an erased slot like the streamed one."""
    request = json.loads(body)
    request["stream"] = False
    erased = server.request("POST", f"/slots/{slot}?action=erase")
    assert erased.status == 200, erased.body[:300]
    status, answer = send(server, json.dumps(request).encode())
    assert status == 200, answer[:500]
    choice: dict[str, Any] = json.loads(answer)["choices"][0]
    return choice


@pytest.mark.parametrize("name", CHAT_CASES)
def test_built_body_gets_the_recorded_answer(name: str, servers: Servers) -> None:
    case = load_case(name)
    assert case.inputs is not None
    req, settings = request_from(case.inputs)
    body = build_chat_body(req, settings, total_slots=llama.SLOTS)
    server = servers.get(index()["cases"][name]["server"])
    erased = server.request("POST", f"/slots/{req.slot}?action=erase")
    assert erased.status == 200, erased.body[:300]

    status, answer = send(server, body)

    assert status == case.status, answer[:500]
    if status != 200:
        assert json.loads(answer)["error"]["type"] == json.loads(case.body)["error"]["type"]
        return
    completion = assemble(answer)
    recorded = case.nonstream
    assert recorded is not None
    choice = live_nonstream(server, req.slot, body)
    if choice["message"] == recorded["choices"][0]["message"]:
        choice = recorded["choices"][0]
    # Otherwise this CPU's kernels (the build is tuned to the machine) round differently from the
    # recording machine's, and greedy decoding took another path from some token on: the server's
    # own non-stream answer to the same bytes on this machine is then what the stream must equal.
    message = choice["message"]
    assert completion.content == (message.get("content") or None)
    assert completion.reasoning_content == (message.get("reasoning_content") or None)
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]
    assert completion.finish_reason is FinishReason(choice["finish_reason"])
