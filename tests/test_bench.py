"""The benchmark suite runs end to end: ``python -m bench --quick`` on a moto server (made
smaller still), then ``python -m bench.report`` renders its tables. Nothing here is timed:
the figures belong to BENCHMARKS.md, this only checks that every benchmark ran and
reported its peer or limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.heavy


def test_the_quick_suite_runs_every_benchmark_and_renders_its_report(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out = tmp_path / "results"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
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
    for name in (
        "requests",
        "commit_cost",
        "contention",
        "threads",
        "batching",
        "size",
        "checksums",
        "transfer",
        "aio",
    ):
        assert name in results, f"{name} did not report"

    # Each benchmark measured its peer or limit beside itself.
    assert results["requests"]["limit"] == 3
    assert results["requests"]["phases"][0]["entries"] == 40
    assert len(results["commit_cost"]["runs"]) == 3
    contention = results["contention"]["points"]
    assert {p["delay_ms"] for p in contention} == {0, 5}
    for p in contention:
        assert p["entries"] > 0 and p["errors"] == {}, p
        if p["agents"] == 1:
            assert p["speedup"] == 1.0
    assert [p["threads"] for p in results["threads"]["points"]] == [1, 8, 32]
    batches = results["batching"]["points"]
    assert (batches[0]["batch"], batches[0]["vs_per_entry"]) == (1, 1.0)
    assert {p["batch"] for p in batches} == {1, 10, 100}
    assert {p["entries"] for p in results["size"]["points"]} == {1000, 2000}
    for p in results["size"]["points"]:  # the codec's encoding beside pydantic's whole one
        assert p["encode_ms"] > 0 and p["encode_whole_ms"] > 0, p
    assert set(results["checksums"]["gib_per_s"]) == {"memory read", "xxh3-128", "SHA-256"}
    assert results["transfer"]["upload"]["ratio"] > 0
    aio = results["aio"]["points"]
    assert {(p["delay_ms"], p["workers"]) for p in aio} == {(d, w) for d in (0, 5) for w in (8, 32)}
    assert all(p["ratio"] > 0 for p in aio), aio

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
    assert "hand-written text" in text
    assert "### Goals" in text and "### 3. Contention" in text and "### 5. Size" in text
    assert "### 7. asyncio" in text
    # A second render replaces the block instead of adding another.
    subprocess.run(report.args, cwd=ROOT, capture_output=True, timeout=300, check=True)
    assert md.read_text().count("### Goals") == 1
