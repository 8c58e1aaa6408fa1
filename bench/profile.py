"""Where an agent's time goes: one agent producing entries (claim + put, or claim_many +
put_many), profiled by CPU time (cProfile on ``time.process_time``), summed by who spent
it: the S3 client (botocore, urllib3, http.client), pydantic (shard decode and encode),
objmanifest itself, the rest. Also the wall time per entry, to set against it.

    python -m bench.profile --delay 25 --entries 1000 --layout stage
    python -m bench.profile --layout partitioned --partitions 16 --batch 100
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Bench, bench_context, create_task, new_prefix

GROUPS = (
    (
        "S3 client (botocore, urllib3, http.client, ssl, socket)",
        ("botocore", "urllib3", "http/", "socket", "ssl", "s3transfer", "email/"),
    ),
    ("pydantic (decode, validate, encode)", ("pydantic",)),
    ("objmanifest", ("objmanifest",)),
    ("json, xxhash, hashlib", ("json", "xxhash", "hashlib")),
)


def group_of(filename: str, name: str) -> str:
    where = f"{filename} {name}"
    for label, needles in GROUPS:
        if any(n in where for n in needles):
            return label
    return "other (threads, locks, the interpreter)"


def _attribute(
    stats: Any, func: tuple[str, int, str], seconds: float, depth: int
) -> dict[str, float]:
    """Time spent in ``func`` by group: its own group, or for the standard library and
    built-ins (enum lookups, dict.get) the group of whoever called them, split by the time
    spent under each caller."""
    label = group_of(func[0], func[2])
    if not label.startswith("other") or depth >= 4:
        return {label: seconds}
    callers = stats.stats[func][4]
    spent = sum(edge[2] for edge in callers.values())
    if not callers or spent <= 0:
        return {label: seconds}
    out: dict[str, float] = {}
    for caller, edge in callers.items():
        share = seconds * edge[2] / spent
        if caller not in stats.stats:
            out[label] = out.get(label, 0.0) + share
            continue
        for k, v in _attribute(stats, caller, share, depth + 1).items():
            out[k] = out.get(k, 0.0) + v
    return out


def profile(
    b: Bench,
    delay_ms: int,
    entries: int,
    layout: str,
    partitions: int,
    batch: int,
    count: int,
) -> dict[str, Any]:
    import objmanifest as om

    prefix = new_prefix("profile")
    task = create_task(b.store(prefix), "bench", ["s"], layout, partitions, lease_seconds=600)
    task.declare_many([(f"s/{i:06d}", "s") for i in range(entries)])
    agent = om.Task.open(b.store(prefix, delay_ms), "bench").agent("profiled")
    payload = b"x" * 100

    def produce(n: int) -> int:
        made = 0
        while made < n:
            if batch == 1:
                claim = agent.claim(stage="s")
                assert claim is not None
                agent.put(claim, payload)
                made += 1
            else:
                claims = agent.claim_many("s", limit=min(batch, n - made))
                assert claims
                agent.put_many(claims, [payload] * len(claims))  # type: ignore[attr-defined]
                made += len(claims)
        return made

    produce(min(20, count))  # warm
    cpu0, wall0 = time.process_time(), time.perf_counter()
    made = produce(count)  # unprofiled: the CPU and wall time per entry
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    # Profiled on the process's CPU clock, so waiting on the network costs nothing; the
    # profiler slows every call, so only the shares are kept, scaled to the CPU above.
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    produce(count)
    prof.disable()
    stats = pstats.Stats(prof)
    groups: dict[str, float] = {}
    for func, row in stats.stats.items():  # type: ignore[attr-defined]
        for label, seconds in _attribute(stats, func, row[2], 0).items():
            groups[label] = groups.get(label, 0.0) + seconds
    total = sum(groups.values()) or 1.0
    per_entry = cpu / made * 1000
    return {
        "entries": made,
        "cpu_ms_per_entry": round(per_entry, 2),
        "wall_ms_per_entry": round(wall / made * 1000, 2),
        "groups_ms_per_entry": {
            k: round(v / total * per_entry, 2)
            for k, v in sorted(groups.items(), key=lambda kv: -kv[1])
        },
        "stats": stats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="seaweedfs", choices=["seaweedfs", "moto"])
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--delay", type=int, default=0, help="ms added to every request")
    parser.add_argument("--entries", type=int, default=1000, help="declared in the stage")
    parser.add_argument("--layout", default="stage", choices=["task", "stage", "partitioned"])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--count", type=int, default=200, help="entries timed, then profiled")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    with bench_context(args.backend, args.endpoint_url) as b:
        r = profile(
            b, args.delay, args.entries, args.layout, args.partitions, args.batch, args.count
        )
    print(
        f"{r['entries']} entries, {args.layout} layout, {args.entries} declared, batch "
        f"{args.batch}, {args.delay} ms added: CPU {r['cpu_ms_per_entry']} ms per entry, "
        f"wall {r['wall_ms_per_entry']} ms per entry"
    )
    print("| CPU spent in (shares of the profile, scaled) | ms per entry |\n|---|---:|")
    for label, value in r["groups_ms_per_entry"].items():
        print(f"| {label} | {value:.2f} |")
    print()
    r["stats"].sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
