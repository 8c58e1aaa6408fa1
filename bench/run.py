"""Run objmanifest's benchmark suite and write its results as JSON.

    python -m bench                                  # the whole suite on a local SeaweedFS
    python -m bench --quick                          # every benchmark, small (a few minutes)
    python -m bench --only contention,batching       # some of them
    python -m bench --endpoint-url http://host:9000  # any S3 (credentials from the env)
    python -m bench.report                           # BENCHMARKS.md tables and charts

Benchmarks: requests (requests per produced and consumed entry, counted at a proxy),
commit_cost (a commit vs a raw conditional PUT), contention (1..16 agent processes, three
layouts, one hot stage and four busy ones, bare and behind 25 and 60 ms proxies), threads
(1..32 threads of one process on one shard, 25 ms), batching (claim_many/put_many of 1, 10,
100), size (commit latency at 1k/10k/100k entries), checksums (xxh3, SHA-256, memory read),
transfer (a large file vs boto3's s3transfer), aio (coroutines of ``objmanifest.aio`` vs
threads on the same work). Each compares itself with its peer or limit
measured in the same run and prints the ratios; ``bench/results/latest.json`` (and a dated
copy) hold everything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    aio_bench,
    batching,
    checksums,
    commit_cost,
    contention,
    request_count,
    task_size,
    transfer_bench,
)
from bench.agents import Pool
from bench.common import BUCKET, ROOT, Bench, bench_context, layout_support, machine, say

NAMES = (
    "requests",
    "commit_cost",
    "contention",
    "threads",
    "batching",
    "size",
    "checksums",
    "transfer",
    "aio",
)

FULL: dict[str, Any] = {
    "requests": {"entries": 200, "batch": 100},
    "commit_cost": {"rounds": 300, "runs": 3},
    "contention": {"agents": [1, 2, 4, 8, 16], "delays": [0, 25, 60], "duration": 4.0},
    "threads": {"threads": [1, 2, 4, 8, 16, 32], "delay_ms": 25, "duration": 4.0},
    "batching": {"delays": [0, 25], "batches": [1, 10, 100], "entries": 1000, "duration": 4.0},
    "size": {"sizes": [1_000, 10_000, 100_000], "rounds": 9},
    "checksums": {"mib": 256},
    "transfer": {"size_mib": 512, "rounds": 2, "settle_s": 2.0},
    "aio": {"workers": [8, 32], "delays": [0, 25], "entries": 600},
}

QUICK: dict[str, Any] = {
    "requests": {"entries": 40, "batch": 20},
    "commit_cost": {"rounds": 40, "runs": 3},
    "contention": {"agents": [1, 4, 16], "delays": [0, 25], "duration": 1.5},
    "threads": {"threads": [1, 8, 32], "delay_ms": 25, "duration": 1.5},
    "batching": {"delays": [25], "batches": [1, 10, 100], "entries": 400, "duration": 1.5},
    "size": {"sizes": [1_000, 10_000], "rounds": 5},
    "checksums": {"mib": 32},
    "transfer": {"size_mib": 48, "rounds": 1, "settle_s": 0.2},
    "aio": {"workers": [8, 32], "delays": [25], "entries": 120},
}


def _size(b: Bench, pool: Pool, sizes: list[int], rounds: int) -> dict[str, Any]:
    return task_size.run(b, sizes=sizes, rounds=rounds)


RUNNERS: dict[str, Callable[[Bench, Pool, dict[str, Any]], dict[str, Any]]] = {
    "requests": lambda b, pool, o: request_count.run(b, **o),
    "commit_cost": lambda b, pool, o: commit_cost.run(b, **o),
    "contention": lambda b, pool, o: contention.run(b, pool, **o),
    "threads": lambda b, pool, o: contention.run_threads(b, pool, **o),
    "batching": lambda b, pool, o: batching.run(b, pool, **o),
    "size": lambda b, pool, o: _size(b, pool, **o),
    "checksums": lambda b, pool, o: checksums.run(**o),
    "transfer": lambda b, pool, o: transfer_bench.run(b.endpoint_url, {**b.env}, **o),
    "aio": lambda b, pool, o: aio_bench.run(b, **o),
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="every benchmark, small and short")
    parser.add_argument("--only", default="", help=f"comma-separated, of: {', '.join(NAMES)}")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    parser.add_argument("--endpoint-url", default=None, help="any S3 instead of a local server")
    parser.add_argument("--bucket", default=BUCKET)
    parser.add_argument("--agents", type=_ints, default=None, help="contention: e.g. 1,2,4,8,16")
    parser.add_argument("--delays", type=_ints, default=None, help="added ms, e.g. 0,25,60")
    parser.add_argument("--duration", type=float, default=None, help="seconds per point")
    parser.add_argument("--sizes", type=_ints, default=None, help="size: e.g. 1000,10000,100000")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)

    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(NAMES)
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = [n for n in [*chosen, *skip] if n not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(NAMES)}")
    chosen = [n for n in chosen if n not in skip]
    plan = json.loads(json.dumps(QUICK if args.quick else FULL))
    for name in ("contention", "batching", "aio"):
        if args.delays is not None:
            plan[name]["delays"] = args.delays
    if args.agents is not None:
        plan["contention"]["agents"] = args.agents
    if args.sizes is not None:
        plan["size"]["sizes"] = args.sizes
    if args.duration is not None:
        for name in ("contention", "threads", "batching"):
            plan[name]["duration"] = args.duration

    results: dict[str, Any] = {
        "suite": "quick" if args.quick else "full",
        "machine": machine(),
        "features": layout_support(),
        "plan": {n: plan[n] for n in chosen},
        "seconds": {},
    }
    started = time.monotonic()
    with bench_context(args.backend, args.endpoint_url, args.bucket, args.quick) as b:
        results["backend"] = b.backend
        results["endpoint"] = args.endpoint_url or f"local {b.backend}"
        if not b.can_delay():
            for name in ("contention", "batching", "aio"):
                plan[name]["delays"] = [0]
            chosen = [n for n in chosen if n != "threads"]
            say("the endpoint is not plain HTTP: no latency proxies, bare runs only")
        pool = Pool()
        try:
            for name in chosen:
                t0 = time.monotonic()
                say(f"== {name} {plan[name]}")
                results[name] = RUNNERS[name](b, pool, plan[name])
                results["seconds"][name] = round(time.monotonic() - t0, 1)
        finally:
            pool.close()
    results["seconds"]["total"] = round(time.monotonic() - started, 1)
    results["machine"]["load_average_after"] = list(os.getloadavg())

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"{stamp}-{results['suite']}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    latest = args.out / ("latest.json" if not args.quick else "latest-quick.json")
    shutil.copyfile(path, latest)
    say(f"results: {path} (and {latest}); {results['seconds']['total']:.0f} s in all")

    from bench import report

    print(report.goals_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
