"""Command-line checking: the brief's defaults, the flags, and one clear line for anything unusable."""

import os
from pathlib import Path

import pytest

from adapters.proxy.__main__ import main
from adapters.proxy.options import MAX_SOCKET_PATH_BYTES, Address, ProxyLimits, UsageError, parse_args


def test_the_defaults_are_the_briefs_limits(tmp_path: Path) -> None:
    settings = parse_args(["--listen", str(tmp_path / "infer.sock"), "--upstream", "straylight:11434"])
    assert settings.listen == str(tmp_path / "infer.sock")
    assert settings.upstream == Address("straylight", 11434)
    assert settings.limits == ProxyLimits(max_conns=8, burst=10, rate=2.0, first_byte_timeout=10.0)


def test_flags_change_the_limits(tmp_path: Path) -> None:
    settings = parse_args(
        [
            "--listen",
            str(tmp_path / "s"),
            "--upstream",
            "127.0.0.1:80",
            "--max-conns",
            "3",
            "--burst",
            "50",
            "--rate",
            "0.5",
            "--first-byte-timeout",
            "2.5",
        ]
    )
    assert settings.limits == ProxyLimits(max_conns=3, burst=50, rate=0.5, first_byte_timeout=2.5)


def test_an_ipv6_upstream_in_brackets_is_accepted(tmp_path: Path) -> None:
    settings = parse_args(["--listen", str(tmp_path / "s"), "--upstream", "[::1]:8080"])
    assert settings.upstream == Address("::1", 8080)
    assert str(settings.upstream) == "[::1]:8080"


def test_a_relative_socket_path_in_the_current_folder_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_args(["--listen", "infer.sock", "--upstream", "h:1"]).listen == "infer.sock"


def test_a_socket_path_of_the_longest_allowed_length_is_accepted(tmp_path: Path) -> None:
    path = _path_of_length(tmp_path, MAX_SOCKET_PATH_BYTES)
    assert parse_args(["--listen", path, "--upstream", "h:1"]).listen == path


def _path_of_length(folder: Path, size: int) -> str:
    prefix = str(folder) + os.sep
    return prefix + "s" * (size - len(os.fsencode(prefix)))


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--upstream", "h:1"], "--listen"),
        (["--listen", "{dir}/s"], "--upstream"),
        (["--listen", "{dir}/s", "--upstream", "straylight"], "HOST:PORT"),
        (["--listen", "{dir}/s", "--upstream", ":11434"], "HOST:PORT"),
        (["--listen", "{dir}/s", "--upstream", "h:"], "port must be a number"),
        (["--listen", "{dir}/s", "--upstream", "h:http"], "port must be a number"),
        (["--listen", "{dir}/s", "--upstream", "h:0"], "between 1 and 65535"),
        (["--listen", "{dir}/s", "--upstream", "h:65536"], "between 1 and 65535"),
        (["--listen", "{dir}/s", "--upstream", "h:-1"], "port must be a number"),
        (["--listen", "{dir}/s", "--upstream", "::1:80"], "brackets"),
        (["--listen", "{dir}/s", "--upstream", "[]:80"], "empty host"),
        (["--listen", "{dir}/s", "--upstream", "[::1]"], "needs a port after the IPv6 host"),
        (["--listen", "{dir}/s", "--upstream", "[::1]8080"], "a colon goes between the IPv6 host and its port"),
        (["--listen", "{dir}/s", "--upstream", "a..b:80"], "host 'a..b' is not a host name (label empty or too long)"),
        (["--listen", "{dir}/s", "--upstream", "x" * 64 + ":80"], "is not a host name (label too long)"),
        (
            ["--listen", "{dir}/s", "--upstream", "bad\nhost:80"],
            "host 'bad\\nhost' holds a space or a control character",
        ),
        (["--listen", "{dir}/s", "--upstream", " :80"], "host ' ' holds a space or a control character"),
        (["--listen", "{dir}/s", "--upstream", "a\x1b[31m:80"], "holds a space or a control character"),
        (["--listen", "{dir}/a\nb.sock", "--upstream", "h:1"], "b.sock' holds a control character"),
        (["--listen", "{dir}/no/such/folder/s", "--upstream", "h:1"], "does not exist"),
        (["--listen", "{dir}/file/s", "--upstream", "h:1"], "is not a folder"),
        (["--listen", "", "--upstream", "h:1"], "--listen"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--max-conns", "0"], "--max-conns must be at least 1"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--burst", "ten"], "--burst must be a whole number"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--rate", "0"], "--rate must be a number above 0"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--rate", "nan"], "--rate must be a number above 0"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--rate", "fast"], "--rate must be a number"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--first-byte-timeout", "0"], "--first-byte-timeout must be"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--first-byte-timeout", "-1"], "must be a number above 0"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--first-byte-timeout", "inf"], "must be a number above 0"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--first-byte-timeout", "soon"], "must be a number, got"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--config", "x.toml"], "unrecognized arguments"),
        (["--list", "{dir}/s", "--upstream", "h:1"], "--listen"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--max-conns", "1025"], "--max-conns must be at most 1024"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--max-conns", "9" * 20], "--max-conns must be at most 1024"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--burst", "1000001"], "--burst must be at most 1000000"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--rate", "1e-300"], "--rate must be from 0.001 to 1000000"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--rate", "2e6"], "--rate must be from 0.001 to 1000000"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--first-byte-timeout", "0.001"], "from 0.01 to 86400"),
        (["--listen", "{dir}/s", "--upstream", "h:1", "--first-byte-timeout", "86401"], "from 0.01 to 86400"),
    ],
)
def test_unusable_arguments_raise_one_line_naming_the_problem(tmp_path: Path, argv: list[str], names: str) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UsageError) as caught:
        parse_args([arg.replace("{dir}", str(tmp_path)) for arg in argv])
    message = str(caught.value)
    assert names in message
    assert "\n" not in message


