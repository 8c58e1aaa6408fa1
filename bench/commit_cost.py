"""The cost of one uncontended manifest commit next to one raw conditional PUT.

Both run in the same process against the same server, interleaved, so the ratio is fair:

    python bench/commit_cost.py --backend seaweedfs --rounds 300 --runs 3
    python -m bench --only commit_cost

A commit here is ``agent.renew(claim)`` on a warm cache: build and encode the shard, one PUT
with ``If-Match``. The peer is ``put_object(IfMatch=...)`` of a body of the same size. The
benchmark is run ``--runs`` times (fresh task each) and the ratio reported is the median of
the runs' median ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from bench.common import Bench, bench_context, fmt, ms, new_prefix, pct, say


def one_run(b: Bench, rounds: int, entries: int) -> dict[str, Any]:
    store = b.store(new_prefix("commit"))
    task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
    task.declare_many([(f"file/{i:05d}", "s") for i in range(entries)])
    agent = task.agent("bench")
    claim = agent.claim(stage="s")
    assert claim is not None
    shard = task.layout.shard_of("s", claim.file_id)
    body = task.codec(shard).encode(task.read_shard(shard))
    client = store.client
    key = store.full_key("raw/object.json")
    etag = client.put_object(Bucket=b.bucket, Key=key, Body=body)["ETag"]

    ops: Counter[str] = Counter()

    def count(model: object, **_: object) -> None:
        ops[getattr(model, "name", "?")] += 1

    commit_s, raw_s = [], []
    for _ in range(5):  # warm both paths
        agent.renew(claim)
        etag = client.put_object(Bucket=b.bucket, Key=key, Body=body, IfMatch=etag)["ETag"]
    client.meta.events.register("before-call.s3", count)
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            agent.renew(claim)
            t1 = time.perf_counter()
            etag = client.put_object(Bucket=b.bucket, Key=key, Body=body, IfMatch=etag)["ETag"]
            t2 = time.perf_counter()
            commit_s.append(t1 - t0)
            raw_s.append(t2 - t1)
    finally:
        client.meta.events.unregister("before-call.s3", count)
    commit_med, raw_med = statistics.median(commit_s), statistics.median(raw_s)
    return {
        "rounds": rounds,
        "shard_entries": entries,
        "shard_bytes": len(body),
        "commit_median_ms": ms(commit_med),
        "commit_p90_ms": ms(pct(commit_s, 90)),
        "raw_median_ms": ms(raw_med),
        "raw_p90_ms": ms(pct(raw_s, 90)),
        "ratio": round(commit_med / raw_med, 3),
        "requests": dict(ops),
    }


def run(b: Bench, rounds: int = 300, runs: int = 3, entries: int = 100) -> dict[str, Any]:
    results = []
    for i in range(runs):
        r = one_run(b, rounds, entries)
        results.append(r)
        say(
            f"commit cost run {i + 1}: commit {r['commit_median_ms']:.2f} ms, raw "
            f"{r['raw_median_ms']:.2f} ms, ratio {r['ratio']:.3f}, requests {r['requests']}"
        )
    return {"runs": results, "ratio_median": statistics.median(r["ratio"] for r in results)}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| run | shard bytes | manifest commit median ms (p90) | raw conditional PUT median ms "
        "(p90) | ratio (median) | requests |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for i, r in enumerate(result["runs"], 1):
        reqs = ", ".join(f"{n} {k}" for k, n in sorted(r["requests"].items()))
        lines.append(
            f"| {i} | {r['shard_bytes']} | {fmt(r['commit_median_ms'])} "
            f"({fmt(r['commit_p90_ms'])}) | {fmt(r['raw_median_ms'])} ({fmt(r['raw_p90_ms'])}) "
            f"| {fmt(r['ratio'])} | {reqs} |"
        )
    lines.append(f"| **median of runs** | | | | **{fmt(result['ratio_median'])}** | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    parser.add_argument("--endpoint-url", default=None, help="any S3 (default: start one)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--entries", type=int, default=100, help="entries in the shard")
    args = parser.parse_args()
    with bench_context(args.backend, args.endpoint_url) as b:
        result = run(b, args.rounds, args.runs, args.entries)
    print(f"backend={b.backend} rounds={args.rounds} runs={args.runs} entries={args.entries}")
    print(table(result))


if __name__ == "__main__":
    main()
