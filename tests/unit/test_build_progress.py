"""scripts/llama_server.py's `run_logged`: the build shows one progress line, not the compiler's
output, keeps that output in full in its log, and shows the log's tail only when the step fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llama_server.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("inferpath_llama_server_setup_progress", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


setup = _load()


def build_like(folder: Path, percents: range, noise: int = 3, exit_code: int = 0) -> list[str]:
    """A shell script printing what CMake's build prints: progress lines among compiler noise."""
    lines = []
    for percent in percents:
        lines.append(f"[{percent:3d}%] Building CXX object ggml/src/file{percent}.cpp.o")
        lines += [f"warning: noise {percent}.{n}" for n in range(noise)]
    script = folder / "build.sh"
    script.write_text("".join(f"echo '{line}'\n" for line in lines) + f"exit {exit_code}\n")
    return ["bash", str(script)]


def test_off_a_terminal_it_prints_one_line_per_ten_percent_and_logs_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "build.log"

    setup.run_logged(build_like(tmp_path, range(0, 101, 2)), "building", log, tty=False)

    lines = capsys.readouterr().out.splitlines()
    assert [line.split("%")[0].rsplit(" ", 1)[-1] for line in lines] == [str(p) for p in range(0, 101, 10)]
    assert all(line.startswith("[llama-server] building: ") and " after " in line for line in lines)
    text = log.read_text()
    assert text.count("warning: noise") == 51 * 3
    assert "[100%] Building CXX object" in text


def test_on_a_terminal_it_updates_one_line_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    setup.run_logged(build_like(tmp_path, range(0, 101, 25)), "building", tmp_path / "build.log", tty=True)

    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.endswith("\n")
    assert out.count("\r") == 5
    assert "noise" not in out
    assert "100% after 0s" in out


def test_a_failure_shows_the_last_fifty_lines_of_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "build.log"

    with pytest.raises(setup.SetupError) as caught:
        setup.run_logged(build_like(tmp_path, range(0, 40), noise=1, exit_code=3), "building", log, tty=False)

    message = str(caught.value)
    assert message.startswith(f"building failed (exit 3): bash {tmp_path / 'build.sh'}\n")
    assert f"the last 50 lines of {log}:" in message
    tail = message.split(f"the last 50 lines of {log}:\n", 1)[1].splitlines()
    assert tail == log.read_text().splitlines()[-50:]
    assert tail[-1] == "warning: noise 39.0"
    assert "noise 14.0" not in message  # 80 lines were written: the first 30 are only in the log
