"""Size: a warm commit (``agent.renew``: build and encode the shard, one conditional PUT)
in a stage of 1k, 10k and 100k entries, held in one shard, split into partitions of 1k
entries each, and with all but 1k of them archived (``task.archive``); and how long
``declare_many`` of the stage took.

    python -m bench --only size
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import objmanifest as om
from bench.common import Bench, create_task, fmt, layout_support, ms, new_prefix, pct, say
from objmanifest import cas

PER_PARTITION = 1_000
LIVE = 1_000


def _commits(task: om.Task, agent: om.Agent, claim: om.Claim, rounds: int) -> dict[str, Any]:
    # Warm, and steady: a commit's version carries the journal records not yet in a block
    # (the declaration's record names every entry declared); after two blocks' worth of
    # commits only small ones are left, as in a task that has been running a while.
    for _ in range(2 * cas.BLOCK + 1):
        claim = agent.renew(claim)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        claim = agent.renew(claim)
        times.append(time.perf_counter() - t0)
    shard = claim.shard
    body = task.codec(shard).encode(task.read_shard(shard))
    live = len(task.read_shard(shard).entries)
    return {
        "commit_median_ms": ms(statistics.median(times)),
        "commit_p90_ms": ms(pct(times, 90)),
        "shard_bytes": len(body),
        "live": live,
    }


def _declare(task: om.Task, n: int) -> float:
    t0 = time.perf_counter()
    task.declare_many([(f"s/{i:06d}", "s") for i in range(n)])
    return time.perf_counter() - t0


def measure(b: Bench, layout: str, n: int, rounds: int) -> tuple[dict[str, Any], float]:
    prefix = new_prefix(f"size-{layout}-{n}")
    store = b.store(prefix)
    parts = max(1, n // PER_PARTITION) if layout == "partitioned" else 1
    if layout == "archived":
        # Every entry but LIVE dies (claimed under a 1 s lease, expired, no retries), then
        # goes to archive objects.
        task = create_task(store, "bench", ["s"], "stage", lease_seconds=1, max_retries=0)
        declared = _declare(task, n)
        if n > LIVE:
            task.agent("doomed").claim_many("s", limit=n - LIVE)
            time.sleep(3.5)  # past the lease and its 2 s margin
            task.reap()
            task.archive(older_than=0)
    else:
        task = create_task(store, "bench", ["s"], layout, parts, lease_seconds=600)
        declared = _declare(task, n)
    agent = task.agent("bench")
    claim = agent.claim(stage="s")
    assert claim is not None
    point = {
        "layout": layout,
        "entries": n,
        "shards": len(task.layout.shards_of("s")),
        "rounds": rounds,
        **_commits(task, agent, claim, rounds),
    }
    return point, declared


def run(b: Bench, sizes: list[int], rounds: int = 20) -> dict[str, Any]:
    support = layout_support()
    layouts = ["stage", "archived"] + (["partitioned"] if support["partitioned"] else [])
    points, declares = [], []
    for layout in layouts:
        for n in sizes:
            if layout != "stage" and n <= LIVE:
                continue  # the same single shard of 1k entries as "stage"
            point, seconds = measure(b, layout, n, rounds if n < 100_000 else max(3, rounds // 4))
            points.append(point)
            declares.append({"layout": layout, "entries": n, "seconds": round(seconds, 2)})
            say(
                f"size {layout:11} {n:>6} entries, {point['shards']:>3} shards, "
                f"{point['live']:>6} live in the committed shard "
                f"({point['shard_bytes'] / 1024:.0f} KB): commit {fmt(point['commit_median_ms'])} "
                f"ms (p90 {fmt(point['commit_p90_ms'])}); declare_many {seconds:.2f} s"
            )
    return {"points": points, "declare_many": declares, "per_partition": PER_PARTITION}
