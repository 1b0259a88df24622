"""Start and stop a real llama-server for device tests and the transcript recorder.

    with start_server("thinking") as server:
        status, body = server.get_json("/props")

Presets (all on 127.0.0.1, a free port, ``-t 2``, ``--no-webui``, the SSE ping interval below):

- ``thinking``: the small model under ``Qwen3.5-4B.jinja``. The generation prompt opens
  ``<think>\\n`` unless ``chat_template_kwargs.enable_thinking`` is false, so reasoning runs away on
  demand (``LONG_STORY_PROMPT`` at temperature 0).
- ``tools``: the small model under ``Qwen-Qwen3-0.6B.jinja``. It does not think and does not call
  tools on its own; ending the messages with an assistant message holding ``TOOL_PREFILL`` makes
  the server complete the call and parse it (``finish_reason`` ``tool_calls``).
- ``router``: the brief's deployment. No ``-m``; ``--models-dir`` is the cache folder holding only
  the small model (router name ``ROUTER_MODEL``), and ``--models-preset`` names two more models
  made from the same file: ``ROUTER_TOOLS`` (the ``tools`` template) and ``ROUTER_THINKING`` (the
  ``thinking`` one). ``--models-max 1``: a request for one model swaps out the other. The
  context is set per model in the preset (a ``-c`` on the router's command line would override
  every preset's); the template too. Loads a model on the first request that names it.

Both model presets run 2 slots over ``-c 8192`` with ``--no-kv-unified``: per-slot ``n_ctx`` 4096;
every server keeps slot checkpoints in a ``slots`` folder of its log folder (``--slot-save-path``).

Invariants: every started process is stopped by ``stop()`` (terminate, wait, kill), by the context
manager's exit even when the body raises, and by an ``atexit`` hook as a last resort. The server
runs in its own session so router children are reaped with it. Health waits have a deadline and
their failure carries the tail of the server's log.

HTTP here uses ``http.client`` over TCP: test helpers play the client of the real upstream.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
ALIAS = "test-model"
SLOTS = 2
CONTEXT = 8192  # over SLOTS slots with --no-kv-unified: 4096 per slot
SLOT_CONTEXT = CONTEXT // SLOTS
# One thread: two meet at a barrier in every layer, and on a shared machine whose cores are busy
# each barrier waits for a thread the kernel has put aside. Measured on this 2-core box, the small
# model generates 84 tokens/s with one thread and 125 with two when the machine is quiet, but 56
# and 26-29 with both cores busy beside it: one thread keeps the server's speed steady.
THREADS = 1
SSE_PING_INTERVAL = 10
HEALTH_DEADLINE_S = 60.0

THINKING_TEMPLATE = "Qwen3.5-4B.jinja"
TOOLS_TEMPLATE = "Qwen-Qwen3-0.6B.jinja"
TOOL_PREFILL = '<tool_call>\n{"name": "get_time", "arguments": {"city": "'
LONG_STORY_PROMPT = "Write a long story about a lighthouse keeper and a storm. Use many sentences."
GET_TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}


def house_rules(session: str) -> str:
    """About 3,000 tokens of house rules for the small model, each line different, opened by
    `session` (so that no earlier request, and no RAM prompt cache, holds them)."""
    pairs = [
        (colour, size) for colour in ("red", "green", "blue", "amber", "violet") for size in ("small", "large", "round")
    ]
    lines = [
        f"Rule {i}: when the user mentions item number {i}, describe it as {c} and {z}."
        for i, (c, z) in enumerate(pairs, 1)
    ]
    return f"Session {session}.\n" + "\n".join(lines * 9)


def _load_setup_script() -> ModuleType:
    path = REPO / "scripts" / "llama_server.py"
    spec = importlib.util.spec_from_file_location("inferpath_llama_server_setup", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


setup = _load_setup_script()
ROUTER_MODEL = str(setup.MODEL_FILE).removesuffix(".gguf")


ROUTER_TOOLS = "tools-model"
ROUTER_THINKING = "thinking-model"
ROUTER_MODELS_MAX = 1
ROUTER_STOP_TIMEOUT_S = 3


def router_presets(found: Any) -> str:
    """The router's `--models-preset` file: every model's context and template, and the two
    models made from the small model's file. A model being unloaded mid-answer is killed after
    `ROUTER_STOP_TIMEOUT_S` (the router's default is 10 s), so that a test of it runs in seconds."""
    model = found.model
    return (
        "version = 1\n\n"
        f"[*]\nc = {CONTEXT}\nchat-template-file = {found.template(TOOLS_TEMPLATE)}\n"
        f"stop-timeout = {ROUTER_STOP_TIMEOUT_S}\n\n"
        f"[{ROUTER_TOOLS}]\nmodel = {model}\n\n"
        f"[{ROUTER_THINKING}]\nmodel = {model}\nchat-template-file = {found.template(THINKING_TEMPLATE)}\n"
    )


@dataclass(frozen=True)
class Preset:
    name: str
    template: str | None
    router: bool = False
    extra: tuple[str, ...] = ()


PRESETS: dict[str, Preset] = {
    "thinking": Preset("thinking", THINKING_TEMPLATE),
    "tools": Preset("tools", TOOLS_TEMPLATE),
    "router": Preset("router", TOOLS_TEMPLATE, router=True),
}


class ServerStartError(RuntimeError):
    """The server exited or stayed unhealthy past the deadline; the message holds its log tail."""


def paths() -> Any:
    """The cached binary, templates and model (``scripts/llama_server.py``'s ``ServerPaths``)."""
    return setup.server_paths()


def missing_artifacts() -> list[str]:
    """What ``make llama-server model`` still has to provide, as readable lines; empty if nothing."""
    found = paths()
    missing = []
    if not found.binary.is_file():
        missing.append(f"llama-server binary not found at {found.binary} (run `make llama-server`)")
    if not found.templates.is_dir():
        missing.append(f"chat templates not found at {found.templates} (run `make llama-server`)")
    if not found.model.is_file():
        missing.append(f"model not found at {found.model} (run `make model`)")
    return missing


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


# Last-resort cleanup: servers still running when the interpreter exits.
_LIVE: dict[int, LlamaServer] = {}


def _stop_all() -> None:
    for server in list(_LIVE.values()):
        server.stop()


atexit.register(_stop_all)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class LlamaServer:
    preset: str
    host: str
    port: int
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    _log_file: Any = field(repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_text(self, tail: int = 8000) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc})"
        return text[-tail:]

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate, wait, then kill; reap router children left in the server's session."""
        process = self.process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        # The server leads its own process group; anything left in it is ours to end.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        _LIVE.pop(process.pid, None)
        if not self._log_file.closed:
            self._log_file.close()

    # --- HTTP (test helpers only) ---

    def connection(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, timeout: float = 60.0) -> Response:
        conn = self.connection(timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            return Response(resp.status, resp.getheaders(), resp.read())
        finally:
            conn.close()

    def get_json(self, path: str) -> tuple[int, Any]:
        resp = self.request("GET", path)
        return resp.status, resp.json()

    def post_json(self, path: str, body: Mapping[str, Any], timeout: float = 120.0) -> tuple[int, Any]:
        resp = self.request("POST", path, body, timeout)
        return resp.status, resp.json()

    @contextlib.contextmanager
    def stream(self, path: str, body: Mapping[str, Any], timeout: float = 120.0) -> Iterator[Iterator[Any]]:
        """POST ``body`` and yield an iterator of the decoded ``data:`` payloads up to ``[DONE]``.

        Comment lines are skipped. Leaving the ``with`` closes the connection, which cancels a
        generation still running.
        """
        conn = self.connection(timeout)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise AssertionError(f"POST {path} answered {resp.status}: {resp.read()[:2000]!r}")
            yield _events(resp)
        finally:
            conn.close()


def _events(resp: http.client.HTTPResponse) -> Iterator[Any]:
    data: list[str] = []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                payload = "\n".join(data)
                data = []
                if payload == "[DONE]":
                    return
                yield json.loads(payload)
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))


