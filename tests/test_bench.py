"""The benchmark suite runs end to end: ``python -m bench --quick`` on a moto server (made
smaller still), in three groups of benchmarks that run side by side, each then rendered by
``python -m bench.report``. Nothing here is timed: the figures belong to BENCHMARKS.md,
this only checks that every benchmark ran and reported its peer or limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.heavy

GROUPS = {
    "requests-commit-size-checksums-transfer": (
        "requests",
        "commit_cost",
        "size",
        "checksums",
        "transfer",
    ),
    "contention-threads": ("contention", "threads"),
    "batching-aio": ("batching", "aio"),
}
"""Every benchmark in one group, the groups about as long as each other."""


def check_requests(results: dict[str, Any]) -> None:
    assert results["requests"]["limit"] == 3
    assert results["requests"]["phases"][0]["entries"] == 40


def check_commit_cost(results: dict[str, Any]) -> None:
    assert len(results["commit_cost"]["runs"]) == 3


def check_size(results: dict[str, Any]) -> None:
    assert {p["entries"] for p in results["size"]["points"]} == {1000, 2000}
    for p in results["size"]["points"]:  # the codec's encoding beside pydantic's whole one
        assert p["encode_ms"] > 0 and p["encode_whole_ms"] > 0, p


def check_checksums(results: dict[str, Any]) -> None:
    assert set(results["checksums"]["gib_per_s"]) == {"memory read", "xxh3-128", "SHA-256"}


def check_contention(results: dict[str, Any]) -> None:
    contention = results["contention"]["points"]
    assert {p["delay_ms"] for p in contention} == {0, 5}
    for p in contention:
        assert p["entries"] > 0 and p["errors"] == {}, p
        if p["agents"] == 1:
            assert p["speedup"] == 1.0


def check_threads(results: dict[str, Any]) -> None:
    assert [p["threads"] for p in results["threads"]["points"]] == [1, 8, 32]


def check_batching(results: dict[str, Any]) -> None:
    batches = results["batching"]["points"]
    assert (batches[0]["batch"], batches[0]["vs_per_entry"]) == (1, 1.0)
    assert {p["batch"] for p in batches} == {1, 10, 100}


def check_transfer(results: dict[str, Any]) -> None:
    assert results["transfer"]["upload"]["ratio"] > 0


def check_aio(results: dict[str, Any]) -> None:
    aio = results["aio"]["points"]
    assert {(p["delay_ms"], p["workers"]) for p in aio} == {(d, w) for d in (0, 5) for w in (8, 32)}
    assert all(p["ratio"] > 0 for p in aio), aio


CHECKS = {name: globals()[f"check_{name}"] for names in GROUPS.values() for name in names}

HEADINGS = {
    "requests": "### 1. Requests per entry",
    "commit_cost": "### 2. Commit cost",
    "contention": "### 3. Contention",
    "threads": "### 3b. Threads",
    "batching": "### 4. Batching",
    "size": "### 5. Size",
    "checksums": "### 6a. Checksums",
    "transfer": "### 6b. Transfer",
    "aio": "### 7. asyncio",
}
"""The report's heading of each benchmark."""


def test_the_groups_hold_every_benchmark_once() -> None:
    """The benchmarks ``python -m bench`` names when asked for one it does not have."""
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "no-such-benchmark"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    named = run.stderr.strip().rsplit("choose from ", 1)[1].split(", ")
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(named) == sorted(HEADINGS)


@pytest.mark.parametrize("group", list(GROUPS))
def test_the_quick_suite_runs_every_benchmark_and_renders_its_report(
    tmp_path: Path, group: str
) -> None:
    names = GROUPS[group]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out = tmp_path / "results"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--only",
            ",".join(names),
            "--backend",
            "moto",
            "--agents",
            "1,2",
            "--delays",
            "0,5",
            "--duration",
            "0.5",
            "--sizes",
            "1000,2000",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads((out / "latest-quick.json").read_text())
    assert {name for name in HEADINGS if name in results} == set(names)
    for name in names:  # each measured its peer or limit beside itself
        CHECKS[name](results)

    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n\nhand-written text\n")
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.report",
            str(out / "latest-quick.json"),
            "--md",
            str(md),
            "--charts",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stderr[-4000:]
    text = md.read_text()
    assert "hand-written text" in text and "### Goals" in text
    for name, heading in HEADINGS.items():
        assert (heading in text) == (name in names), heading
    # A second render replaces the block instead of adding another.
    subprocess.run(report.args, cwd=ROOT, capture_output=True, timeout=300, check=True)
    assert md.read_text().count("### Goals") == 1
