"""`make serve`: a local stack to try the client against, until Ctrl-C.

Starts the small model's llama-server (the "tools" preset of `tests/device/llama.py`: the Qwen3
template, two slots of 4096 tokens, on a free port of 127.0.0.1) and an `inferproxy` in front of it
on `RUN/infer.sock`, then writes into the run folder (`.run/` of the repo unless `--run-dir`):

    config.toml     a config for that socket, with the [expect] block the live server's /props
                    gives (`app.selftest.expect_toml`) and the tool prefill the small model needs
    upstream        the server's HOST:PORT, for a second proxy or a look at the server itself
    logs/           the server's log
    slots/          slot checkpoints (`--slot-save-path`): `Client.save_slot` writes them here

With `--router` (`make serve ROUTER=1`) the server is the brief's deployment instead: a llama-server
router (the "router" preset: two models of the small model's file, `tools-model` under the Qwen3
template and `thinking-model` under Qwen3.5, `--models-max 1`, one `--slot-save-path` for both),
with the config naming `tools-model`. No model is loaded until a chat or `--print-expect` names it;
a chat for `thinking-model` swaps it in, and the `tools-model` session comes back from its
checkpoint. The config's [expect] block is read after loading `tools-model` once.

It prints the config's path and what to try next, then one line "serving; Ctrl-C stops it" once
everything is ready (tests wait for that line), and from then on the proxy's own lines (one per
refused connection, a summary a second past ten) as they come. SIGINT or SIGTERM stops the proxy (which removes
the socket) and the server, and exits 0; if either dies on its own, the other is stopped and the
exit is 1. The config, the logs and the checkpoints stay behind; the socket and `upstream` do not.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "device"))

import llama  # noqa: E402  (server presets shared with the device tier and the demo)
from proxy import ProxyProcess  # noqa: E402

from app.config import parse_config  # noqa: E402
from app.container import Container  # noqa: E402
from app.selftest import expect_toml  # noqa: E402

READY_LINE = "serving; Ctrl-C stops it"
PRESET = "tools"
# Answers of the small model are capped so that a rambling one still ends in a few seconds.
MAX_TOKENS = 512


def config_text(socket_path: Path, expect: str, model: str) -> str:
    prefill = llama.TOOL_PREFILL.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f"""\
# Written by `make serve` (scripts/serve.py) for the stack it runs; every other key has its default
# (examples/config.toml lists them all).
socket = "{socket_path}"
model = "{model}"

[limits]
max_tokens = {MAX_TOKENS}

# Greedy and seeded, so the examples and the self-test give the same answers run after run (the
# small model's tool call closes within the self-test's budget when it is not sampled at random).
[sampling]
temperature = 0.0
seed = 42

# From the live server's /props (`python -m app.selftest --print-expect --config THIS_FILE`).
{expect}
[selftest]
# The small model completes a tool call only when its opening is handed to it (Qwen3 syntax).
tool_prefill = "{prefill}"
"""


def live_expect(socket_path: Path, model: str) -> str:
    config = parse_config({"socket": str(socket_path), "model": model})
    with Container(config=config).client() as client:
        return expect_toml(client.props(load=True))  # a router loads the model for it


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve(run_dir: Path, *, router: bool = False) -> int:
    preset, model = ("router", llama.ROUTER_TOOLS) if router else (PRESET, llama.ALIAS)
    run_dir.mkdir(parents=True, exist_ok=True)
    socket_path = run_dir / "infer.sock"
    upstream_file = run_dir / "upstream"
    config_path = run_dir / "config.toml"
    with ExitStack() as stack:
        server = llama.launch(preset, log_dir=run_dir / "logs", slot_save_path=run_dir / "slots")
        stack.callback(server.stop)
        upstream = f"{server.host}:{server.port}"
        proxy = stack.enter_context(ProxyProcess(upstream, str(socket_path), echo=sys.stdout))
        stack.callback(upstream_file.unlink, missing_ok=True)
        upstream_file.write_text(upstream + "\n", encoding="utf-8")
        config_path.write_text(config_text(socket_path, live_expect(socket_path, model), model), encoding="utf-8")
        rel = _shown(run_dir)
        print(
            f"llama-server ({preset} preset, {llama.paths().model.name}) on {upstream}, log {server.log_path}\n"
            f"{proxy.start_line}\n"
            f"config: {config_path}\n"
            "\n"
            "try, in another terminal (in the repo, with `. .venv/bin/activate`):\n"
            f"  python -m app.selftest --config {rel}/config.toml\n"
            f"  python -m app.selftest --print-expect --config {rel}/config.toml\n"
            f"  curl -s --unix-socket {rel}/infer.sock http://localhost/props | head -c 300; echo\n"
            "  and the examples of README.md and docs/\n",
            flush=True,
        )
        print(READY_LINE, flush=True)
        while True:
            time.sleep(0.5)
            if not server.running():
                print(f"llama-server exited ({server.process.returncode}); see {server.log_path}", flush=True)
                return 1
            if proxy.process is None or proxy.process.poll() is not None:
                print("inferproxy exited; stopping the server", flush=True)
                return 1


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, default=REPO / ".run", help="the run folder (default: .run/)")
    parser.add_argument(
        "--router",
        action="store_true",
        help=f"a router of two models ({llama.ROUTER_TOOLS}, {llama.ROUTER_THINKING}) under --models-max 1",
    )
    args = parser.parse_args(argv)
    # Both signals unwind the same way, so every started process is stopped in order. SIGINT is set
    # explicitly: a shell starts a background job with it ignored, and `kill -INT` must still stop us.
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    try:
        return serve(args.run_dir, router=args.router)
    except KeyboardInterrupt:
        print("\nstopped inferproxy and llama-server", flush=True)
        return 0
    except (llama.ServerStartError, RuntimeError) as exc:
        print(f"serve: {exc}", file=sys.stderr, flush=True)
        if "another inferproxy holds" in str(exc):
            print(
                f"serve: is another `make serve` running on {args.run_dir}? Stop it, or pass --run-dir FOLDER",
                file=sys.stderr,
                flush=True,
            )
        return 1


if __name__ == "__main__":
    sys.exit(main())
