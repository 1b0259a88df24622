"""A fake server in a process of its own, serving one raw response for every chat POST, so that
its threads never hold the test process's GIL (the loop-timing tests need that).

    with served_raw(tmp_path, raw_bytes, "--piece-bytes", "65536") as socket_path: ...
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def served_raw(folder: Path, raw: bytes, *options: str) -> Iterator[str]:
    """`python -m adapters.fake_server` on a socket in `folder`, replaying `raw` (head and body as
    written) with its command-line `options`; the socket's path until the block ends."""
    transcript = folder / "response.raw"
    transcript.write_bytes(raw)
    path = str(folder / "llama.sock")
    command = [sys.executable, "-m", "adapters.fake_server", "--socket", path, "--transcript", str(transcript)]
    proc = subprocess.Popen([*command, *options], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving"), line
        yield path
    finally:
        proc.terminate()
        proc.wait(5.0)
        if proc.stdout is not None:
            proc.stdout.close()
