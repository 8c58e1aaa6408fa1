"""Contention: 1..16 agent processes producing entries (``claim(stage=)`` + ``put`` of 100
bytes) in each shard layout, on one hot stage and on four busy stages, on bare loopback and
behind proxies adding 25 ms and 60 ms to every request; and threads 1..32 of one process on
one shard (group commit). Each series is compared with its own one-agent point.

    python -m bench --only contention,threads
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.agents import Pool, summarize
from bench.common import (
    Bench,
    CpuWindow,
    create_task,
    fmt,
    layout_support,
    new_prefix,
    say,
    shard_count,
)
from bench.request_count import kind

SERIES = (
    ("hot", "stage"),
    ("hot", "partitioned"),
    ("busy", "task"),
    ("busy", "stage"),
    ("busy", "partitioned"),
)
"""(scenario, layout). On one hot stage the ``task`` layout is the ``stage`` layout (one
object either way), so it is not run twice."""

HOT_PARTITIONS = 16
BUSY_PARTITIONS = 4
BUSY_STAGES = ("s0", "s1", "s2", "s3")


def most_per_agent(delay_ms: int) -> float:
    """An upper bound on one agent's entries/s: a claim and a put take at least three
    round trips."""
    return 1.0 / (3 * delay_ms / 1000 + 0.004)


def entries_needed(delay_ms: int, agents: int, duration: float, cap: float = 250.0) -> int:
    """Entries to declare so that ``agents`` never run out within ``duration`` (the same for
    every point of a series: a shard's size is part of a commit's cost)."""
    rate = min(agents * most_per_agent(delay_ms), cap)
    return int(rate * duration * 1.2) + 20


def stages_of(scenario: str) -> list[str]:
    return ["collect"] if scenario == "hot" else list(BUSY_STAGES)


def point(
    b: Bench,
    pool: Pool,
    *,
    delay_ms: int,
    scenario: str,
    layout: str,
    agents: int,
    duration: float,
    per_stage: int,
    threads: int = 1,
    partitions: int | None = None,
) -> dict[str, Any]:
    """Create a fresh task, declare its entries (on the bare endpoint), and run the agents
    (behind the proxy) for ``duration`` seconds. ``partitions``: of each stage, in the
    ``partitioned`` layout (default: the scenario's)."""
    stages = stages_of(scenario)
    prefix = new_prefix(f"c{delay_ms}-{scenario}-{layout}-{agents}x{threads}")
    store = b.store(prefix)
    if partitions is None:
        partitions = HOT_PARTITIONS if scenario == "hot" else BUSY_PARTITIONS
    task = create_task(store, "bench", stages, layout, partitions, lease_seconds=600)
    task.declare_many([(f"{s}/{i:05d}", s) for s in stages for i in range(per_stage)])
    jobs = [
        {
            "endpoint": b.endpoint(delay_ms),
            "bucket": b.bucket,
            "prefix": prefix,
            "task_id": "bench",
            "agent": f"a{i}",
            "stage": stages[i % len(stages)],
            "duration": duration,
            "threads": threads,
            "env": b.env,
        }
        for i in range(agents)
    ]
    proxy = b.proxy(delay_ms) if delay_ms else None
    seen = [0]
    window = CpuWindow(b.server_pid)

    def warmed_up() -> None:  # requests and CPU counted from here: the warm-up left out
        seen[0] = len(proxy.requests) if proxy else 0
        window.start()

    summary = summarize(pool.run(jobs, on_ready=warmed_up))
    cpu = window.stop()
    counted: dict[str, Any] = {}
    if proxy is not None and summary["entries"]:
        kinds = Counter(kind(method, target) for method, target in proxy.requests[seen[0] :])
        made = summary["entries"]
        counted = {
            "requests_per_entry": round(sum(kinds.values()) / made, 3),
            "shard_puts_per_entry": round(kinds["PUT shard"] / made, 3),
            "shard_gets_per_entry": round(kinds["GET shard"] / made, 3),
        }
    return {
        "delay_ms": delay_ms,
        "scenario": scenario,
        "layout": layout,
        "shards": shard_count(task),
        "agents": agents,
        "threads": threads,
        "declared_per_stage": per_stage,
        **summary,
        **cpu,
        **counted,
    }


def run(
    b: Bench,
    pool: Pool,
    agents: list[int],
    delays: list[int],
    duration: float,
) -> dict[str, Any]:
    support = layout_support()
    points: list[dict[str, Any]] = []
    skipped: list[str] = []
    for delay in delays:
        for scenario, layout in SERIES:
            if not support[layout]:
                skipped.append(f"{scenario}/{layout}: this objmanifest has no {layout} layout")
                continue
            need = entries_needed(delay, max(agents), duration)
            per_stage = need if scenario == "hot" else max(need // len(BUSY_STAGES), 50)
            base: float | None = None
            for n in agents:
                p = point(
                    b,
                    pool,
                    delay_ms=delay,
                    scenario=scenario,
                    layout=layout,
                    agents=n,
                    duration=duration,
                    per_stage=per_stage,
                )
                if n == 1:
                    base = p["entries_per_s"]
                p["speedup"] = round(p["entries_per_s"] / base, 2) if base else None
                points.append(p)
                say(
                    f"contention {delay:>2} ms {scenario:4} {layout:11} agents={n:>2} "
                    f"shards={p['shards']:>2}: {p['entries_per_s']:7.1f} entries/s "
                    f"x{fmt(p['speedup'])} conflicts/commit={fmt(p['conflicts_per_commit'])} "
                    f"p50={fmt(p['p50_ms'], 1)} p99={fmt(p['p99_ms'], 1)} ms "
                    f"cpu/entry={fmt(p['agents_cpu_ms_per_entry'], 1)} ms "
                    f"busy={fmt(p['machine_busy_cores'])} cores"
                    + (" (ran out)" if p["ran_out"] else "")
                    + (f" errors={p['errors']}" if p["errors"] else "")
                )
    return {
        "duration_s": duration,
        "hot_partitions": HOT_PARTITIONS,
        "busy_partitions": BUSY_PARTITIONS,
        "points": points,
        "skipped": skipped,
    }


def run_threads(
    b: Bench, pool: Pool, threads: list[int], delay_ms: int, duration: float
) -> dict[str, Any]:
    """Threads of one process, each its own agent, producing on one shard."""
    need = entries_needed(delay_ms, max(threads), duration)
    points = []
    base: float | None = None
    for t in threads:
        p = point(
            b,
            pool,
            delay_ms=delay_ms,
            scenario="hot",
            layout="stage",
            agents=1,
            threads=t,
            duration=duration,
            per_stage=need,
        )
        if t == threads[0]:
            base = p["entries_per_s"] / t if t > 1 else p["entries_per_s"]
        p["speedup"] = round(p["entries_per_s"] / base, 2) if base else None
        points.append(p)
        say(
            f"threads {delay_ms} ms threads={t:>2}: {p['entries_per_s']:7.1f} entries/s "
            f"x{fmt(p['speedup'])} shard PUTs/entry={fmt(p.get('shard_puts_per_entry'))} "
            f"conflicts/commit={fmt(p['conflicts_per_commit'])} p50={fmt(p['p50_ms'], 1)} ms"
        )
    return {"delay_ms": delay_ms, "duration_s": duration, "points": points}
