"""`python -m adapters.fake_server`: every unusable argument, and a socket it cannot listen on, is
one line naming the problem and exit status 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.fake_server.__main__ import main

TRANSCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts" / "plain_answer"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--delay-ms", "-5"], "--delay-ms must be a finite number of 0 or more, got -5"),
        (["--delay-ms", "inf"], "--delay-ms must be a finite number of 0 or more, got inf"),
        (["--slots", "-1"], "--slots must be from 1 to 4096, got -1"),
        (["--slots", "0"], "--slots must be from 1 to 4096, got 0"),
        (["--piece-bytes", "0"], "--piece-bytes must be positive"),
    ],
)
def test_an_unusable_argument_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--socket", str(tmp_path / "s.sock"), "--transcript", str(TRANSCRIPT), *extra])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"error: {message}")


def test_a_socket_it_cannot_listen_on_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "no" / "such" / "folder" / "s.sock"
    assert main(["--socket", str(path), "--transcript", str(TRANSCRIPT)]) == 2
    err = capsys.readouterr().err
    assert err == f"cannot listen on {path}: No such file or directory\n"
