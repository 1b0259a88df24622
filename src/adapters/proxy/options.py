"""Command-line options for `inferproxy`, checked up front so a bad start fails in one clear line.

`parse_args` raises `UsageError` with a one-line message for anything it cannot use: a missing
flag, an upstream without a port, a port out of range, a socket path too long for `AF_UNIX` or
that ends in a folder's name (a slash, `.`, `..`), a parent folder that does not exist, a limit
below its minimum (a rate or a first-byte timeout that is not a number above 0).
"""

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

from adapters.proxy.socket_file import folder_ending

# sun_path holds 108 bytes on Linux; one is kept for the NUL that C clients write after the path.
MAX_SOCKET_PATH_BYTES = 107
# The flags' bounds: past them a value is a typo, not a setting. Each connection holds two threads
# and nine descriptors (counted: 1024 need a descriptor limit near 10,000); a rate under one accept
# in 1,000 s never refills; a first-byte limit under 10 ms closes clients that have not sent at
# once, one over a day holds a place for ever.
MAX_CONNS = 1024
MAX_BURST = 1_000_000
RATE_RANGE = (0.001, 1_000_000.0)
FIRST_BYTE_RANGE = (0.01, 86_400.0)


class UsageError(Exception):
    """The command line cannot be used; the message is one line naming what is wrong."""


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ProxyLimits:
    max_conns: int = 8
    burst: int = 10
    rate: float = 2.0
    first_byte_timeout: float = 10.0  # seconds from accept; then a silent client is closed

    def __str__(self) -> str:
        return (
            f"at most {self.max_conns} connection{'' if self.max_conns == 1 else 's'},"
            f" accept burst {self.burst},"
            f" refill {self.rate:g}/s,"
            f" first byte within {self.first_byte_timeout:g} s"
        )


@dataclass(frozen=True)
class Settings:
    listen: str
    upstream: Address
    limits: ProxyLimits


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> _Parser:
    defaults = ProxyLimits()
    parser = _Parser(
        prog="inferproxy",
        allow_abbrev=False,
        description="Forward each connection on a Unix socket to one TCP connection upstream.",
        epilog=(
            "Exit status: 0 after SIGTERM, SIGHUP or SIGINT; 2 for unusable arguments;"
            " 1 when the socket file cannot be set up"
            " (its lock held by another inferproxy, or the path taken)."
        ),
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--listen", required=True, metavar="PATH", help="the Unix socket to create")
    parser.add_argument(
        "--upstream", required=True, metavar="HOST:PORT", help="where to forward to"
    )
    parser.add_argument(
        "--max-conns",
        default=str(defaults.max_conns),
        metavar="N",
        help=f"connections open at once (default {defaults.max_conns})",
    )
    parser.add_argument(
        "--burst",
        default=str(defaults.burst),
        metavar="N",
        help=f"connections accepted in a burst (default {defaults.burst})",
    )
    parser.add_argument(
        "--rate",
        default=f"{defaults.rate:g}",
        metavar="PER_SECOND",
        help=f"accept tokens refilled per second (default {defaults.rate:g})",
    )
    parser.add_argument(
        "--first-byte-timeout",
        default=f"{defaults.first_byte_timeout:g}",
        metavar="SECONDS",
        help=(
            "close a connection whose client has sent nothing this long after it was accepted;"
            f" once bytes flow nothing is timed (default {defaults.first_byte_timeout:g})"
        ),
    )
    return parser


def parse_args(argv: Sequence[str]) -> Settings:
    args = _parser().parse_args(list(argv))
    return Settings(
        listen=check_socket_path(args.listen),
        upstream=parse_upstream(args.upstream),
        limits=ProxyLimits(
            max_conns=_whole(args.max_conns, "--max-conns", MAX_CONNS),
            burst=_whole(args.burst, "--burst", MAX_BURST),
            rate=_within(args.rate, "--rate", *RATE_RANGE),
            first_byte_timeout=_within(
                args.first_byte_timeout, "--first-byte-timeout", *FIRST_BYTE_RANGE
            ),
        ),
    )


def parse_upstream(value: str) -> Address:
    if "://" in value:
        raise UsageError(
            f"--upstream takes HOST:PORT, not a URL{_without_scheme(value)}, got {value!r}"
        )
    if value.startswith("[") and value.endswith("]"):
        raise UsageError(
            f"--upstream needs a port after the IPv6 host, as [::1]:PORT, got {value!r}"
        )
    if value.startswith("[") and "]" in value and not value.partition("]")[2].startswith(":"):
        raise UsageError(
            "--upstream: a colon goes between the IPv6 host and its port,"
            f" as [::1]:PORT, got {value!r}"
        )
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise UsageError(f"--upstream must be HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            raise UsageError(f"--upstream has an empty host in {value!r}")
    elif ":" in host:
        raise UsageError(
            f"--upstream: write an IPv6 host in brackets, as [::1]:PORT, got {value!r}"
        )
    if not port_text.isascii() or not port_text.isdigit():
        raise UsageError(f"--upstream port must be a number, got {port_text!r} in {value!r}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise UsageError(f"--upstream port must be between 1 and 65535, got {port}")
    if any(
        char.isspace() or not char.isprintable() for char in host
    ):  # no name holds one; a log line would split
        raise UsageError(f"--upstream host {host!r} holds a space or a control character")
    try:
        host.encode("idna")  # what every connect's name lookup does first
    except UnicodeError as exc:
        raise UsageError(
            f"--upstream host {host!r} is not a host name ({_idna_reason(exc)})"
        ) from None
    return Address(host, port)


def _idna_reason(exc: UnicodeError) -> str:
    """The codec's own reason ("label empty or too long"), without its wrapping."""
    text = str(exc)
    return text.rpartition("(UnicodeError: ")[2].rstrip(")") or text


def _without_scheme(url: str) -> str:
    """ ", as 127.0.0.1:8181" when the URL holds a host and a port, else nothing."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ""
    if not parts.hostname or port is None:
        return ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f", as {host}:{port}"


def check_socket_path(path: str) -> str:
    if not path:
        raise UsageError("--listen must name a socket path")
    if not path.isprintable():
        # A newline or an escape would split or colour every log line naming it.
        raise UsageError(f"--listen path {path!r} holds a control character")
    ending = folder_ending(path)
    if ending is not None:
        raise UsageError(
            f"--listen must end in the socket file's name, and {path} ends in {ending}"
        )
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise UsageError(
            f"--listen path is {size} bytes; AF_UNIX allows at most {MAX_SOCKET_PATH_BYTES}: {path}"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        raise UsageError(f"--listen: the folder {parent} does not exist")
    if not os.path.isdir(parent):
        raise UsageError(f"--listen: {parent} is not a folder")
    return path


def _whole(text: str, flag: str, most: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag} must be a whole number, got {text!r}") from None
    if value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}")
    if value > most:
        raise UsageError(f"{flag} must be at most {most}, got {value}")
    return value


def _within(text: str, flag: str, least: float, most: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{flag} must be a number above 0, got {text!r}")
    if not least <= value <= most:
        raise UsageError(f"{flag} must be from {_plain(least)} to {_plain(most)}, got {text!r}")
    return value


def _plain(value: float) -> str:
    """A limit as the README writes it: `1000000`, `0.001`, never `1e+06`."""
    return f"{value:f}".rstrip("0").rstrip(".")
