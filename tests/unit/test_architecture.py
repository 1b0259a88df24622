"""The dependency rules of the layout, proved by walking the source with `ast`.

Two rules read more than import lines, so they resolve import aliases first (`import socket as
so`, `from socket import socket as s`) and name what a call or an attribute really refers to:

- No domain or client module starts a thread: everything under `src` except the proxy (two threads
  per connection, as the brief says) and the fake server (it plays the server, on threads of its
  own). Locks and conditions are fine, the slot gate needs them; creating a thread is not.
- Nothing outside `adapters/proxy` opens TCP: a `socket.socket` must name `AF_UNIX` (the family
  defaults to `AF_INET`), and no TCP constant, helper or client library appears at all.

Each rule is itself tested on small offending snippets, so a checker that stopped firing would fail.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
TESTS = Path(__file__).resolve().parents[1]

FORBIDDEN_IN_CORE = (
    "adapters",
    "app",
    "dependency_injector",
    "socket",
    "http",
    "h11",
    "httpx",
    "urllib",
    "ssl",
    "selectors",
    "asyncio",
    "requests",
    "threading.Thread",
)


def python_files(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


# -- references with import aliases resolved ------------------------------------------------------


def within(name: str, prefixes: tuple[str, ...] | frozenset[str]) -> bool:
    """`name` is one of `prefixes` or something inside one (`a.b.c` is within `a.b`)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class Module:
    """A parsed module and what its imported names stand for: `import socket as so` makes `so`
    stand for `socket`, `from socket import socket as s` makes `s` stand for `socket.socket`.
    Aliases are collected from every scope alike (an import inside a function counts too)."""

    def __init__(self, source: str) -> None:
        self.tree = ast.parse(source)
        self.aliases: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualname(self, node: ast.AST) -> str | None:
        """`so.socket` -> `socket.socket`; None for what is not a dotted name (a call's result)."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def imports(self) -> Iterator[tuple[int, str]]:
        """Every module and every `module.name` an import statement brings in (`*` included)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield node.lineno, node.module
                for alias in node.names:
                    yield node.lineno, f"{node.module}.{alias.name}"

    def references(self) -> Iterator[tuple[int, str | None, str]]:
        """(line, resolved dotted name or None, last identifier) of every name and attribute."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name):
                yield node.lineno, self.qualname(node), node.id
            elif isinstance(node, ast.Attribute):
                yield node.lineno, self.qualname(node), node.attr

    def dynamic_lookups(self) -> Iterator[tuple[int, str]]:
        """Constant strings handed to `getattr`, `__import__` or `importlib.import_module`."""
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            func = self.qualname(node.func)
            strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if func in ("getattr", "builtins.getattr", "__import__", "importlib.import_module") and strings:
                yield node.lineno, strings[0]


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    yield from Module(path.read_text(encoding="utf-8")).imports()


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


CALL_MODULES = sorted(
    [
        SRC / "app" / "client.py",
        SRC / "app" / "async_client.py",
        *(SRC / "app" / "_async").glob("*.py"),
        *(SRC / "app" / "_sync").glob("*.py"),
    ]
)


def test_the_client_imports_no_adapter_module() -> None:
    # The data path reads in one direction: the client decides through the domain and reaches
    # the world only through the ports the container hands it. Both flavours of the call, and
    # the modules that name them, are checked.
    assert len(CALL_MODULES) >= 6
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {module}"
        for path in CALL_MODULES
        for line, module in imported_modules(path)
        if module == "adapters" or module.startswith(("adapters.", "app.config", "app.container"))
    ]
    assert offenders == []


MAX_MODULE_LINES = 350


def hand_written(layer: str) -> Iterator[Path]:
    """The modules of `layer` written by hand: not the blocking twins `scripts/unasync.py` writes."""
    for path in python_files(SRC / layer):
        if not path.read_text(encoding="utf-8").startswith("# Generated from "):
            yield path


def test_hand_written_app_and_domain_modules_stay_under_350_lines() -> None:
    offenders = [
        f"{path.relative_to(SRC)} ({n} lines)"
        for layer in ("app", "domain")
        for path in hand_written(layer)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) >= MAX_MODULE_LINES
    ]
    assert offenders == []


def test_the_blocking_twins_are_marked_generated_and_have_their_source() -> None:
    for twin_dir in (SRC / "app" / "_sync", SRC / "adapters" / "uds_http" / "_sync"):
        twins = list(twin_dir.glob("*.py"))
        assert twins, twin_dir
        for twin in twins:
            first = twin.read_text(encoding="utf-8").splitlines()[0]
            source = twin.parent.with_name("_async") / twin.name
            assert first == f"# Generated from {source.relative_to(SRC.parent)} by scripts/unasync.py: do not edit."
            assert source.exists()


def test_the_domain_holds_no_coroutine() -> None:
    # Sans-IO: no `async def`, no `await` in the domain; the loops over a port are the call's.
    offenders = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in python_files(SRC / "domain")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith)
    ]
    assert offenders == []


MAX_FUNCTION_LINES = 70


def long_functions(source: str) -> list[str]:
    return [
        f"{node.lineno}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_function_is_longer_than_can_be_read_at_once() -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{where}"
        for path in python_files(SRC)
        for where in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_the_length_rule_counts_a_function_from_its_def_to_its_last_line() -> None:
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    assert long_functions(f"def f():\n{body}\n") == []
    assert long_functions(f"def f():\n{body}\n    y = 0\n") == [f"1: f ({MAX_FUNCTION_LINES + 1} lines)"]


def test_ports_import_only_the_standard_library() -> None:
    allowed_roots = {"__future__", "typing", "enum", "dataclasses", "collections", "abc", "threading", "ports"}
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {module}"
        for path in python_files(SRC / "ports")
        for line, module in imported_modules(path)
        if module.split(".")[0] not in allowed_roots
    ]
    assert offenders == []


def test_the_walk_sees_every_layer() -> None:
    # Guards the tests above against passing on an empty tree.
    for layer in ("domain", "ports", "adapters/uds_http", "adapters/fake_server", "app"):
        assert list(python_files(SRC / layer)), layer


def test_the_import_walk_would_catch_an_offender(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom app.config import Config\nfrom threading import Thread\n")
    assert [m for _, m in imported_modules(bad) if is_forbidden(m)] == [
        "socket",
        "app.config",
        "app.config.Config",
        "threading.Thread",
    ]


# -- no thread outside the proxy and the fake server -------------------------------------------------

THREAD_MODULES = ("_thread", "concurrent.futures", "multiprocessing")
THREAD_OBJECTS = ("threading.Thread", "threading.Timer", "threading._start_new_thread", "asyncio.to_thread")
# Names that start a thread whatever they are reached through (`loop.run_in_executor`, an
# attribute of an object the walk cannot resolve).
THREAD_IDENTIFIERS = frozenset(
    {
        "Thread",
        "start_new_thread",
        "_start_new_thread",
        "ThreadPoolExecutor",
        "ProcessPoolExecutor",
        "to_thread",
        "run_in_executor",
    }
)
THREAD_EXEMPT = (SRC / "adapters" / "proxy", SRC / "adapters" / "fake_server")


def thread_starts(source: str) -> list[str]:
    """Where `source` starts (or could start) a thread: `line: what`."""
    module = Module(source)
    found: set[str] = set()
    for line, name in module.imports():
        if within(name, THREAD_MODULES) or within(name, THREAD_OBJECTS):
            found.add(f"{line}: imports {name}")
    for line, qualname, ident in module.references():
        if qualname is not None and (within(qualname, THREAD_MODULES) or within(qualname, THREAD_OBJECTS)):
            found.add(f"{line}: uses {qualname}")
        elif ident in THREAD_IDENTIFIERS:
            found.add(f"{line}: uses {ident}")
    for line, text in module.dynamic_lookups():
        if within(text, THREAD_MODULES) or text in THREAD_IDENTIFIERS or text == "Timer":
            found.add(f"{line}: looks up {text!r}")
    return sorted(found)


def offenders(rule: Callable[[str], list[str]], exempt: tuple[Path, ...]) -> list[str]:
    return [
        f"{path.relative_to(SRC)}:{finding}"
        for path in python_files(SRC)
        if not any(folder in path.parents for folder in exempt)
        for finding in rule(path.read_text(encoding="utf-8"))
    ]


def test_no_domain_or_client_module_starts_a_thread() -> None:
    assert offenders(thread_starts, THREAD_EXEMPT) == []


@pytest.mark.parametrize(
    "source",
    [
        "import threading\nthreading.Thread(target=f).start()\n",
        "import threading as t\nt.Thread(target=f, daemon=True).start()\n",
        "from threading import Thread\nThread(target=f).start()\n",
        "from threading import Thread as Worker\nWorker(target=f).start()\n",
        "import threading\nthreading.Timer(1.0, f).start()\n",
        "from threading import Timer\nTimer(1.0, f).start()\n",
        "import threading\nthreading._start_new_thread(f, ())\n",
        "import _thread\n_thread.start_new_thread(f, ())\n",
        "from _thread import start_new_thread\nstart_new_thread(f, ())\n",
        "from concurrent.futures import ThreadPoolExecutor\nThreadPoolExecutor(2).submit(f)\n",
        "import concurrent.futures\nconcurrent.futures.ThreadPoolExecutor().submit(f)\n",
        "from concurrent import futures\nfutures.ThreadPoolExecutor().submit(f)\n",
        "import multiprocessing\nmultiprocessing.Process(target=f).start()\n",
        "from multiprocessing.pool import ThreadPool\nThreadPool(2)\n",
        "import asyncio\nasync def g():\n    await asyncio.to_thread(f)\n",
        "import asyncio\nasync def g():\n    await asyncio.get_running_loop().run_in_executor(None, f)\n",
        "def g(threading):\n    threading.Thread(target=f).start()\n",
        "import threading\ngetattr(threading, 'Thread')(target=f).start()\n",
        "import threading\ngetattr(threading, 'Timer')(1.0, f).start()\n",
        "__import__('_thread').start_new_thread(f, ())\n",
        "import importlib\nimportlib.import_module('concurrent.futures')\n",
        "def g():\n    import threading\n    threading.Thread(target=f).start()\n",
    ],
)
def test_the_thread_rule_catches_each_way_to_start_a_thread(source: str) -> None:
    assert thread_starts(source) != [], source


@pytest.mark.parametrize(
    "source",
    [
        # What the slot gate does to be safe across threads: locks and conditions start nothing.
        "import threading\nlock = threading.Lock()\ncond = threading.Condition(lock)\ncond.notify_all()\n",
        "from threading import Condition, Event, Lock, RLock\nEvent().wait(1.0)\n",
        "import threading\nthreading.get_ident()\n",
        "import time\ntime.sleep(0)\n",
    ],
)
def test_the_thread_rule_lets_locks_and_conditions_through(source: str) -> None:
    assert thread_starts(source) == []


def test_the_thread_rule_covers_the_domain_ports_and_client_and_sees_the_proxy_threads() -> None:
    # The exemptions leave the client's modules in scope, and the checker finds the proxy's own
    # threads when it is pointed at them: it works on real source, not only on snippets.
    checked = {
        path.relative_to(SRC).as_posix()
        for path in python_files(SRC)
        if not any(folder in path.parents for folder in THREAD_EXEMPT)
    }
    assert {
        "domain/gate.py",
        "domain/retry.py",
        "ports/clock.py",
        "app/client.py",
        "app/container.py",
        "adapters/uds_http/_async/transport.py",
        "adapters/system.py",
    } <= checked
    assert thread_starts((SRC / "adapters" / "proxy" / "connection.py").read_text(encoding="utf-8")) != []
    assert thread_starts((SRC / "adapters" / "fake_server" / "server.py").read_text(encoding="utf-8")) != []


# -- no TCP outside the proxy ------------------------------------------------------------------------

TCP_MODULES = (
    "http.client",
    "http.server",
    "urllib.request",
    "urllib3",
    "httpx",
    "requests",
    "aiohttp",
    "ftplib",
    "smtplib",
    "poplib",
    "imaplib",
    "nntplib",
    "telnetlib",
    "xmlrpc",
    "websockets",
)
TCP_OBJECTS = (
    "socket.AF_INET",
    "socket.AF_INET6",
    "socket.create_connection",
    "socket.create_server",
    "asyncio.open_connection",
    "asyncio.start_server",
    "socketserver.TCPServer",
    "socketserver.ThreadingTCPServer",
    "socketserver.ForkingTCPServer",
    "socketserver.UDPServer",
)
# TCP whatever it is reached through (`loop.create_connection`, `sock.family == AF_INET`).
TCP_IDENTIFIERS = frozenset(
    {
        "AF_INET",
        "AF_INET6",
        "create_connection",
        "create_server",
        "open_connection",
        "start_server",
        "HTTPConnection",
        "HTTPSConnection",
        "urlopen",
        "TCPServer",
        "ThreadingTCPServer",
        "ForkingTCPServer",
    }
)
TCP_EXEMPT = (SRC / "adapters" / "proxy",)


def _socket_family(call: ast.Call) -> ast.expr | None:
    """The `family` argument of a `socket.socket(...)` call, positional or by keyword."""
    family = call.args[0] if call.args else None
    for keyword in call.keywords:
        if keyword.arg == "family":
            family = keyword.value
    return family


def tcp_uses(source: str) -> list[str]:
    """Where `source` opens TCP (or names a way to): `line: what`."""
    module = Module(source)
    found: set[str] = set()
    for line, name in module.imports():
        if within(name, TCP_MODULES) or within(name, TCP_OBJECTS) or name == "socket.*":
            found.add(f"{line}: imports {name}")
    for line, qualname, ident in module.references():
        if qualname is not None and (within(qualname, TCP_MODULES) or within(qualname, TCP_OBJECTS)):
            found.add(f"{line}: uses {qualname}")
        elif ident in TCP_IDENTIFIERS:
            found.add(f"{line}: uses {ident}")
    for line, text in module.dynamic_lookups():
        if within(text, TCP_MODULES) or text in TCP_IDENTIFIERS:
            found.add(f"{line}: looks up {text!r}")
    for node in ast.walk(module.tree):
        # A socket's family defaults to AF_INET: only one that names AF_UNIX is not TCP.
        if isinstance(node, ast.Call) and module.qualname(node.func) == "socket.socket":
            family = _socket_family(node)
            if family is None or module.qualname(family) != "socket.AF_UNIX":
                shown = "no family" if family is None else ast.unparse(family)
                found.add(f"{node.lineno}: socket.socket with {shown}, not AF_UNIX")
    return sorted(found)


def test_only_the_proxy_opens_tcp() -> None:
    assert offenders(tcp_uses, TCP_EXEMPT) == []


@pytest.mark.parametrize(
    "source",
    [
        "import socket\nsocket.socket()\n",
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)\n",
        "import socket\nsocket.socket(socket.AF_INET6)\n",
        "import socket\nsocket.socket(family=socket.AF_INET)\n",
        "import socket\nsocket.socket(type=socket.SOCK_STREAM)\n",
        "import socket\nsocket.socket(2, 1)\n",
        "import socket\nfamily = socket.AF_UNIX\nsocket.socket(family)\n",  # only a literal AF_UNIX is trusted
        "from socket import socket\nsocket()\n",
        "from socket import socket as s\ns()\n",
        "import socket as so\nso.socket()\n",
        "from socket import socket, AF_INET\nsocket(AF_INET)\n",
        "from socket import AF_INET as UNIX\n",
        "from socket import *\n",
        "import socket\nsocket.create_connection(('127.0.0.1', 8080))\n",
        "from socket import create_connection\ncreate_connection(('localhost', 80))\n",
        "import socket as so\nso.create_server(('', 0))\n",
        "import socket\ngetattr(socket, 'AF_INET')\n",
        "def f(sock):\n    return sock.family == AF_INET\n",
        "import http.client\nhttp.client.HTTPConnection('localhost')\n",
        "from http.client import HTTPConnection as C\nC('localhost')\n",
        "from http import client\nclient.HTTPConnection('localhost')\n",
        "import urllib.request\nurllib.request.urlopen('http://localhost/')\n",
        "from urllib.request import urlopen\nurlopen('http://localhost/')\n",
        "import importlib\nimportlib.import_module('urllib.request')\n",
        "import httpx\nhttpx.get('http://localhost/')\n",
        "import asyncio\nasync def g():\n    await asyncio.open_connection('localhost', 80)\n",
        "async def g(loop):\n    await loop.create_connection(f, 'localhost', 80)\n",
        "import socketserver\nsocketserver.TCPServer(('', 0), H)\n",
    ],
)
def test_the_tcp_rule_catches_each_way_to_open_tcp(source: str) -> None:
    assert tcp_uses(source) != [], source


@pytest.mark.parametrize(
    "source",
    [
        "import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n",
        "import socket\nsocket.socket(family=socket.AF_UNIX)\n",
        "import socket as so\nso.socket(so.AF_UNIX, so.SOCK_STREAM)\n",
        "from socket import socket, AF_UNIX, SOCK_STREAM\nsocket(AF_UNIX, SOCK_STREAM)\n",
        "import socket\ndef f(sock: socket.socket) -> None:\n    sock.shutdown(socket.SHUT_RDWR)\n",
        "import socket\nsocket.socketpair()\n",
        "from urllib.parse import quote\nquote('a b')\n",
        "import asyncio\nasync def g(path):\n    await asyncio.open_unix_connection(path)\n",
    ],
)
def test_the_tcp_rule_lets_unix_sockets_through(source: str) -> None:
    assert tcp_uses(source) == []


def test_the_tcp_rule_covers_all_but_the_proxy_and_sees_the_proxys_tcp() -> None:
    checked = {
        path.relative_to(SRC).as_posix()
        for path in python_files(SRC)
        if not any(folder in path.parents for folder in TCP_EXEMPT)
    }
    assert {
        "domain/gate.py",
        "app/client.py",
        "adapters/uds_http/_async/transport.py",
        "adapters/fake_server/server.py",
    } <= checked
    assert tcp_uses((SRC / "adapters" / "proxy" / "connection.py").read_text(encoding="utf-8")) != []


# The domain decides; it reads no clock, no randomness and nothing of the OS: times come in as
# values or through the Clock port, ids and jitter from sources the app gives it. Locks stay
# (`threading`: a `CancelToken` and the slot gate are values shared across threads).
IMPURE_IN_DOMAIN = ("os", "random", "secrets", "socket", "time", "uuid", "select", "signal", "asyncio")


def test_the_domain_reads_no_clock_randomness_or_os() -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {module}"
        for path in python_files(SRC / "domain")
        for line, module in imported_modules(path)
        if module.split(".")[0] in IMPURE_IN_DOMAIN
    ]
    assert offenders == []


def domain_imports(path: Path) -> set[str]:
    """The domain modules `path` imports, `TYPE_CHECKING` blocks included (a cycle there is one too)."""
    found = set()
    for _, module in imported_modules(path):
        parts = module.split(".")
        if parts[0] == "domain" and len(parts) >= 2 and (SRC / "domain" / f"{parts[1]}.py").exists():
            found.add(parts[1])
    return found - {path.stem}


def test_no_domain_module_imports_one_that_imports_it_back() -> None:
    graph = {path.stem: domain_imports(path) for path in python_files(SRC / "domain") if path.stem != "__init__"}
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert cycles == []
