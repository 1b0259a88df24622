"""A `CancelToken` cancelled from a signal handler wakes the blocking waits it can interrupt: the
retry wait (`SystemClock.sleep`) and a connect's wait for a place in a full accept backlog. The
handler runs in the thread it interrupted, so a wait whose wake-up lock is not re-entrant would
hang that thread for good. Each runs in a child process, its own SIGALRM firing every 50 µs, with
a watchdog that kills the child if it hangs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

PRELUDE = """
import faulthandler, signal, sys, time
sys.path[:0] = [{src!r}, {tests!r}]
from domain.cancel import CancelToken
faulthandler.dump_traceback_later(15, exit=True)
state = {{"token": CancelToken(), "fired": 0}}
def handler(*_):
    state["fired"] += 1
    state["token"].cancel()
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
"""

SLEEPS = """
from adapters.system import SystemClock
clock = SystemClock()
started, rounds = time.monotonic(), 0
while time.monotonic() - started < 0.5:
    state["token"] = CancelToken()
    clock.sleep(0.0002, state["token"])
    rounds += 1
"""

CONNECTS = """
import os, tempfile
from adapters.uds_http.sockets import SocketStream
from backlog import full_backlog
from domain.errors import ConnectError
path = os.path.join(tempfile.mkdtemp(), "full.sock")
listener, fillers = full_backlog(path)
started, rounds = time.monotonic(), 0
while time.monotonic() - started < 0.5:
    state["token"] = CancelToken()
    try:
        SocketStream.connect(path, 0.002, state["token"])
    except ConnectError:
        pass
    rounds += 1
"""


@pytest.mark.parametrize("waits", [SLEEPS, CONNECTS], ids=["retry wait", "backlog wait"])
def test_a_cancel_from_a_signal_handler_never_hangs_the_wait_it_interrupts(waits: str) -> None:
    code = (
        PRELUDE.format(src=str(SRC), tests=str(SRC.parent / "tests"))
        + waits
        + """
signal.setitimer(signal.ITIMER_REAL, 0)
print(rounds, state["fired"])
"""
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    rounds, fired = map(int, done.stdout.split())
    assert rounds > 100 and fired > 100, "the handler cancelled many waits"
