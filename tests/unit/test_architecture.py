"""The dependency rules of the layout, proved by walking the source with `ast`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
TESTS = Path(__file__).resolve().parents[1]

FORBIDDEN_IN_CORE = ("adapters", "app", "dependency_injector", "socket", "http", "h11", "httpx", "urllib",
                     "ssl", "selectors", "asyncio", "requests", "threading.Thread")
TCP_NAMES = ("AF_INET", "AF_INET6", "create_connection", "create_server", "HTTPConnection", "urlopen")


def python_files(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def names_used(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.alias):
            yield getattr(node, "lineno", 0), node.name.rsplit(".", 1)[-1]


def is_forbidden(module: str) -> bool:
    return any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN_IN_CORE)


@pytest.mark.parametrize("layer", ["domain", "ports"])
def test_core_layers_import_no_adapter_app_container_or_network_module(layer: str) -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {module}"
        for path in python_files(SRC / layer)
        for line, module in imported_modules(path)
        if is_forbidden(module)
    ]
    assert offenders == []


def test_ports_import_only_the_standard_library() -> None:
    allowed_roots = {"__future__", "typing", "enum", "dataclasses", "collections", "abc", "ports"}
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {module}"
        for path in python_files(SRC / "ports")
        for line, module in imported_modules(path)
        if module.split(".")[0] not in allowed_roots
    ]
    assert offenders == []


def test_only_the_proxy_opens_tcp() -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for path in python_files(SRC)
        if (SRC / "adapters" / "proxy") not in path.parents
        for line, name in names_used(path)
        if name in TCP_NAMES
    ]
    assert offenders == []


def test_the_walk_sees_every_layer() -> None:
    # Guards the tests above against passing on an empty tree.
    for layer in ("domain", "ports", "adapters/uds_http", "adapters/fake_server", "app"):
        assert list(python_files(SRC / layer)), layer


def test_the_walk_would_catch_an_offender(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom app.config import Config\ns = socket.socket(socket.AF_INET)\n")
    assert [m for _, m in imported_modules(bad) if is_forbidden(m)] == ["socket", "app.config", "app.config.Config"]
    assert "AF_INET" in [n for _, n in names_used(bad)]


def test_no_module_outside_proxy_and_tests_starts_a_thread_in_the_domain() -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{line}"
        for path in python_files(SRC / "domain")
        for line, name in names_used(path)
        if name == "Thread"
    ]
    assert offenders == []
