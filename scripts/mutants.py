#!/usr/bin/env python3
"""Plant the audit's mutants, one at a time, and check that the tests kill each.

Each mutant is a small bug planted in the core by a regular-expression substitution that
must match exactly once. It is applied to a temporary copy of the tree, never to the tree
itself, and the tests named for it run there (with that copy first on ``PYTHONPATH``, so
the processes the tests start import it too). A mutant is *killed* when those tests fail,
*survived* when they pass; *anchor missing* means its pattern no longer matches the code
(adapt the pattern, the bug is still worth planting), *error* that pytest could not run.

    python3 scripts/mutants.py                 # every mutant; exit 1 unless all are killed
    python3 scripts/mutants.py --list          # the mutants, their files and tests
    python3 scripts/mutants.py finish-ignores-epoch lease-margin-zero
    python3 scripts/mutants.py --baseline      # first check the tests pass unmutated
    OBJMANIFEST_TEST_BACKENDS=moto python3 scripts/mutants.py   # one backend only

Options after ``--`` go to pytest. The interpreter is ``.venv/bin/python`` (made by
``scripts/test.sh``) unless ``--python`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".ci",
    "__pycache__",
    "*.pyc",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "*.egg-info",
    "build",
    "dist",
)


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    pattern: str
    """A regular expression (re.MULTILINE) that must match exactly once in ``path``."""
    replacement: str
    tests: tuple[str, ...]
    what: str


FENCING = "tests/test_fencing.py"
# The holder-check mutants keep the real refusal (``_held``, with its message) for what they
# still check, and let through only what they stop checking.
IN_FINISH = r"(\s+)entry = _held\(shard, claim\)\n(\s+ready = _update\()"
"""The holder check of ``changes.finish``."""
SAME_NAME_ZOMBIE = (
    f"{FENCING}::test_a_stale_epoch_is_refused_while_the_new_holder_writes",
    f"{FENCING}::test_a_holder_that_stalls_mid_put_is_fenced_when_it_comes_back",
)

MUTANTS = (
    Mutant(
        "renew-ignores-epoch",
        "objmanifest/core/changes.py",
        r"(def renew\(.*\n(?:.*\n)*?(\s+))entry = _held\(shard, claim\)\n",
        r"\1entry = _entry(shard, claim.file_id)\n"
        r"\2if entry.state is not State.writing or entry.owner != claim.agent:\n"
        r"\2    _held(shard, claim)\n",
        SAME_NAME_ZOMBIE,
        "renew checks the state and the owner, not the epoch",
    ),
    Mutant(
        "finish-ignores-epoch",
        "objmanifest/core/changes.py",
        IN_FINISH,
        r"\1entry = _entry(shard, claim.file_id)"
        r"\1if entry.state is not State.writing or entry.owner != claim.agent:"
        r"\1    _held(shard, claim)\n\2",
        SAME_NAME_ZOMBIE,
        "finish checks the state and the owner, not the epoch",
    ),
    Mutant(
        "finish-checks-only-state",
        "objmanifest/core/changes.py",
        IN_FINISH,
        r"\1entry = _entry(shard, claim.file_id)"
        r"\1if entry.state is not State.writing:"
        r"\1    _held(shard, claim)\n\2",
        (
            f"{FENCING}::test_a_stale_epoch_is_refused_while_the_new_holder_writes",
            f"{FENCING}::test_a_holder_that_stalls_mid_put_is_fenced_when_it_comes_back",
        ),
        "finish checks only that the entry is writing",
    ),
    Mutant(
        "cli-claim-takes-entry-epoch",
        "objmanifest/engine/declaring.py",
        r"(\bepoch=)epoch,",
        r"\1entry.epoch,",
        ("tests/test_cli.py::test_a_rerun_step_with_a_stale_epoch_is_fenced",),
        "the CLI rebuilds a claim with the entry's epoch instead of --epoch",
    ),
    Mutant(
        "lease-margin-zero",
        "objmanifest/core/leases.py",
        r"^MARGIN = timedelta\(seconds=2\)",
        "MARGIN = timedelta(seconds=0)",
        ("tests/test_lease_takeover.py::test_a_lease_is_taken_over_only_once_its_2s_margin_has_passed",),
        "a lease may be taken over as soon as it ends",
    ),
    Mutant(
        "cas-believes-stale-refusal",
        "objmanifest/cas/loop.py",
        r"(if stamped is None:\n\s+)if validated:",
        r"\1if validated or any(t.error is not None for t in tried):",
        ("tests/test_views.py::test_a_holder_acting_through_a_stale_view_is_not_refused",),
        "the CAS loop believes a refusal decided on a stale cached version",
    ),
    Mutant(
        "cas-believes-stale-noop",
        "objmanifest/cas/loop.py",
        r"(if stamped is None:\n\s+)if validated:",
        r"\1if validated or all(t.error is None for t in tried):",
        ("tests/test_views.py::test_reap_on_a_stale_view_releases_a_lease_it_has_not_seen",),
        "the CAS loop believes 'nothing to write' decided on a stale cached version",
    ),
    Mutant(
        "failed-dependency-is-met",
        "objmanifest/core/changes.py",
        r"not in \(State\.ready, State\.consumed\)",
        "not in (State.ready, State.consumed, State.failed)",
        ("tests/test_dependencies.py::test_a_failed_dependency_is_not_met_until_it_is_produced",),
        "a failed dependency counts as met",
    ),
    Mutant(
        "data-written-without-if-none-match",
        "objmanifest/data/transfer.py",
        r"(def _write_once\((?:.*\n)*?\s+store\.put\(key, body, )mode=CREATE, ",
        r"\1",
        (f"{FENCING}::test_a_put_repeated_after_ready_keeps_the_first_bytes",),
        "a holder's data is written without If-None-Match",
    ),
    Mutant(
        "store-clock-is-local-clock",
        "objmanifest/store/s3.py",
        r"return self\.clock\.now\(\)",
        "return datetime.now().astimezone()",
        ("tests/test_lease_takeover.py::test_leases_follow_the_store_clock_not_the_agents",),
        "Store.now() is this machine's wall clock",
    ),
    Mutant(
        "reap-keeps-dead-upload",
        "objmanifest/data/transition_effects.py",
        r"if parsed\.kind != \"shard\":",
        'if parsed.kind != "shard" or event.command == "reap":',
        (
            "tests/test_lease_takeover.py::test_reaping_a_dead_chunked_entry_aborts_its_upload",
            "tests/test_transition_effects.py::test_every_path_to_dead_aborts_the_upload",
        ),
        "reap does not abort the upload of an entry it made dead",
    ),
    Mutant(
        "takeover-keeps-dead-upload",
        "objmanifest/data/transition_effects.py",
        r"if parsed\.kind != \"shard\":",
        'if parsed.kind != "shard" or event.command.startswith("claim"):',
        ("tests/test_transition_effects.py::test_every_path_to_dead_aborts_the_upload",),
        "a takeover in claim or claim_many that makes an entry dead keeps its upload",
    ),
    Mutant(
        "lost-answer-applied-twice",
        "objmanifest/cas/loop.py",
        r"if commit_id in sent:",
        "if False:",
        ("tests/test_races.py::test_a_write_whose_response_is_lost_is_applied_exactly_once",),
        "a commit whose answer was lost is applied again instead of recognised",
    ),
)


def plant(tree: Path, mutant: Mutant) -> str | None:
    """Apply the mutant to the copy; None if its pattern does not match exactly once."""
    path = tree / mutant.path
    text = path.read_text()
    found = len(re.findall(mutant.pattern, text, flags=re.MULTILINE))
    if found != 1:
        return None
    mutated = re.sub(mutant.pattern, mutant.replacement, text, count=1, flags=re.MULTILINE)
    path.write_text(mutated)
    return mutated


def diff(original: str, mutated: str, path: str) -> str:
    import difflib

    lines = difflib.unified_diff(
        original.splitlines(keepends=True),
        mutated.splitlines(keepends=True),
        f"a/{path}",
        f"b/{path}",
        n=1,
    )
    return "".join(lines)


def run_tests(tree: Path, python: str, tests: tuple[str, ...], extra: list[str]) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *_pythonpath()])}
    where = subprocess.run(
        [python, "-c", "import objmanifest, sys; sys.stdout.write(objmanifest.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the copy's objmanifest is not the one imported ({where})")
    command = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *extra, *tests]
    return subprocess.run(command, cwd=tree, env=env).returncode


def _pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def copy_tree(into: Path) -> Path:
    tree = into / "tree"
    shutil.copytree(ROOT, tree, ignore=COPY_IGNORE)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to plant (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--baseline", action="store_true", help="run the tests unmutated first")
    parser.add_argument("--show", action="store_true", help="print each mutant's diff")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]

    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutants: {', '.join(unknown)} (see --list)")
    chosen = [by_name[n] for n in args.names] if args.names else list(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.what}\n    {m.path}")
            for t in m.tests:
                print(f"    {t}")
        return 0
    if not Path(args.python).exists():
        parser.error(f"{args.python} does not exist: run scripts/test.sh once, or pass --python")

    results: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="objmanifest-mutants-") as tmp:
        if args.baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            tree = copy_tree(Path(tmp) / "baseline")
            print(f"== baseline: {len(tests)} tests, unmutated", flush=True)
            code = run_tests(tree, args.python, tests, extra)
            if code != 0:
                print(f"== baseline failed (pytest exit {code}): fix the tests first")
                return 2
        for mutant in chosen:
            tree = copy_tree(Path(tmp) / mutant.name)
            original = (tree / mutant.path).read_text()
            mutated = plant(tree, mutant)
            print(f"\n== {mutant.name}: {mutant.what}", flush=True)
            if mutated is None:
                results.append((mutant.name, "anchor missing", 0.0))
                print(f"   its pattern does not match {mutant.path} exactly once")
                continue
            if args.show:
                print(diff(original, mutated, mutant.path), flush=True)
            start = time.monotonic()
            code = run_tests(tree, args.python, mutant.tests, extra)
            took = time.monotonic() - start
            outcome = {0: "SURVIVED", 1: "killed"}.get(code, f"error (pytest exit {code})")
            results.append((mutant.name, outcome, took))
            shutil.rmtree(tree, ignore_errors=True)

    print("\n== summary")
    width = max(len(name) for name, _, _ in results)
    for name, outcome, took in results:
        print(f"   {name:<{width}}  {outcome:<22} {took:6.1f}s")
    return 0 if all(outcome == "killed" for _, outcome, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
