"""Device tier: the real llama-server built by `make llama-server`, serving the small model.

Each preset starts once per session (the tier must stay fast on a second `make test`) and stops at
the session's end, also when tests fail. ``INFERPATH_SKIP_DEVICE=1`` is the only opt-out: every
device test is then skipped and says why. Without it, a missing binary or model is a failure that
names the make target to run, never a silent skip.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama

SKIP_VARIABLE = "INFERPATH_SKIP_DEVICE"


def device_skipped() -> bool:
    return os.environ.get(SKIP_VARIABLE, "0") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not device_skipped():
        return
    reason = f"{SKIP_VARIABLE}=1: the device tier (real llama-server) was opted out"
    for item in items:
        if item.get_closest_marker("device") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def device_artifacts() -> None:
    missing = llama.missing_artifacts()
    if missing:
        pytest.fail(
            "the device tier needs the real llama-server and the model:\n  "
            + "\n  ".join(missing)
            + f"\n(or set {SKIP_VARIABLE}=1 to skip the device tier)",
            pytrace=False,
        )


def _serve(preset: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[llama.LlamaServer]:
    log_dir = tmp_path_factory.mktemp(f"llama-{preset}")
    try:
        server = llama.launch(preset, log_dir=log_dir)
    except llama.ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tools_server(device_artifacts: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[llama.LlamaServer]:
    """The Qwen3 template: no thinking; completes a tool call opened by ``llama.TOOL_PREFILL``."""
    yield from _serve("tools", tmp_path_factory)


@pytest.fixture(scope="session")
def thinking_server(device_artifacts: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[llama.LlamaServer]:
    """The Qwen3.5 template: the generation prompt opens ``<think>``; runaway reasoning on demand."""
    yield from _serve("thinking", tmp_path_factory)


@pytest.fixture(scope="session")
def router_server(device_artifacts: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[llama.LlamaServer]:
    """Router mode: no model loaded until a request names ``llama.ROUTER_MODEL``."""
    yield from _serve("router", tmp_path_factory)
