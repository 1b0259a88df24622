"""`inferproxy --listen PATH --upstream HOST:PORT [--max-conns N] [--burst N] [--rate PER_SECOND]
[--first-byte-timeout SECONDS]`.

Exit status: 0 after SIGTERM, SIGHUP or SIGINT (all three stop it the same way), 2 for unusable
arguments, 1 when the socket file cannot be set up (its lock is held by another inferproxy, or
the path is taken). Every failure is one line on stderr. Stderr is written without blocking
(`StderrLog`): a reader that has stopped reading costs lines, never the service or the stop. A
failure to start waits up to a second for its one line to go out; a stop does not wait.

`inferproxy --version` prints `inferproxy VERSION` and exits 0 before anything else is read.
"""

import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapters.proxy.stderr_log import StderrLog

# SIGHUP too: the default would kill the process and leave the socket file behind.
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
_FAILURE_LINE_WAIT_S = 1.0
_DISTRIBUTION = "inferpath"


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--version" in args:
        # Like argparse's version action (and --help): answer, then exit 0 whatever else is given.
        print(f"inferproxy {version()}")
        raise SystemExit(0)
    # Held from the first step, before the rest of the proxy is loaded: a stop signal that comes
    # while it starts is handled as one that comes later (exit 0), never by its default (killed,
    # or a traceback for SIGINT).
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        from adapters.proxy.stderr_log import StderrLog

        log = StderrLog()
        try:
            return _run(args, log)
        finally:
            log.close()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def version() -> str:
    """The installed distribution's version; "0+unknown" if it is not installed."""
    # Imported here, not at the top: importlib.metadata would add about 25 ms to every start.
    from importlib import metadata

    try:
        return metadata.version(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _run(argv: Sequence[str], log: "StderrLog") -> int:
    """Start and serve, the stop signals held until their handlers are in place (so a SIGTERM
    during start-up still removes the socket file)."""
    from adapters.proxy.options import UsageError, parse_args
    from adapters.proxy.server import Proxy
    from adapters.proxy.socket_file import SocketFileError, bind_socket_file

    try:
        settings = parse_args(argv)
    except UsageError as exc:
        log(f"error: {exc}")
        log.finish(_FAILURE_LINE_WAIT_S)
        return 2
    try:
        try:
            bound = bind_socket_file(settings.listen)
        except SocketFileError as exc:
            log(f"error: {exc}")
            log.finish(_FAILURE_LINE_WAIT_S)
            return 1
        proxy = Proxy(bound, settings.upstream, settings.limits, log=log)

        def on_signal(_signum: int, _frame: FrameType | None) -> None:
            proxy.stop()

        for signum in _STOP_SIGNALS:
            signal.signal(signum, on_signal)
        log(proxy.start_line)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    proxy.serve()
    log.finish(0)  # whatever the reader takes now; a stop never waits for a reader
    return 0


if __name__ == "__main__":
    sys.exit(main())
