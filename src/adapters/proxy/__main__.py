"""`inferproxy --listen PATH --upstream HOST:PORT [--max-conns N] [--burst N] [--rate PER_SECOND]`.

Exit status: 0 after SIGTERM or SIGINT, 2 for unusable arguments, 1 when the socket file cannot
be set up (its lock is held by another inferproxy, or the path is taken). Every failure is one
line on stderr. Stderr is written without blocking (`StderrLog`): a reader that has stopped
reading costs lines, never the service or the stop. A failure to start waits up to a second for
its one line to go out; a stop does not wait.
"""

import signal
import sys
from collections.abc import Sequence
from types import FrameType

from adapters.proxy.options import UsageError, parse_args
from adapters.proxy.server import Proxy
from adapters.proxy.socket_file import SocketFileError, bind_socket_file
from adapters.proxy.stderr_log import StderrLog

_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_FAILURE_LINE_WAIT_S = 1.0


def main(argv: Sequence[str] | None = None) -> int:
    log = StderrLog()
    try:
        return _run(sys.argv[1:] if argv is None else argv, log)
    finally:
        log.close()


def _run(argv: Sequence[str], log: StderrLog) -> int:
    try:
        settings = parse_args(argv)
    except UsageError as exc:
        log(f"error: {exc}")
        log.finish(_FAILURE_LINE_WAIT_S)
        return 2
    # Hold the stop signals until their handlers are in place, so a SIGTERM during start-up
    # still removes the socket file.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
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
