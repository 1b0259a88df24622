"""The startup self-test: the three checks of the brief, section 5.

1. The server is the one the config describes (`/props` against `[expect]`).
2. Tool calls parse (one tool, a fixed prompt, a parsed call with valid JSON arguments).
3. Turn 2 hits the cache (a two-turn exchange replaying turn 1's reasoning, with one short
   request on another slot between the turns when the server has more than one).

The checks and the fixed text they send are in `app.selftest_checks`; this module runs them,
prints their lines and is the command.

`python -m app.selftest --config PATH` prints one line per check, each starting `ok` or `FAIL`,
then a summary line, and exits 0 only if all three pass (1 if a check fails, 2 if it could not
run at all: a bad config, a missing `[expect]`, a client that cannot be built).
`--print-expect` runs no check: it prints the `[expect]` block that matches the live server's
`/props` (exit 0), or one `FAIL` line on stderr (exit 1; 2 for a config it cannot use).

Invariants:
- Every failure is one `FAIL` line, never a traceback: a check that raises anything (an
  `InferError`, a `RequestError`, a bug) fails with the error's type and message, and the next
  check still runs. Only `KeyboardInterrupt` and other `BaseException`s that are not `Exception`s
  go through. After a `ConnectError`, `LoadTimeout` or `StreamClosedEarly` the later checks are
  "not run".
- The cache check can fail: turn 1 is long (fixed house rules as the system prompt), and a turn 1
  that left no more than twice the loss limit in the slot fails the check outright, because a
  turn 2 that reused half of it, or nothing, could still pass as a hit.
- The cache check catches a server that empties pinned slots: on a server of more than one slot a
  short request on another slot runs between the turns, and a cache loss after it names the likely
  cause (a unified KV cache) and the flags that avoid it (`-np N --no-kv-unified`). A failure of
  that request is the cache check's `FAIL` line, naming the step; on one slot the step is skipped
  and the line says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.client import Client
from app.config import Config, ConfigError, load_config
from app.container import Container
from app.selftest_checks import (
    MAX_TOKENS,
    CheckResult,
    Target,
    check_cache,
    check_props,
    check_tool_call,
    describe_error,
    one_line,
)
from domain.errors import ConnectError, LoadTimeout, StreamClosedEarly
from domain.llama_api import Props


@dataclass
class Report:
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return len(self.results) == 3 and all(r.ok for r in self.results)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)


CHECKS: list[tuple[str, Callable[[Target], CheckResult]]] = [
    ("props", check_props),
    ("tool call", check_tool_call),
    ("cache", check_cache),
]


def run(config: Config, client: Client, emit: Callable[[str], None] = print) -> Report:
    """Run the three checks in order; a check that raises is a failure naming the error."""
    if config.expect is None:
        raise ConfigError(
            "the self-test needs an [expect] section (chat_template_sha256, n_ctx, total_slots)"
        )
    report = Report()
    started = time.monotonic()
    unreachable: str | None = None
    target = Target(client, config)
    for name, check in CHECKS:
        if unreachable is not None:
            result = CheckResult(name, False, f"not run: {unreachable}")
        else:
            try:
                result = check(target)
            except Exception as exc:  # every failure is a FAIL line, never a traceback
                result = CheckResult(name, False, describe_error(exc))
                # Still failing after every retry: the server is not serving (a proxy in front of
                # a stopped server closes each connection before any byte), so the next checks
                # would only wait out the same retries.
                if isinstance(exc, ConnectError | LoadTimeout | StreamClosedEarly):
                    cut = isinstance(
                        exc, StreamClosedEarly
                    )  # it answered, or a proxy did, and closed
                    how = "cuts its connections short" if cut else "is unreachable"
                    unreachable = f"the server {how} ({type(exc).__name__})"
        report.results.append(result)
        emit(f"{'ok  ' if result.ok else 'FAIL'} {result.name}: {one_line(result.detail)}")
    report.seconds = time.monotonic() - started
    passed = sum(r.ok for r in report.results)
    emit(
        f"{'ok  ' if report.ok else 'FAIL'} selftest:"
        f" {passed}/3 checks passed in {report.seconds:.1f} s, {report.tokens} tokens"
    )
    return report


def selftest_config(config: Config) -> Config:
    """The config the checks run with: the same server and limits, answers capped at MAX_TOKENS."""
    limits = config.limits.model_copy(
        update={"max_tokens": min(config.limits.max_tokens, MAX_TOKENS)}
    )
    return config.model_copy(update={"limits": limits})


def _say(line: str) -> None:
    print(line, flush=True)


def _say_error(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def expect_toml(props: Props) -> str:
    """The `[expect]` block the props check passes against the server that answered `props`."""
    return (
        "[expect]\n"
        f'chat_template_sha256 = "{props.chat_template_sha256}"\n'
        f"n_ctx = {props.n_ctx}\n"
        f"total_slots = {props.total_slots}\n"
    )


def print_expect(client: Client, config_path: str | None = None) -> int:
    """Print `expect_toml` of the live server on stdout (exit 0); a failure is one `FAIL` line on
    stderr (exit 1), so stdout can be appended to a config file as it is: after a line break first
    if the file at `config_path` does not end with one (the block would join its last line)."""
    try:
        props = client.props(load=True)
    except Exception as exc:  # one line, never a traceback
        _say_error(f"FAIL props: {one_line(describe_error(exc))}")
        return 1
    sys.stdout.write(
        ("\n" if config_path is not None and _ends_mid_line(config_path) else "")
        + expect_toml(props)
    )
    sys.stdout.flush()
    return 0


def _ends_mid_line(path: str) -> bool:
    """Whether the file's last byte is there and is not a line break."""
    try:
        with open(path, "rb") as handle:
            if handle.seek(0, os.SEEK_END) == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    from app import __version__

    parser = argparse.ArgumentParser(prog="loopd-selftest", description="The three startup checks.")
    # `--version` answers (exit 0) while the arguments are read, before `--config` is found missing.
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", required=True, help="path to config.toml")
    parser.add_argument(
        "--print-expect",
        action="store_true",
        help=(
            "print the [expect] block that matches the live server, run no check"
            " ([expect] not needed)"
        ),
    )
    args = parser.parse_args(argv)
    say = _say_error if args.print_expect else _say
    try:
        config = load_config(args.config)
        if config.expect is None and not args.print_expect:
            raise ConfigError(
                f"{args.config}: the self-test needs an [expect] section"
                " (chat_template_sha256, n_ctx, total_slots)"
            )
    except ConfigError as exc:
        say(f"FAIL config: {one_line(str(exc))}")
        return 2
    except Exception as exc:  # could not run: exit 2 with a FAIL line, not a traceback
        say(f"FAIL config: {one_line(describe_error(exc))}")
        return 2
    try:
        client = Container(config=selftest_config(config)).client()
    except Exception as exc:
        say(f"FAIL setup: cannot build the client: {one_line(describe_error(exc))}")
        return 2
    if args.print_expect:
        return print_expect(client, args.config)
    report = run(config, client, _say)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