@pytest.mark.parametrize(("ending", "said"), [("/", "a slash"), ("/.", "'.'"), ("/..", "'..'"), ("/s/", "a slash")])
def test_a_socket_path_whose_last_part_names_a_folder_is_refused_naming_the_path(
    tmp_path: Path, ending: str, said: str
) -> None:
    (tmp_path / "s").mkdir()
    path = f"{tmp_path}{ending}"
    with pytest.raises(UsageError) as caught:
        parse_args(["--listen", path, "--upstream", "h:1"])
    assert str(caught.value) == f"--listen must end in the socket file's name, and {path} ends in {said}"


@pytest.mark.parametrize("path", [".", "..", "/"])
def test_a_socket_path_that_is_only_a_folder_is_refused(path: str) -> None:
    with pytest.raises(UsageError, match="must end in the socket file's name"):
        parse_args(["--listen", path, "--upstream", "h:1"])


def test_a_socket_path_one_byte_too_long_for_af_unix_is_refused(tmp_path: Path) -> None:
    path = _path_of_length(tmp_path, MAX_SOCKET_PATH_BYTES + 1)
    with pytest.raises(UsageError, match=f"{MAX_SOCKET_PATH_BYTES + 1} bytes; AF_UNIX allows at most"):
        parse_args(["--listen", path, "--upstream", "h:1"])


# `capfd`, not `capsys`: main writes its lines to descriptor 2 itself, never through sys.stderr.


def test_main_prints_one_line_and_exits_2_on_bad_arguments(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    status = main(["--listen", str(tmp_path / "s"), "--upstream", "h:99999"])
    out, err = capfd.readouterr()
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("inferproxy: error: ") and "65535" in err
    assert not (tmp_path / "s").exists()


def test_main_exits_1_and_says_why_when_the_path_is_a_regular_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "infer.sock"
    path.write_bytes(b"keep me")
    status = main(["--listen", str(path), "--upstream", "127.0.0.1:1"])
    err = capfd.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and "is a regular file, not a socket" in err
    assert path.read_bytes() == b"keep me"


def test_the_flags_take_their_bounds(tmp_path: Path) -> None:
    argv = ["--listen", str(tmp_path / "s"), "--upstream", "h:1", "--max-conns", "1024", "--burst", "1000000"]
    settings = parse_args([*argv, "--rate", "0.001", "--first-byte-timeout", "86400"])
    assert settings.limits == ProxyLimits(max_conns=1024, burst=1_000_000, rate=0.001, first_byte_timeout=86400.0)


def test_the_help_names_version_and_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse_args(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--version" in text
    assert "Exit status: 0 after SIGTERM, SIGHUP or SIGINT; 2 for unusable arguments; 1 when the socket file" in text


@pytest.mark.parametrize(("most", "said"), [(1, "at most 1 connection, "), (8, "at most 8 connections, ")])
def test_the_start_line_counts_connections_in_words(most: int, said: str) -> None:
    assert str(ProxyLimits(max_conns=most)).startswith(said)
