"""Per-file mutation score from mutmut's results in ./mutants/ (`make mutation` runs it).

mutmut 3 keeps one `<source>.py.meta` JSON file per mutated source under `mutants/`, holding the
exit code of every mutant's test run; it reports per mutant. This prints one row per file:
killed / total and the percentage, with the survivors and the mutants no test reached counted
apart. A mutant counts as killed when a test failed on it, it timed out, or the type checker
refused it (`type_check_command`: those are also counted in the `mypy` column); one not checked
yet counts against the score.

    python scripts/mutation_report.py [--mutants DIR] [--min PERCENT] [--survivors]

`--min` exits with status 1 if a file scores below PERCENT; `--survivors` lists them by name.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# mutmut 3's exit codes (mutmut.stats.status_by_exit_code); anything else is "suspicious".
_STATUS: dict[int | None, str] = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    2: "interrupted",
    34: "skipped",
    35: "suspicious",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "type check",
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}
_KILLED = frozenset({"killed", "timeout", "type check"})


def status(exit_code: int | None) -> str:
    return _STATUS.get(exit_code, "suspicious")


@dataclass(frozen=True)
class FileScore:
    path: str
    counts: Counter[str]
    survivors: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def killed(self) -> int:
        return sum(n for s, n in self.counts.items() if s in _KILLED)

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def read_scores(mutants: Path) -> list[FileScore]:
    scores = []
    for meta in sorted(mutants.rglob("*.py.meta")):
        exit_codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        if not exit_codes:
            continue  # a file with nothing to mutate (an empty __init__.py)
        counts = Counter(status(code) for code in exit_codes.values())
        survivors = tuple(sorted(n for n, code in exit_codes.items() if status(code) not in {*_KILLED, "not checked"}))
        scores.append(FileScore(str(meta.relative_to(mutants))[: -len(".meta")], counts, survivors))
    return scores


def table(scores: list[FileScore]) -> str:
    width = max([len("file"), *(len(s.path) for s in scores)])
    head = (
        f"{'file':<{width}}  {'killed':>6} / {'total':<5} {'score':>6}  {'mypy':>5}"
        f"  {'survived':>8}  {'no tests':>8}  {'not run':>7}  {'other':>5}"
    )
    lines = [head, "-" * len(head)]
    for s in [*scores, _sum(scores)]:
        if s.path == "all":
            lines.append("-" * len(head))
        survived, no_tests, not_run = s.counts["survived"], s.counts["no tests"], s.counts["not checked"]
        other = s.total - s.killed - survived - no_tests - not_run
        lines.append(
            f"{s.path:<{width}}  {s.killed:>6} / {s.total:<5} {s.percent:>5.1f}%  {s.counts['type check']:>5}"
            f"  {survived:>8}  {no_tests:>8}  {not_run:>7}  {other:>5}"
        )
    return "\n".join(lines)


def _sum(scores: list[FileScore]) -> FileScore:
    total: Counter[str] = Counter()
    for s in scores:
        total.update(s.counts)
    return FileScore("all", total, ())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"), help="mutmut's working tree")
    parser.add_argument("--min", type=float, default=None, help="fail if a file scores below this percentage")
    parser.add_argument("--survivors", action="store_true", help="list the mutants not killed")
    args = parser.parse_args(argv)
    scores = read_scores(args.mutants)
    if not scores:
        print(f"no mutmut results under {args.mutants}/: run `mutmut run` first", file=sys.stderr)
        return 1
    print(table(scores))
    if args.survivors:
        for s in scores:
            for name in s.survivors:
                print(f"  {name}")
    below = [s.path for s in scores if args.min is not None and s.percent < args.min]
    if below:
        print(f"below {args.min:.0f}%: {', '.join(below)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
