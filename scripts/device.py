"""`make device`: the self-test through a real inferproxy, then the device tier.

Without `UPSTREAM`, it starts the local llama-server ("tools" preset), puts an `inferproxy` in front
of it on a temporary socket and runs `python -m app.selftest` through it. With
`UPSTREAM=host:port` (an external llama-server or router) it does the same against that server,
with the config in `CONFIG=path` (its `[expect]` must describe that server; `socket` is replaced
by the temporary proxy socket). Then it runs `pytest tests/device`, whose tests start their own
local servers and take the proxy's command from `INFERPROXY_CMD`. Exit 0 only if both pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "device"))
sys.path.insert(0, str(REPO / "scripts"))

import llama  # noqa: E402
from proxy import ProxyProcess, proxy_command  # noqa: E402

from demo import config_for  # noqa: E402


def write_toml(path: Path, data: dict[str, object]) -> None:
    lines: list[str] = []
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {toml_value(value)}")
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in table.items())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def selftest(socket_path: str, config: dict[str, object], folder: Path) -> int:
    config = {**config, "socket": socket_path}
    path = folder / "selftest.toml"
    write_toml(path, config)
    print(f"== self-test through {socket_path} ({path})", flush=True)
    return subprocess.call([sys.executable, "-m", "app.selftest", "--config", str(path)])


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="inferpath-device-"))
    upstream = os.environ.get("UPSTREAM", "").strip()
    with ExitStack() as stack:
        if upstream:
            config_path = os.environ.get("CONFIG", "").strip()
            if not config_path:
                print("UPSTREAM needs CONFIG=path: a config whose [expect] describes that server", file=sys.stderr)
                return 2
            with open(config_path, "rb") as handle:
                config = tomllib.load(handle)
        else:
            server = llama.launch("tools", log_dir=folder)
            stack.callback(server.stop)
            upstream = f"{server.host}:{server.port}"
            config = config_for("", llama.paths().template(llama.TOOLS_TEMPLATE), tool_prefill=llama.TOOL_PREFILL)
        proxy = stack.enter_context(ProxyProcess(upstream))
        print(proxy.start_line, flush=True)
        code = selftest(proxy.socket_path, config, folder)
    if code != 0:
        print(f"== self-test failed (exit {code})", flush=True)
        return code
    env = {**os.environ, "INFERPROXY_CMD": " ".join(proxy_command())}
    print("== device tests", flush=True)
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "tests/device"], cwd=REPO, env=env)


if __name__ == "__main__":
    sys.exit(main())
