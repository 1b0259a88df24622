"""`python -m app.selftest --print-expect --config PATH` against the scripted fake server: it prints
the `[expect]` block of the live server's `/props` and nothing else, a block with which the
self-test's props check passes; a server that cannot answer is one `FAIL` line on stderr."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from adapters.fake_server import FakeServer, json_reply
from app import selftest
from app.config import parse_config
from app.container import Container
from app.selftest_checks import Target, check_props
from client_support import PROPS

pytestmark = pytest.mark.timeout(10)

TEMPLATE = "{%- for message in messages %}{{ message.content }}{% endfor %}"
TEMPLATE_SHA = hashlib.sha256(TEMPLATE.encode("utf-8")).hexdigest()
PROPS_ANSWER = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2, "chat_template": TEMPLATE}


def config_file(tmp_path: Path, socket_path: str) -> Path:
    # No [expect]: finding it is what --print-expect is for.
    path = tmp_path / "config.toml"
    path.write_text(f'socket = "{socket_path}"\n[limits]\npoll_ms = 100\nload_wait_ms = 150\n')
    return path


def test_print_expect_prints_the_expect_block_of_the_live_server_and_exits_0(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.route(*PROPS, json_reply(PROPS_ANSWER))

    code = selftest.main(["--print-expect", "--config", str(config_file(tmp_path, server.socket_path))])

    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""
    assert out == f'[expect]\nchat_template_sha256 = "{TEMPLATE_SHA}"\nn_ctx = 4096\ntotal_slots = 2\n'


@pytest.mark.parametrize("ending", ["", "\n"])
def test_the_block_appended_to_a_config_with_or_without_a_last_line_break_loads(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], ending: str
) -> None:
    server.route(*PROPS, json_reply(PROPS_ANSWER))
    path = tmp_path / "config.toml"
    path.write_text(f'socket = "{server.socket_path}"{ending}', newline="")
    assert selftest.main(["--print-expect", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\n[expect]\n") == (ending == "")
    with path.open("a") as handle:
        handle.write(out)

    config = parse_config(tomllib.loads(path.read_text()))
    assert config.expect is not None and config.expect.total_slots == 2


def test_the_printed_block_appended_to_the_config_passes_the_props_check(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.route(*PROPS, json_reply(PROPS_ANSWER))
    path = config_file(tmp_path, server.socket_path)
    assert selftest.main(["--print-expect", "--config", str(path)]) == 0
    with path.open("a") as handle:
        handle.write(capsys.readouterr().out)

    config = parse_config(tomllib.loads(path.read_text()))
    result = check_props(Target(Container(config=config).client(), config))

    assert result.ok, result.detail
    assert config.expect is not None and config.expect.total_slots == 2


def test_print_expect_without_a_server_is_one_fail_line_on_stderr_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nobody.sock"

    code = selftest.main(["--print-expect", "--config", str(config_file(tmp_path, str(missing)))])

    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.startswith("FAIL props: ConnectError: ") and str(missing) in err
    assert err.count("\n") == 1


def test_print_expect_with_a_config_it_cannot_use_exits_2_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = selftest.main(["--print-expect", "--config", str(tmp_path / "none.toml")])

    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == f"FAIL config: {tmp_path / 'none.toml'}: config file not found\n"


def test_version_still_answers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        selftest.main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.startswith("loopd-selftest ")
