"""Batching: one agent process producing entries of one stage with ``claim_many`` +
``put_many`` in batches of 1, 10 and 100, next to ``claim(stage=)`` + ``put`` one at a time
(the per-entry rate), on bare loopback and behind the latency proxy. Every point declares
the same number of entries, so every commit has a shard of the same size to encode.

    python -m bench --only batching
"""

from __future__ import annotations

from typing import Any

from bench.agents import Pool, summarize
from bench.common import Bench, create_task, fmt, layout_support, new_prefix, say


def point(
    b: Bench, pool: Pool, delay_ms: int, batch: int, many: bool, entries: int, duration: float
) -> dict[str, Any]:
    prefix = new_prefix(f"b{delay_ms}-{batch}")
    task = create_task(b.store(prefix), "bench", ["s"], lease_seconds=600)
    task.declare_many([(f"s/{i:05d}", "s") for i in range(entries)])
    job = {
        "endpoint": b.endpoint(delay_ms),
        "bucket": b.bucket,
        "prefix": prefix,
        "task_id": "bench",
        "agent": "batcher",
        "stage": "s",
        "duration": duration,
        "batch": batch,
        "many": many,
        "env": b.env,
    }
    return {
        "delay_ms": delay_ms,
        "batch": batch,
        "verbs": "claim_many + put_many" if many else "claim + put",
        "declared": entries,
        **summarize(pool.run([job])),
    }


def run(
    b: Bench, pool: Pool, delays: list[int], batches: list[int], entries: int, duration: float
) -> dict[str, Any]:
    many = layout_support()["put_many"]
    points = []
    for delay in delays:
        single = point(b, pool, delay, 1, False, entries, duration)
        single["vs_per_entry"] = 1.0
        points.append(single)
        base = single["entries_per_s"]
        for batch in batches:
            p = point(b, pool, delay, batch, True, entries, duration)
            if not many:
                p["verbs"] = "claim_many + put (one by one; no put_many)"
            p["vs_per_entry"] = round(p["entries_per_s"] / base, 2) if base else None
            points.append(p)
        for p in points[-1 - len(batches) :]:
            say(
                f"batching {delay:>2} ms {p['verbs']:24} batch={p['batch']:>3}: "
                f"{p['entries_per_s']:8.1f} entries/s x{fmt(p['vs_per_entry'])} "
                f"p50={fmt(p['p50_ms'], 1)} ms per call"
                + (f" errors={p['errors']}" if p["errors"] else "")
            )
    return {"duration_s": duration, "put_many": many, "points": points}
