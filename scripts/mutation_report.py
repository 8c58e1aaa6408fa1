"""Summarise a mutmut run (``mutants/``) per module, and check every surviving mutant
against the equivalent mutants explained in docs/mutation.md.

Prints a table (module, mutants, killed, equivalent, survived, score) and the diff of every
survivor that is not explained there; exits 1 if there is one, or if a mutant was not run.

An equivalent mutant is written in docs/mutation.md as a ```diff block whose first line is
``# module.function: why it cannot change behaviour``, followed by the lines of the diff that
identify it (a context line or two, the ``-`` and ``+`` lines). A survivor matches when it is
a mutant of that function and its diff contains those lines in that order (indentation
ignored), so renumbered mutants and unrelated edits do not matter.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mutmut.configuration import config
from mutmut.mutation.data import SourceFileMutationData
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files

DOC = Path("docs/mutation.md")
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
"""Outcomes where the tests noticed the mutant (a hang or crash is noticed too)."""


@dataclass(frozen=True)
class Equivalent:
    function: str  # "objmanifest.changes.renew", "objmanifest.leases.Renewer.stop"
    reason: str
    lines: tuple[tuple[str, str], ...]  # (" " | "-" | "+", text without indentation)


def normalise(lines: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for line in lines:
        if line.startswith(("---", "+++", "@@")) or not line:
            continue
        out.append((line[0], line[1:].strip()))
    return tuple(out)


def load_equivalents() -> list[Equivalent]:
    found = []
    for block in re.findall(r"^```diff\n(.*?)^```", DOC.read_text(), flags=re.S | re.M):
        head, *rest = block.rstrip("\n").split("\n")
        m = re.match(r"# ([\w.]+): (.+)", head)
        if not m:
            sys.exit(f"{DOC}: a diff block must start with '# module.function: reason': {head}")
        found.append(Equivalent(m[1], m[2], normalise(rest)))
    return found


def function_of(mutant: str) -> str:
    """``objmanifest.changes.x_renew__mutmut_13`` -> ``objmanifest.changes.renew``;
    ``objmanifest.leases.xǁRenewerǁstop__mutmut_2`` -> ``objmanifest.leases.Renewer.stop``."""
    module, _, name = mutant.rpartition(".")
    name = re.sub(r"__mutmut_\d+$", "", name)
    name = name[2:] if name.startswith("x_") else name[1:].replace("ǁ", ".").lstrip(".")
    return f"{module}.{name}"


def diff_of(mutant: str, path: Path) -> str:
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant

        return get_diff_for_mutant(mutant, path=path)
    except ImportError:  # a mutmut that moved it: ask its command line
        out = subprocess.run(["mutmut", "show", mutant], capture_output=True, text=True)
        return out.stdout


def contains(haystack: tuple[tuple[str, str], ...], needle: tuple[tuple[str, str], ...]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def main() -> int:
    equivalents = load_equivalents()
    used: set[Equivalent] = set()
    rows = []
    unexplained = []
    for path in sorted(walk_mutatable_files()):
        data = SourceFileMutationData(path=path)
        data.load()
        counts: Counter[str] = Counter()
        for mutant, code in data.exit_code_by_key.items():
            status = status_by_exit_code[code]
            if status in KILLED:
                counts["killed"] += 1
                continue
            diff = diff_of(mutant, path)
            lines = normalise(diff.split("\n"))
            match = next(
                (
                    e
                    for e in equivalents
                    if e.function == function_of(mutant) and contains(lines, e.lines)
                ),
                None,
            )
            if status == "survived" and match is not None:
                counts["equivalent"] += 1
                used.add(match)
            else:
                counts["survived"] += 1
                unexplained.append(f"{mutant}: {status}\n{diff}")
        total = len(data.exit_code_by_key)
        real = total - counts["equivalent"]
        score = f"{100 * counts['killed'] / real:.1f}%" if real else "-"
        module = str(path).removesuffix(".py").replace("/", ".")
        rows.append(
            (module, total, counts["killed"], counts["equivalent"], counts["survived"], score)
        )

    header = ("module", "mutants", "killed", "equivalent", "survived", "score")
    totals = [sum(r[i] for r in rows) for i in range(1, 5)]
    real = totals[0] - totals[2]
    rows.append(("total", *totals, f"{100 * totals[1] / real:.1f}%" if real else "-"))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))))  # fmt: skip
    print("score = killed / (mutants - equivalent); equivalent mutants: " + str(DOC))

    stale = [e for e in equivalents if e not in used]
    if stale:
        print(f"\n{len(stale)} equivalent mutant(s) in {DOC} no longer occur (remove them):")
        for e in stale:
            print(f"  {e.function}: {e.reason}")
    if unexplained:
        print(f"\n{len(unexplained)} mutant(s) survived unexplained. For each, add a unit test")
        print(f"that kills it, or explain in {DOC} why it cannot change behaviour:\n")
        print("\n\n".join(unexplained))
        return 1
    return 0


if __name__ == "__main__":
    assert config().only_mutate, "run from the repository root, where pyproject.toml is"
    sys.exit(main())
