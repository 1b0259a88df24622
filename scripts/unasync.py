"""Write the blocking twin of every asyncio source module, or check that it is current.

The call is written once, for asyncio, under `_async/` folders; the blocking flavour under the
sibling `_sync/` folder is derived from it by the substitutions below and nothing else, so the
two can never drift. Every primitive the source uses comes in name-paired flavours with the same
signature (`AsyncSocketStream` / `SocketStream`, `AsyncCalls` / `Calls`, ...), so dropping the
`Async` prefix, `async` and `await` is the whole translation.

    python scripts/unasync.py          # rewrite the generated files
    python scripts/unasync.py --check  # exit 1 if a generated file is stale, edited or missing

A rule that matches nothing in any source is an error too (both modes): a rule left behind
after the code it translated is gone hides what the translation really is.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("src/app/_async", "src/adapters/uds_http/_async")

SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    (r"\bAsyncGenerator\[(.+?), None\]", r"Generator[\1, None, None]"),
    (r"\bAwaitable\[(\w+)\]", r"\1"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\._async\b", "._sync"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
)
COMPILED = tuple((re.compile(pattern), replacement) for pattern, replacement in SUBSTITUTIONS)


def unasync_line(line: str, used: set[int] | None = None) -> str:
    for index, (pattern, replacement) in enumerate(COMPILED):
        line, count = pattern.subn(replacement, line)
        if count and used is not None:
            used.add(index)
    return line


def generated(source: Path, used: set[int] | None = None) -> str:
    text = source.read_text(encoding="utf-8")
    header = f"# Generated from {source.relative_to(ROOT)} by scripts/unasync.py: do not edit.\n"
    return header + "".join(unasync_line(line, used) for line in text.splitlines(keepends=True))


def targets(used: set[int] | None = None) -> dict[Path, str]:
    """Every generated file and the text it must hold; the rules that matched go into `used`."""
    out: dict[Path, str] = {}
    for folder in FOLDERS:
        source_dir = ROOT / folder
        target_dir = source_dir.with_name("_sync")
        for source in sorted(source_dir.glob("*.py")):
            out[target_dir / source.name] = generated(source, used)
    return out


def unused_rules(used: set[int]) -> list[str]:
    return [SUBSTITUTIONS[index][0] for index in range(len(SUBSTITUTIONS)) if index not in used]


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: unasync.py [--check]", file=sys.stderr)
        return 2
    used: set[int] = set()
    wanted = targets(used)
    unused = unused_rules(used)
    for pattern in unused:
        print(f"scripts/unasync.py: the rule {pattern!r} matches nothing in any source; remove it", file=sys.stderr)
    if unused:
        return 1
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text(encoding="utf-8") != text]
    extra = [
        path
        for folder in FOLDERS
        for path in sorted((ROOT / folder).with_name("_sync").glob("*.py"))
        if path not in wanted
    ]
    if check:
        for path in stale:
            print(f"{path.relative_to(ROOT)}: stale or edited by hand; run `python scripts/unasync.py`")
        for path in extra:
            print(f"{path.relative_to(ROOT)}: has no source under _async/")
        return 1 if stale or extra else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    for path in extra:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
