"""The model's ``local`` profile against this machine: SeaweedFS behind the latency proxy.

    python -m bench.capacity --calibrate [--delay-ms 60] [--repeats 2] [--duration 4]

First the latency of each kind of request one agent makes (a shard-sized GET, a
conditional PUT of a shard-sized body, a create-only PUT of 100 bytes) is measured
through the proxy, one request at a time, by the library's own ``S3Store``: that is the
calibrated profile. Then ``bench/contention.py`` runs 1, 2 and 4 agent processes on a
stage of 4 partitions, ``repeats`` times each (interleaved, so a busy minute of the shared
machine does not fall on one point only), recording the CPU the whole machine was busy
with; and the model runs the same points with the calibrated profile. A point during which
the machine was busy 1.6 cores or more is CPU-bound (the processes waited for a core, which
the model does not simulate): it is shown, and left out of the error.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from typing import Any

from bench import capacity_run as capacity
from bench import contention
from bench.agents import Pool
from bench.common import ROOT, CpuWindow, bench_context, fmt, pct, say
from objmanifest.store import CREATE, PutMode
from tests.support.storemodel import Latency, local_profile

AGENTS = (1, 2, 4)
PARTITIONS = 4
CPU_BOUND = 1.6
"""Busy cores of the whole machine from which a point counts as CPU-bound."""
SHARD_BYTES = 20_000
"""About a shard of a few dozen entries with its journal records."""


def measure_latencies(b: Any, delay_ms: int, rounds: int = 60) -> dict[str, Any]:
    """Each kind of request, ``rounds`` times, interleaved, one at a time: median and 99th
    percentile in seconds, and the CPU the machine was busy with meanwhile."""
    prefix = f"calibrate-{uuid.uuid4().hex[:8]}"
    store = b.store(prefix, delay_ms)
    body = b"x" * SHARD_BYTES
    etag = store.put("shard.json", body, mode=CREATE)
    store.get("shard.json")  # the connection made, the clock known
    took: dict[str, list[float]] = {"get": [], "cas": [], "put": []}
    window = CpuWindow(b.server_pid).start()
    for n in range(rounds):
        t0 = time.perf_counter()
        store.get("shard.json")
        t1 = time.perf_counter()
        etag = store.put("shard.json", body, mode=PutMode.update(etag))
        t2 = time.perf_counter()
        store.put(f"data/{n}", b"y" * 100, mode=CREATE)
        t3 = time.perf_counter()
        took["get"].append(t1 - t0)
        took["cas"].append(t2 - t1)
        took["put"].append(t3 - t2)
    cpu = window.stop()
    return {
        kind: {"median_s": statistics.median(xs), "p99_s": pct(xs, 99)} for kind, xs in took.items()
    } | {"machine_busy_cores": cpu["machine_busy_cores"]}


def profile_of(measured: dict[str, Any], delay_ms: float) -> Any:
    return local_profile(
        delay_ms,
        {
            kind: Latency(
                measured[kind]["median_s"],
                max(measured[kind]["p99_s"], 1.01 * measured[kind]["median_s"]),
            )
            for kind in ("get", "cas", "put")
        },
    )


def real_point(b: Any, pool: Pool, agents: int, delay_ms: int, duration: float) -> dict[str, Any]:
    per_stage = contention.entries_needed(delay_ms, max(AGENTS), duration)
    return contention.point(
        b,
        pool,
        delay_ms=delay_ms,
        scenario="hot",
        layout="partitioned",
        agents=agents,
        duration=duration,
        per_stage=per_stage,
        partitions=PARTITIONS,
    )


def own_cores(p: dict[str, Any]) -> float | None:
    """The cores the point itself kept busy: its agents, the server, the harness and its
    proxy (the machine's busy cores count everyone's)."""
    parts = (p.get("agents_cpu_s"), p.get("server_cpu_s"), p.get("harness_cpu_s"))
    if None in parts or not p.get("wall_s"):
        return None
    return round(sum(parts) / p["wall_s"], 2)  # type: ignore[arg-type]


def model_point(agents: int, calibrated: Any, seeds: int = 3) -> dict[str, Any]:
    """The model's rate for ``agents`` on the stage: the mean over ``seeds``."""
    rates = []
    for seed in range(seeds):
        plan = capacity.Plan(
            "local",
            agents=agents,
            partitions=PARTITIONS,
            seconds=30.0,
            warmup=2.0,
            seed=seed,
            faults=False,
            stagger=0.05,
            calibrated=calibrated,
        )
        rates.append(capacity.run(plan)["entries_per_s"])
    return {"entries_per_s": round(statistics.mean(rates), 2), "per_seed": rates}