def server_argv(
    preset: Preset,
    port: int,
    *,
    slots: int = SLOTS,
    context: int = CONTEXT,
    ping_interval: int = SSE_PING_INTERVAL,
    template: str | None = None,
    extra_args: Sequence[str] = (),
    slot_save_path: Path | None = None,
    presets_file: Path | None = None,
) -> list[str]:
    found = paths()
    argv = [str(found.binary)]
    if preset.router:
        if presets_file is None:
            raise ValueError("a router needs its --models-preset file")
        argv += ["--models-dir", str(found.models_dir), "--models-preset", str(presets_file)]
        argv += ["--models-max", str(ROUTER_MODELS_MAX)]
    else:
        argv += ["-m", str(found.model), "--alias", ALIAS, "-c", str(context)]
    argv += [
        "--host",
        HOST,
        "--port",
        str(port),
        "-np",
        str(slots),
        "--no-kv-unified",
        "-t",
        str(THREADS),
        "--no-webui",
        "--sse-ping-interval",
        str(ping_interval),
    ]
    chosen = template if template is not None else preset.template
    if chosen is not None and not preset.router:  # a router's templates are in its presets
        argv += ["--chat-template-file", str(found.template(chosen))]
    if slot_save_path is not None:
        argv += ["--slot-save-path", str(slot_save_path)]
    return argv + list(preset.extra) + list(extra_args)


