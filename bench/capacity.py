"""Capacity of one hot stage on a model of a cloud store: the real ``Task``, ``Agent`` and
commit loop, only the store and the clock simulated (``bench/capacity_run.py``).

    python -m bench.capacity --profile s3-standard --agents 1000 [--partitions N|auto]
                             [--layout partitioned|stage|task] [--batch B] [--json]
    python -m bench.capacity --calibrate          # the local profile vs bench/contention.py
    python -m bench.capacity --sweep [--only agents,profiles]   # bench/results/capacity.json
    python -m bench.capacity --report             # its tables and charts into BENCHMARKS.md

Prints entries/s produced, claim + put latency p50/p99, requests per produced entry,
lost races per commit, the highest conditional-write rate one object saw and the highest
request rate one prefix (or bucket) saw, dollars per million entries at S3's list prices
and the checker's verdict (``--json``: one object with every figure).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import calibrate, capacity_sweep
from bench.capacity_run import KEYS, Plan, run
from bench.common import ROOT
from tests.support.storemodel import PROFILE_NAMES

__all__ = ["KEYS", "Plan", "main", "run"]


def describe(r: dict[str, Any]) -> str:
    lines = [
        f"{r['profile']}, {r['agents']} agents, partitions {r['partitions']}, batch {r['batch']}, "
        f"{r['seconds']:g} s simulated after {r['warmup']:g} s warm-up",
        f"  entries/s produced      {r['entries_per_s']}",
        f"  claim+put p50 / p99     {r['p50_s']} / {r['p99_s']} s",
        f"  requests per entry      {r['requests_per_entry']}",
        f"  conflicts per commit    {r['conflicts_per_commit']}",
        f"  max CAS/s one object    {r['max_object_cas_per_s']} (limit "
        f"{r['limits']['object_cas_per_s']})",
        f"  max requests/s a scope  {r['max_prefix_requests_per_s']}",
        f"  $ per million entries   {r['dollars_per_million']}",
        f"  invariant violations    {r['violations']}",
        f"  limited by              {r['limited_by']}",
        f"  throttled {r['throttled']}, in flight (409) {r['busy']}, stale (412) "
        f"{r['stale']}, retries {r['retries']}, faults {r['faults']}",
        f"  wall {r['run_s']} s (setup {r['setup_s']}, check {r['check_s']}), "
        f"{r['events']} events, {r['threads']} threads, peak RSS {r['peak_rss_mib']} MiB",
    ]
    return "\n".join(lines)


def _partitions(text: str) -> int | str:
    if text == "auto":
        return "auto"
    n = int(text)
    if not n >= 1:
        raise argparse.ArgumentTypeError("partitions: a whole number from 1, or auto")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--profile", choices=PROFILE_NAMES, default="s3-standard")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--partitions", type=_partitions, default="auto")
    parser.add_argument("--layout", choices=("partitioned", "stage", "task"), default="partitioned")
    parser.add_argument(
        "--spread",
        choices=("yes", "no"),
        default=None,
        help="partitions under key prefixes of their own (default: the library's choice)",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=None, help="simulated seconds measured")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=60.0, help="the local profile's delay")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="the local profile against bench/contention.py on this machine's SeaweedFS",
    )
    parser.add_argument("--sweep", action="store_true", help="run the sweep's series")
    parser.add_argument("--only", default="", help="--sweep: some series, comma-separated")
    parser.add_argument("--again", action="store_true", help="--sweep: run done points again")
    parser.add_argument(
        "--out", type=Path, default=None, help="--sweep: the results file (default capacity.json)"
    )
    parser.add_argument("--report", action="store_true", help="render the sweep's results")
    parser.add_argument("--repeats", type=int, default=2, help="--calibrate: runs per point")
    parser.add_argument("--duration", type=float, default=4.0, help="--calibrate: s per run")
    args = parser.parse_args(argv)
    logging.getLogger("objmanifest").setLevel(logging.CRITICAL)  # the faults are planned
    if args.sweep:
        only = [name for name in args.only.split(",") if name]
        unknown = [name for name in only if name not in capacity_sweep.SWEEP]
        if unknown:
            parser.error(f"no series {unknown[0]!r}: choose from {', '.join(capacity_sweep.SWEEP)}")
        capacity_sweep.sweep(only, args.again, args.out or capacity_sweep.RESULTS)
        return 0
    if args.report:
        data = capacity_sweep.load_all()
        for path in capacity_sweep.charts(data):
            print(f"wrote {path}", file=sys.stderr)
        capacity_sweep.update_markdown(ROOT / "BENCHMARKS.md", capacity_sweep.render(data))
        return 0
    if args.calibrate:
        report = calibrate.calibrate(int(args.delay_ms), args.repeats, args.duration)
        print(json.dumps(report, indent=1) if args.json else calibrate.table(report))
        return 0
    plan = Plan(
        profile=args.profile,
        agents=args.agents,
        partitions=args.partitions,
        layout=args.layout,
        spread=None if args.spread is None else args.spread == "yes",
        batch=args.batch,
        seconds=args.seconds,
        warmup=args.warmup,
        seed=args.seed,
        faults=not args.no_faults,
        delay_ms=args.delay_ms,
    )
    result = run(plan)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(describe(result))
    return 1 if result["violations"] or result["escaped"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
