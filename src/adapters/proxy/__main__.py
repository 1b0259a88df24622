"""`inferproxy --listen PATH --upstream HOST:PORT [--max-conns N] [--burst N] [--rate PER_SECOND]`.

Exit status: 0 after SIGTERM or SIGINT, 2 for unusable arguments, 1 when the socket file cannot
be set up. Every failure is one line on stderr.
"""

import signal
import sys
from collections.abc import Sequence
from types import FrameType

from adapters.proxy.options import UsageError, parse_args
from adapters.proxy.server import Proxy, log_to_stderr
from adapters.proxy.socket_file import SocketFileError, bind_socket_file

_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        log_to_stderr(f"error: {exc}")
        return 2
    # Hold the stop signals until their handlers are in place, so a SIGTERM during start-up
    # still removes the socket file.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        try:
            bound = bind_socket_file(settings.listen)
        except SocketFileError as exc:
            log_to_stderr(f"error: {exc}")
            return 1
        proxy = Proxy(bound, settings.upstream, settings.limits)

        def on_signal(_signum: int, _frame: FrameType | None) -> None:
            proxy.stop()

        for signum in _STOP_SIGNALS:
            signal.signal(signum, on_signal)
        log_to_stderr(proxy.start_line)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    proxy.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
