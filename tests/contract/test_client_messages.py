"""Errors that say what to do: a server down behind its proxy, a socket path that is a file, and
how long the retries may still wait."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from adapters.fake_server import End, FakeServer, Raw
from app.container import Container
from client_support import CHAT, REQ, Kind, config_for
from domain.errors import ConnectError, StreamClosedEarly

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

DOWN = "the server behind the socket is down or restarting"


@pytest.mark.parametrize("end", [End.CLOSE, End.RESET], ids=["closed", "reset"])
def test_a_connection_closed_before_any_byte_says_the_server_is_down_or_restarting(
    server: FakeServer, end: End, client_kind: Kind
) -> None:
    # What a proxy does when its upstream is unreachable: accept, then close at once.
    server.route(*CHAT, Raw((), end))

    with pytest.raises(StreamClosedEarly, match=DOWN):
        client_kind.client_for(server).chat(REQ, lambda event: None)


def test_a_socket_path_that_is_a_regular_file_says_so(tmp_path: Path, client_kind: Kind) -> None:
    path = tmp_path / "infer.sock"
    path.write_text("not a socket")

    with pytest.raises(ConnectError, match="is a regular file, not a socket"):
        client_kind.client_of(Container(config=config_for(str(path)))).chat(REQ, lambda event: None)


def test_a_retry_says_how_long_the_retries_may_still_wait(
    server: FakeServer, caplog: pytest.LogCaptureFixture, client_kind: Kind
) -> None:
    server.route(*CHAT, Raw((), End.CLOSE))

    with caplog.at_level(logging.WARNING, logger="inferpath.client"), pytest.raises(StreamClosedEarly):
        client_kind.client_for(server).chat_with_retry(REQ, lambda event: None)

    # Waits of 50, 80 and 120 ms without jitter: 250 ms in all from the first wait, then 200, 120.
    lines = [r.getMessage() for r in caplog.records]
    assert [line.rsplit("(", 1)[1] for line in lines] == [
        "attempt 2 of 4; at most 250 ms of waits left)",
        "attempt 3 of 4; at most 200 ms of waits left)",
        "attempt 4 of 4; at most 120 ms of waits left)",
    ]
    assert all(DOWN in line for line in lines)
