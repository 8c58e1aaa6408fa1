"""The cost of one uncontended manifest commit next to one raw conditional PUT.

All run in the same process against the same server, interleaved, so the ratio is fair:

    python bench/commit_cost.py --backend seaweedfs --rounds 300 --runs 3
    python -m bench --only commit_cost

A commit here is ``agent.renew(claim)`` on a warm cache: build and encode the shard, one PUT
with ``If-Match`` (and its ``Content-MD5``). The peer is ``put_object(IfMatch=...)`` of the
very bytes that commit wrote (same size, same content type, the journal records the shard
carries counted on both sides); a second peer adds the ``Content-MD5`` header (computed each
time), which shows what the digest itself costs. Odd rounds put the raw PUTs first, so
neither side always follows the other. Each run is on a fresh task; the ratio reported is
the median of the runs' ratios (median commit over median raw PUT), and a paired ratio too
(1 + the median of each round's commit minus its raw PUT, over the median raw PUT: the two
of one round ran back to back under the same load, so it shakes less on a busy machine).
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
from objmanifest.core import checksum
from tests.support.internals import engine


def one_run(b: Bench, rounds: int, entries: int) -> dict[str, Any]:
    store = b.store(new_prefix("commit"))
    task = om.Task.create(store, "bench", stages=["s"], lease_seconds=600)
    task.declare_many([(f"file/{i:05d}", "s") for i in range(entries)])
    agent = task.agent("bench")
    claim = agent.claim(stage="s")
    assert claim is not None
    key, codec = engine(task).layout.shard(claim.shard), engine(task).codec(claim.shard)

    def written() -> bytes:
        """The body of the version the last commit wrote (encoded again, untimed)."""
        return codec.encode(engine(task).docs.cached(key, codec))

    client, bucket = store.client, store.bucket
    raw_key = store.full_key("raw/object.json")
    etag = client.put_object(Bucket=bucket, Key=raw_key, Body=written())["ETag"]

    def raw_put(body: bytes, etag: str, md5: bool = False) -> str:
        extra = {"ContentMD5": checksum.content_md5(body)} if md5 else {}
        return str(
            client.put_object(
                Bucket=bucket,
                Key=raw_key,
                Body=body,
                IfMatch=etag,
                ContentType="application/json",
                **extra,
            )["ETag"]
        )

    for _ in range(5):  # warm every path
        agent.renew(claim)
        etag = raw_put(written(), etag)
        etag = raw_put(written(), etag, md5=True)

    ops: Counter[str] = Counter()

    def count(model: object, **_: object) -> None:
        ops[getattr(model, "name", "?")] += 1

    commit_s, raw_s, md5_s, sizes = [], [], [], []
    client.meta.events.register("before-call.s3", count)
    try:
        for n in range(rounds):
            if n % 2:  # the raw PUTs first, of the last commit's bytes
                body = written()
                t0 = time.perf_counter()
                etag = raw_put(body, etag)
                t1 = time.perf_counter()
                etag = raw_put(body, etag, md5=True)
                t2 = time.perf_counter()
                agent.renew(claim)
                t3 = time.perf_counter()
                raw, md5, commit = t1 - t0, t2 - t1, t3 - t2
            else:
                t0 = time.perf_counter()
                agent.renew(claim)
                t1 = time.perf_counter()
                body = written()
                t2 = time.perf_counter()
                etag = raw_put(body, etag)
                t3 = time.perf_counter()
                etag = raw_put(body, etag, md5=True)
                t4 = time.perf_counter()
                commit, raw, md5 = t1 - t0, t3 - t2, t4 - t3
            commit_s.append(commit)
            raw_s.append(raw)
            md5_s.append(md5)
            sizes.append(len(body))
    finally:
        client.meta.events.unregister("before-call.s3", count)
    task.flush_journal()
    commit_med, raw_med, md5_med = (statistics.median(x) for x in (commit_s, raw_s, md5_s))
    extra = statistics.median(c - r for c, r in zip(commit_s, raw_s, strict=True))
    return {
        "rounds": rounds,
        "shard_entries": entries,
        "shard_bytes": [min(sizes), max(sizes)],
        "commit_median_ms": ms(commit_med),
        "commit_p90_ms": ms(pct(commit_s, 90)),
        "raw_median_ms": ms(raw_med),
        "raw_p90_ms": ms(pct(raw_s, 90)),
        "raw_md5_median_ms": ms(md5_med),
        "ratio": round(commit_med / raw_med, 3),
        "paired_ratio": round(1 + extra / raw_med, 3),
        "ratio_vs_md5": round(commit_med / md5_med, 3),
        "requests": dict(ops),
    }


def run(b: Bench, rounds: int = 300, runs: int = 3, entries: int = 100) -> dict[str, Any]:
    results = []
    for i in range(runs):
        r = one_run(b, rounds, entries)
        results.append(r)
        say(
            f"commit cost run {i + 1}: commit {r['commit_median_ms']:.2f} ms, raw "
            f"{r['raw_median_ms']:.2f} ms (with Content-MD5 {r['raw_md5_median_ms']:.2f}), "
            f"ratio {r['ratio']:.3f}, paired {r['paired_ratio']:.3f}, requests {r['requests']}"
        )
    return {
        "runs": results,
        "ratio_median": statistics.median(r["ratio"] for r in results),
        "paired_median": statistics.median(r["paired_ratio"] for r in results),
        "vs_md5_median": statistics.median(r["ratio_vs_md5"] for r in results),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| run | shard bytes | manifest commit median ms (p90) | raw conditional PUT median ms "
        "(p90) | raw PUT with Content-MD5 median ms | commit / raw | paired | "
        "commit / raw with MD5 | requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, r in enumerate(result["runs"], 1):
        reqs = ", ".join(f"{n} {k}" for k, n in sorted(r["requests"].items()))
        low, high = r["shard_bytes"]
        lines.append(
            f"| {i} | {low}-{high} | {fmt(r['commit_median_ms'])} ({fmt(r['commit_p90_ms'])}) "
            f"| {fmt(r['raw_median_ms'])} ({fmt(r['raw_p90_ms'])}) | "
            f"{fmt(r['raw_md5_median_ms'])} | {fmt(r['ratio'])} | {fmt(r['paired_ratio'])} | "
            f"{fmt(r['ratio_vs_md5'])} | {reqs} |"
        )
    lines.append(
        f"| **median of runs** | | | | | **{fmt(result['ratio_median'])}** | "
        f"**{fmt(result['paired_median'])}** | **{fmt(result['vs_md5_median'])}** | |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    parser.add_argument("--endpoint-url", default=None, help="any S3 (default: start one)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3, help="runs, each on a fresh task")
    parser.add_argument("--entries", type=int, default=100, help="entries in the shard")
    args = parser.parse_args()
    with bench_context(args.backend, args.endpoint_url) as b:
        result = run(b, args.rounds, args.runs, args.entries)
    print(f"backend={b.backend} rounds={args.rounds} runs={args.runs} entries={args.entries}")
    print(table(result))


if __name__ == "__main__":
    main()
