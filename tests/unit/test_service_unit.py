"""examples/inferproxy.service: a systemd unit made of sections and key=value lines only, that runs
the proxy with the settings the README names, on a socket inside the folder systemd makes for it."""

from __future__ import annotations

import shlex
from pathlib import Path, PurePosixPath

import pytest

from adapters.proxy.options import MAX_SOCKET_PATH_BYTES, Address, parse_upstream

UNIT = Path(__file__).resolve().parents[2] / "examples" / "inferproxy.service"
# What systemd's %t means in a system unit (the runtime directory root).
RUNTIME_ROOT = "/run"

Sections = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Sections:
    """INI-ish as systemd reads it: [Section] headers, key=value lines, # or ; comments, blank lines."""
    sections: Sections = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and key.strip() and key == key.strip(), f"line {number} is not key=value: {raw!r}"
        assert current is not None, f"line {number} comes before any [Section]: {raw!r}"
        assert not value.endswith("\\"), f"line {number} continues onto the next: keep each setting on one line"
        current.setdefault(key, []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def service() -> dict[str, str]:
    sections = parse_unit(UNIT.read_text(encoding="utf-8"))
    assert set(sections) == {"Unit", "Service", "Install"}
    for name, values in sections["Service"].items():
        assert len(values) == 1, f"{name}= is set {len(values)} times"
    return {name: values[0] for name, values in sections["Service"].items()}


def exec_start(service: dict[str, str]) -> list[str]:
    return shlex.split(service["ExecStart"])


def option(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} must be given once in ExecStart: {argv}"
    return argv[argv.index(flag) + 1]


def test_the_unit_parses_as_sections_of_key_value_lines() -> None:
    sections = parse_unit(UNIT.read_text(encoding="utf-8"))
    assert sections["Install"]["WantedBy"] == ["multi-user.target"]


def test_it_runs_as_a_user_and_group_of_its_own_and_restarts_on_failure(service: dict[str, str]) -> None:
    assert service["User"] and service["Group"]
    assert service["User"] != "root"
    assert service["Restart"] == "on-failure"


def test_the_listen_socket_lies_inside_the_runtime_directory(service: dict[str, str]) -> None:
    runtime = PurePosixPath(RUNTIME_ROOT) / service["RuntimeDirectory"]
    listen = PurePosixPath(option(exec_start(service), "--listen").replace("%t", RUNTIME_ROOT))

    assert listen.parent == runtime
    assert len(str(listen).encode()) <= MAX_SOCKET_PATH_BYTES


def test_it_forwards_to_the_llama_server_port_of_the_brief(service: dict[str, str]) -> None:
    argv = exec_start(service)
    assert PurePosixPath(argv[0]).name == "inferproxy"
    assert parse_upstream(option(argv, "--upstream")) == Address("127.0.0.1", 11434)


def test_the_parser_refuses_a_line_that_is_not_key_value() -> None:
    with pytest.raises(AssertionError, match="not key=value"):
        parse_unit("[Service]\nExecStart /bin/true\n")
