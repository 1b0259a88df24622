"""The runnable examples of README.md and of every file under docs/, and examples/daemon.py, run
against a stack served by scripts/serve.py.

Marking: a README code block is runnable when its fence's info string is the language followed by
the word `runnable`: ```` ```python runnable ```` or ```` ```sh runnable ````. The language comes
first so that a renderer still highlights it; every other block (usage lines, a unit file, commands
for a production box) is left alone.

How each runs: `scripts/serve.py --run-dir DIR` serves the small model's llama-server and the proxy
for the whole module, on a temporary run folder; in each block, `.run/` (the folder `make serve`
uses) is replaced by that folder, so a `make serve` left running is never touched. Python blocks run
with this interpreter (the venv's), sh blocks with `bash -e` (every command must succeed), both
with the repo as the working folder and the venv's `bin/` first on PATH, as if the venv were
active. A block passes if it exits 0 within `BLOCK_TIMEOUT_S`. At the end the stack is stopped with
SIGINT, which must exit 0 and leave no socket behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
DAEMON = REPO / "examples" / "daemon.py"
SERVE = REPO / "scripts" / "serve.py"
READY_LINE = "serving; Ctrl-C stops it"  # scripts/serve.py's READY_LINE
RUN_FOLDER = ".run/"
# Generous: the machine may be shared, and the self-test alone is three real completions.
BLOCK_TIMEOUT_S = 240
STOP_TIMEOUT_S = 30
FENCE = re.compile(r"^```(?P<info>[^`\n]*)\n(?P<code>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
RUNNERS = {"python": [sys.executable, "-"], "sh": ["bash", "-e", "-s"]}
# The ownership command of "Installing next to a daemon" must find this project behind each name.
OWNERS = [f"{name}: ['inferpath']" for name in ("inferpath", "domain", "ports", "adapters", "app")]


@dataclass(frozen=True)
class Block:
    line: int
    language: str
    code: str
    source: str = "README.md"

    @property
    def name(self) -> str:
        return f"{self.source}:{self.line}:{self.language}"


def runnable_blocks(text: str, source: str = "README.md") -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        words = match["info"].split()
        if "runnable" in words[1:]:
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(Block(line, words[0], match["code"], source))
    return blocks


BLOCKS = [
    *runnable_blocks(README.read_text(encoding="utf-8")),
    *(block for doc in DOCS for block in runnable_blocks(doc.read_text(encoding="utf-8"), f"docs/{doc.name}")),
]


def test_the_readme_marks_its_examples_runnable() -> None:
    # The examples the README promises to run against `make serve`: the client, the self-test and
    # --print-expect, the proxy, the ownership check. Losing a marker must not go unnoticed.
    assert len(BLOCKS) >= 5, [b.name for b in BLOCKS]
    assert {b.language for b in BLOCKS} <= set(RUNNERS), [b.name for b in BLOCKS]
    joined = "\n".join(b.code for b in BLOCKS)
    for needle in (
        "chat_with_retry",
        "app.selftest --config",
        "--print-expect",
        "inferproxy",
        "packages_distributions",
    ):
        assert needle in joined, f"no runnable README or docs block holds {needle!r}"
    assert any(b.source == "README.md" for b in BLOCKS), "the README's own examples run too"


def test_the_fence_parser_takes_only_blocks_marked_runnable() -> None:
    text = "```sh\nfalse\n```\n\ntext\n```python runnable\nprint(1)\n```\n```sh  runnable\ntrue\n```\n"
    assert runnable_blocks(text) == [Block(6, "python", "print(1)\n"), Block(9, "sh", "true\n")]


@dataclass
class Stack:
    run_dir: Path
    process: subprocess.Popen[str]
    output: list[str]


@pytest.fixture(scope="module")
def served(device_artifacts: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("served") / "run"
    process = subprocess.Popen(
        [sys.executable, str(SERVE), "--run-dir", str(run_dir)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    output: list[str] = []
    try:
        for line in process.stdout:
            output.append(line)
            if line.strip() == READY_LINE:
                break
        else:
            process.wait(STOP_TIMEOUT_S)
            pytest.fail(f"scripts/serve.py exited {process.returncode} before serving:\n{''.join(output)}")
        yield Stack(run_dir, process, output)
    finally:
        stopped = _stop(process)
    assert stopped == 0, f"scripts/serve.py exited {stopped} on SIGINT:\n{''.join(output)}"
    assert not (run_dir / "infer.sock").exists(), "the socket was left behind"


def _stop(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
    if process.stdout is not None:
        process.stdout.close()
    return process.returncode


@pytest.mark.device
@pytest.mark.timeout(BLOCK_TIMEOUT_S + 120)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_each_runnable_readme_block_exits_0_against_the_served_stack(served: Stack, block: Block) -> None:
    code = block.code.replace(RUN_FOLDER, f"{served.run_dir}/")
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
    started = time.monotonic()
    try:
        done = subprocess.run(
            RUNNERS[block.language],
            input=code,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.name} ran past {BLOCK_TIMEOUT_S} s:\n{code}\n--- output:\n{exc.stdout!r}{exc.stderr!r}")
    seconds = time.monotonic() - started
    assert done.returncode == 0, (
        f"{block.name} exited {done.returncode} after {seconds:.1f} s:\n{code}\n"
        f"--- stdout:\n{done.stdout}\n--- stderr:\n{done.stderr}"
    )
    if "packages_distributions" in block.code:
        assert done.stdout.splitlines() == OWNERS


@pytest.mark.device
@pytest.mark.timeout(BLOCK_TIMEOUT_S + 120)
def test_the_example_daemon_runs_its_four_sessions_in_both_flavours_against_the_served_stack(served: Stack) -> None:
    done = subprocess.run(
        [sys.executable, str(DAEMON), str(served.run_dir / "config.toml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"--- stdout:\n{done.stdout}\n--- stderr:\n{done.stderr}"
    lines = done.stdout.splitlines()
    for session in range(4):  # three on the asyncio client, one on the blocking client
        assert any(line.startswith(f"session {session}: ") for line in lines), lines
    assert any(line.startswith("session 3: stopped after ") for line in lines), "the blocking session's cancel"