def calibrate(delay_ms: int = 60, repeats: int = 2, duration: float = 4.0) -> dict[str, Any]:
    """Measure, model, compare (see the module's docstring); the report as a dict."""
    points: dict[int, list[dict[str, Any]]] = {n: [] for n in AGENTS}
    with bench_context("seaweedfs") as b:
        pool = Pool()
        try:
            measured = measure_latencies(b, delay_ms)
            say(f"latencies at {delay_ms} ms: {measured}")
            for rep in range(repeats):
                order = AGENTS if rep % 2 == 0 else tuple(reversed(AGENTS))
                for n in order:
                    p = real_point(b, pool, n, delay_ms, duration)
                    points[n].append(p)
                    say(
                        f"real {n} agents: {p['entries_per_s']} entries/s, busy "
                        f"{p['machine_busy_cores']} cores, agents' CPU {p['agents_cpu_s']} s"
                    )
        finally:
            pool.close()
    calibrated = profile_of(measured, delay_ms)
    rows = []
    for n in AGENTS:
        model = model_point(n, calibrated)
        runs = [
            {
                "entries_per_s": p["entries_per_s"],
                "machine_busy_cores": p["machine_busy_cores"],
                "agents_cpu_s": p["agents_cpu_s"],
                "server_cpu_s": p["server_cpu_s"],
                "harness_cpu_s": p["harness_cpu_s"],
                "own_cores": own_cores(p),
                "conflicts_per_commit": p["conflicts_per_commit"],
                "cpu_bound": (p["machine_busy_cores"] or 0) >= CPU_BOUND,
            }
            for p in points[n]
        ]
        counted = [r["entries_per_s"] for r in runs if not r["cpu_bound"]]
        real = statistics.median(counted) if counted else None
        error = None if not real else round(model["entries_per_s"] / real - 1, 3)
        rows.append({"agents": n, "real": real, "runs": runs, "model": model, "error": error})
    report = {
        "delay_ms": delay_ms,
        "partitions": PARTITIONS,
        "duration_s": duration,
        "latencies": measured,
        "points": rows,
        "max_abs_error": max(
            (abs(r["error"]) for r in rows if r["error"] is not None), default=None
        ),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    out = ROOT / "bench" / "results" / "calibration.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def table(report: dict[str, Any]) -> str:
    lines = [
        f"local profile vs bench/contention.py, {report['delay_ms']} ms, one stage of "
        f"{report['partitions']} partitions",
        "latency per request (median / p99 ms): "
        + ", ".join(
            f"{k} {report['latencies'][k]['median_s'] * 1000:.1f} / "
            f"{report['latencies'][k]['p99_s'] * 1000:.1f}"
            for k in ("get", "cas", "put")
        ),
        "",
        "| agents | measured entries/s (machine's busy cores, the point's own) | counted | "
        "model | error | error against every run |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in report["points"]:
        runs = ", ".join(
            f"{fmt(x['entries_per_s'], 1)} ({fmt(x['machine_busy_cores'])}, "
            f"{fmt(x.get('own_cores'))})" + (" CPU-bound" if x["cpu_bound"] else "")
            for x in r["runs"]
        )
        every = statistics.median(x["entries_per_s"] for x in r["runs"])
        against = f"{(r['model']['entries_per_s'] / every - 1) * 100:+.1f}%" if every else "-"
        err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f}%"
        lines.append(
            f"| {r['agents']} | {runs} | {fmt(r['real'], 2)} | "
            f"{fmt(r['model']['entries_per_s'], 2)} | {err} | {against} |"
        )
    return "\n".join(lines)
