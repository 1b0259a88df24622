"""`load_config` reads only a regular file, at most 1 MiB of it, and never blocks opening it.

A wrong path must fail at once with its name and what it is: a FIFO with no writer used to hang the
open, and /dev/zero used to be read until memory ran out. The tests guard against exactly those
failures, so each one bounds itself: a thread joined with a timeout, or a child process with a
memory limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from app.config import ConfigError, load_config

SRC = Path(__file__).resolve().parents[2] / "src"
CAP = 1_048_576  # 1 MiB


def load_outcome(path: Path, *, within_s: float = 5.0) -> str:
    """The `ConfigError` message for `path`, or the test fails if loading blocks or succeeds."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            load_config(path)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(within_s)
    if worker.is_alive():
        # Blocked opening the FIFO: a writer that opens and closes at once lets it go with EOF.
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(within_s)
        pytest.fail(f"load_config({path}) was still blocked after {within_s} s")
    [error] = outcome
    assert isinstance(error, ConfigError), f"expected ConfigError, got {error!r}"
    return str(error)


def test_a_named_pipe_with_no_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    assert load_outcome(fifo) == f"{fifo}: is a named pipe, not a regular file"


def test_a_character_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    # /dev/null used to load as an empty file and blame the missing `socket` key.
    assert load_outcome(Path("/dev/null")) == "/dev/null: is a character device, not a regular file"


def test_dev_zero_is_refused_without_reading_it() -> None:
    # Run in a child with 1 GiB of address space and a deadline: code that reads /dev/zero whole
    # fails there with MemoryError instead of taking this machine's memory.
    child = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from app.config import ConfigError, load_config
        try:
            load_config("/dev/zero")
        except ConfigError as exc:
            print(exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=30, env=env)
    assert done.stdout.strip() == "/dev/zero: is a character device, not a regular file", done.stderr[-2000:]


def test_a_file_over_one_mib_is_refused_naming_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b'socket = "s"\n' + b"#" * CAP)
    message = load_outcome(path)
    assert message == f"{path}: config file is {CAP + 13} bytes, over the cap of 1048576 bytes (1 MiB)"


def test_a_file_of_exactly_one_mib_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    head = b'socket = "s"\n#'
    path.write_bytes(head + b"x" * (CAP - len(head)))
    assert path.stat().st_size == CAP
    assert load_config(path).socket == "s"


def test_a_symlink_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "real.toml"
    target.write_text('socket = "s"\n', encoding="utf-8")
    link = tmp_path / "config.toml"
    link.symlink_to(target)
    assert load_config(link).socket == "s"


def test_a_symlink_to_a_named_pipe_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "config.toml"
    link.symlink_to(fifo)
    assert load_outcome(link) == f"{link}: is a named pipe, not a regular file"


def test_a_nul_in_the_path_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read config file: embedded null byte"):
        load_config("/tmp/config\x00.toml")


def test_an_integer_of_thousands_of_digits_is_invalid_toml(tmp_path: Path) -> None:
    # Python refuses to convert it, and tomllib lets that ValueError through.
    path = tmp_path / "config.toml"
    path.write_text('socket = "s"\n[limits]\npoll_ms = ' + "9" * 5000 + "\n", encoding="utf-8")
    assert load_outcome(path).startswith(f"{path}: invalid TOML: Exceeds the limit (4300 digits)")


def test_arrays_nested_past_the_parsers_depth_are_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('socket = "s"\nx = ' + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    assert load_outcome(path) == f"{path}: invalid TOML: arrays or tables nested too deeply"


def test_values_that_toml_allows_but_the_client_cannot_use_are_named_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('socket = "s"\n[sampling]\ntemperature = inf\n[limits]\npoll_ms = 9223372036854775807\n')
    message = load_outcome(path)
    assert message.startswith(f"{path}: ")
    assert "limits.poll_ms: Input should be less than or equal to 604800000" in message
    assert "sampling.temperature: Input should be a finite number" in message


def test_a_hex_integer_of_thousands_of_digits_is_named_by_its_key(tmp_path: Path) -> None:
    # TOML's hex literals have no digit limit of Python's: the int loads, and has no repr.
    path = tmp_path / "config.toml"
    path.write_text('socket = "s"\n[limits]\npoll_ms = 0x' + "f" * 4000 + "\n", encoding="utf-8")
    assert load_outcome(path) == (
        f"{path}: limits.poll_ms: Input should be less than or equal to 604800000 (got <int with no repr>)"
    )


@pytest.mark.parametrize(
    "line",
    [
        "a" + ".a" * 50_000 + " = 1",  # 100 KB: its parse would take the TOML parser minutes
        "[limits" + ".a" * 50_000 + "]",
        "[[limits" + ".a" * 50_000 + "]]",
        'x = { y = 1, "b"' + '."b"' * 40 + " = 1 }",
        "'a'" + " . 'a'" * 40 + " = 1",
    ],
)
def test_a_key_of_more_than_32_dotted_parts_is_refused_before_the_parse(tmp_path: Path, line: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text('socket = "s"\n' + line + "\n", encoding="utf-8")
    assert load_outcome(path, within_s=2.0) == f"{path}: invalid TOML: line 2: a key of more than 32 dotted parts"


def test_a_key_of_32_parts_and_dots_in_values_and_comments_are_no_long_key(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        'socket = "s"\nmodel = "' + "a." * 100 + '"\n# ' + ". " * 100 + "\n" + "a" + ".a" * 31 + " = 1\n",
        encoding="utf-8",
    )
    assert load_outcome(path) == f"{path}: a: unknown key"


def test_a_config_error_names_at_most_ten_problems_then_how_many_more(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('socket = "s"\n' + "".join(f"k{i} = {i}\n" for i in range(50_000)), encoding="utf-8")
    message = load_outcome(path)
    assert message == f"{path}: " + "; ".join(f"k{i}: unknown key" for i in range(10)) + "; and 49990 more"