def _wait_healthy(server: LlamaServer, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not server.running():
            raise ServerStartError(
                f"llama-server ({server.preset}) exited with {server.process.returncode} before /health "
                f"answered 200\nargv: {' '.join(server.argv)}\nlog {server.log_path}:\n{server.log_text()}"
            )
        try:
            resp = server.request("GET", "/health", timeout=2.0)
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if resp.status == 200:
                return
            last = f"{resp.status} {resp.body[:200]!r}"
        time.sleep(0.05)
    raise ServerStartError(
        f"llama-server ({server.preset}) not healthy after {deadline_s:.0f} s (last: {last})\n"
        f"argv: {' '.join(server.argv)}\nlog {server.log_path}:\n{server.log_text()}"
    )


def launch(
    preset: str,
    *,
    log_dir: Path | None = None,
    health_deadline_s: float = HEALTH_DEADLINE_S,
    slots: int = SLOTS,
    context: int = CONTEXT,
    ping_interval: int = SSE_PING_INTERVAL,
    template: str | None = None,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    slot_save_path: Path | None = None,
) -> LlamaServer:
    """Start a server and wait for /health 200; the caller must ``stop()`` it (prefer start_server).
    Slot checkpoints go to ``slot_save_path`` (default: a ``slots`` folder in the log folder);
    ``port`` starts it on that port (a restart), else on a free one."""
    chosen = PRESETS[preset]
    missing = missing_artifacts()
    if missing:
        raise ServerStartError("cannot start llama-server:\n" + "\n".join(missing))
    directory = log_dir if log_dir is not None else Path(tempfile.mkdtemp(prefix="inferpath-llama-"))
    directory.mkdir(parents=True, exist_ok=True)
    saves = slot_save_path if slot_save_path is not None else directory / "slots"
    saves.mkdir(parents=True, exist_ok=True)
    presets = None
    if chosen.router:
        presets = directory / "presets.ini"
        presets.write_text(router_presets(paths()), encoding="utf-8")
    attempts = 3 if port is None else 1  # a free port can be taken between probing and binding
    for attempt in range(1, attempts + 1):
        chosen_port = free_port() if port is None else port
        argv = server_argv(
            chosen,
            chosen_port,
            slots=slots,
            context=context,
            ping_interval=ping_interval,
            template=template,
            extra_args=extra_args,
            slot_save_path=saves,
            presets_file=presets,
        )
        log_path = directory / f"llama-server-{preset}-{chosen_port}-{attempt}-{time.monotonic_ns()}.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=setup.server_env(paths()),
            start_new_session=True,
        )
        server = LlamaServer(preset, HOST, chosen_port, argv, log_path, process, log_file)
        _LIVE[process.pid] = server
        try:
            _wait_healthy(server, health_deadline_s)
        except ServerStartError:
            server.stop()
            bind_failed = "bind" in server.log_text().lower()
            if attempt < attempts and bind_failed:
                continue
            raise
        except BaseException:
            server.stop()
            raise
        return server
    raise AssertionError("unreachable")


@contextlib.contextmanager
def start_server(preset: str, **overrides: Any) -> Iterator[LlamaServer]:
    """Run a preset for the ``with`` body; overrides are ``launch``'s keyword arguments."""
    own_dir = None
    if overrides.get("log_dir") is None:
        # A log folder made here is removed after a clean run and kept when the body raised.
        own_dir = Path(tempfile.mkdtemp(prefix="inferpath-llama-"))
        overrides["log_dir"] = own_dir
    server = launch(preset, **overrides)
    try:
        yield server
    finally:
        server.stop()
    if own_dir is not None:
        shutil.rmtree(own_dir, ignore_errors=True)
