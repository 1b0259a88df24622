"""`--upstream` given as a URL: the one line says it takes HOST:PORT, not a URL, and shows the
HOST:PORT the URL holds when it holds one."""

from pathlib import Path

import pytest

from adapters.proxy.options import UsageError, parse_args


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        (
            "http://127.0.0.1:8181",
            "--upstream takes HOST:PORT, not a URL, as 127.0.0.1:8181, got 'http://127.0.0.1:8181'",
        ),
        (
            "http://127.0.0.1:11434/v1",
            "--upstream takes HOST:PORT, not a URL, as 127.0.0.1:11434, got 'http://127.0.0.1:11434/v1'",
        ),
        ("http://[::1]:8080", "--upstream takes HOST:PORT, not a URL, as [::1]:8080, got 'http://[::1]:8080'"),
        # No port in the URL: nothing to suggest, the scheme's default port is not guessed.
        ("http://straylight", "--upstream takes HOST:PORT, not a URL, got 'http://straylight'"),
        ("unix:///run/x.sock", "--upstream takes HOST:PORT, not a URL, got 'unix:///run/x.sock'"),
    ],
)
def test_a_url_upstream_is_refused_saying_it_takes_host_port_not_a_url(
    tmp_path: Path, upstream: str, message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_args(["--listen", str(tmp_path / "s"), "--upstream", upstream])
    assert str(caught.value) == message
