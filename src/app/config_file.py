"""Reading `config.toml`: the file's bytes, safely, and its TOML, within bounded time.

Invariants:
- The file is read only if it is a regular file, at most `CONFIG_FILE_BYTES` of it, and opening it
  never blocks (a FIFO with no writer would hang on open).
- A key of more than `MAX_KEY_PARTS` dotted parts is refused before the TOML parser sees it: the
  parser's time grows with the square of a key's parts (one key of 50,000 parts, a 100 KB file,
  takes minutes), while the config's own keys have two.
- Every failure is one `ConfigError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_FILE_BYTES", "MAX_KEY_PARTS", "ConfigError", "read_toml"]

# A config file is a few hundred bytes; the cap keeps a wrong path (a log, an image) from being
# read whole into memory.
CONFIG_FILE_BYTES = 1 << 20
# The most dotted parts a key may have (`a.b.c` has three).
MAX_KEY_PARTS = 32


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and every bad key."""


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML table the file at `path` holds; `ConfigError` naming the problem otherwise."""
    try:
        raw = _read_file(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config file not found") from exc
    except PermissionError as exc:
        raise ConfigError(f"{path}: config file is not readable (permission denied)") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from exc
    except ConfigError:
        raise
    except ValueError as exc:  # a NUL in the path itself, quoted so that the message shows it
        raise ConfigError(f"{str(path)!r}: cannot read config file: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: not UTF-8 ({exc.reason})") from exc
    _check_key_parts(path, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: invalid TOML: arrays or tables nested too deeply") from exc
    except ValueError as exc:  # the parser's own limits, such as an integer of thousands of digits
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    return data


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def _check_regular(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: is {_file_kind(info.st_mode)}, not a regular file")
    if info.st_size > CONFIG_FILE_BYTES:
        raise ConfigError(
            f"{path}: config file is {info.st_size} bytes,"
            f" over the cap of {CONFIG_FILE_BYTES} bytes (1 MiB)"
        )


def _read_file(path: Path) -> bytes:
    # The stat refuses a device or a pipe before anything opens it (opening some devices acts);
    # the fstat of what was opened covers a path swapped in between; O_NONBLOCK keeps that open
    # from waiting for a FIFO's writer.
    _check_regular(path, os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        _check_regular(path, os.fstat(fd))
        chunks: list[bytes] = []
        left = CONFIG_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > CONFIG_FILE_BYTES:
        raise ConfigError(
            f"{path}: config file is over the cap of {CONFIG_FILE_BYTES} bytes (1 MiB)"
        )
    return data


# A key at a line's start, in a table's header or after an inline table's `{` or `,`, with more
# than MAX_KEY_PARTS dotted parts (bare, "basic" or 'literal' ones).
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_LONG_KEY = re.compile(
    r"(?:^|[{,])[ \t]*\[*[ \t]*(?:" + _KEY_PART + r"[ \t]*\.[ \t]*){" + str(MAX_KEY_PARTS) + "}",
    re.MULTILINE,
)


def _check_key_parts(path: Path, text: str) -> None:
    found = _LONG_KEY.search(text)
    if found is not None:
        line = text.count("\n", 0, found.start()) + 1  # the match starts on its key's line
        raise ConfigError(
            f"{path}: invalid TOML: line {line}: a key of more than {MAX_KEY_PARTS} dotted parts"
        )
