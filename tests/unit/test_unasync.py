"""The blocking flavour is the asyncio source with `async`, `await` and the `Async` prefix taken
out, and nothing else: `scripts/unasync.py` writes it, and its `--check` (run by `make lint`)
fails on a generated file that is stale or was edited by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


unasync = load()


@pytest.mark.parametrize(
    ("source", "twin"),
    [
        ("    async def read(self, timeout: float) -> bytes:", "    def read(self, timeout: float) -> bytes:"),
        ("        data = await self._recv(left)", "        data = self._recv(left)"),
        ("        async with contextlib.nullcontext(steps):", "        with contextlib.nullcontext(steps):"),
        ("            async for step in steps:", "            for step in steps:"),
        ("class AsyncHttpExchange:", "class HttpExchange:"),
        ("    async def __aenter__(self) -> AsyncClient:", "    def __enter__(self) -> Client:"),
        ("from app._async.fetch import fetch", "from app._sync.fetch import fetch"),
        ("-> AsyncGenerator[Step, None]:", "-> Generator[Step, None, None]:"),
        ("await self.aclose()", "self.close()"),
        ("the asyncio source under `_async/`", "the asyncio source under `_async/`"),
    ],
)
def test_each_line_loses_only_its_asyncio_spelling(source: str, twin: str) -> None:
    assert unasync.unasync_line(source) == twin


def test_every_generated_file_in_the_tree_is_current() -> None:
    assert unasync.main(["--check"]) == 0


def test_a_hand_edited_or_missing_twin_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source_dir = tmp_path / "pkg" / "_async"
    source_dir.mkdir(parents=True)
    (source_dir / "mod.py").write_text("async def f() -> None:\n    await g()\n")
    monkeypatch.setattr(unasync, "ROOT", tmp_path)
    monkeypatch.setattr(unasync, "FOLDERS", ("pkg/_async",))
    monkeypatch.setattr(unasync, "unused_rules", lambda used: [])  # a tree of one module uses few rules

    assert unasync.main(["--check"]) == 1  # missing
    assert unasync.main([]) == 0
    twin = tmp_path / "pkg" / "_sync" / "mod.py"
    assert twin.read_text() == (
        "# Generated from pkg/_async/mod.py by scripts/unasync.py: do not edit.\ndef f() -> None:\n    g()\n"
    )
    assert unasync.main(["--check"]) == 0
    twin.write_text(twin.read_text() + "x = 1\n")
    assert unasync.main(["--check"]) == 1  # edited by hand
    (tmp_path / "pkg" / "_sync" / "stray.py").write_text("")
    unasync.main([])
    assert not (tmp_path / "pkg" / "_sync" / "stray.py").exists(), "a twin without a source is removed"


def test_a_rule_that_matches_nothing_in_any_source_fails_both_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = (*unasync.SUBSTITUTIONS, (r"\bNoSuchNameAnywhere\b", "X"))
    monkeypatch.setattr(unasync, "SUBSTITUTIONS", rules)
    monkeypatch.setattr(unasync, "COMPILED", tuple((unasync.re.compile(p), r) for p, r in rules))

    assert unasync.main(["--check"]) == 1


def test_every_rule_of_the_table_matches_a_source_today() -> None:
    used: set[int] = set()
    unasync.targets(used)
    assert unasync.unused_rules(used) == []
