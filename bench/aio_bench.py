"""asyncio: the same work done by N coroutines of one ``AsyncTask`` and by N threads of
one ``Task``, in one process, bare and behind the latency proxy.

Each point declares the same entries in one stage and lets N workers drain it, each its
own agent, one ``claim(stage=)`` + ``put`` of 100 bytes at a time: threads through the
sync API, coroutines through ``objmanifest.aio`` (whose pool has ``store.connections``
threads). The ratio coroutines / threads is what the asyncio API costs over the threads
it runs on; 1.0 means nothing.

    python -m bench --only aio
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import objmanifest as om
from bench.common import Bench, create_task, fmt, new_prefix, ratio, run_together, say
from objmanifest.aio import AsyncTask

BODY = b"x" * 100


def _task(b: Bench, delay_ms: int, name: str, entries: int) -> tuple[om.Task, Any]:
    """A fresh task of ``entries`` pending entries, declared directly; the store the
    workers use, ``delay_ms`` away."""
    prefix = new_prefix(f"aio{delay_ms}-{name}")
    setup = create_task(b.store(prefix), "bench", ["s"], lease_seconds=600)
    setup.declare_many([(f"s/{i:05d}", "s") for i in range(entries)])
    store = b.store(prefix, delay_ms)
    return om.Task.open(store, "bench"), store


def with_threads(task: om.Task, workers: int) -> tuple[int, float]:
    """Entries made ready by ``workers`` threads, and the seconds it took."""
    made = [0] * workers

    def prepare(n: int) -> Callable[[], None]:
        agent = task.agent(f"t{n}")

        def work() -> None:
            while (claim := agent.claim(stage="s")) is not None:
                agent.put(claim, BODY)
                made[n] += 1

        return work

    seconds = run_together(prepare, workers)
    return sum(made), seconds


def with_coroutines(task: om.Task, workers: int) -> tuple[int, float]:
    """Entries made ready by ``workers`` coroutines on one loop, and the seconds it took."""

    async def main() -> tuple[int, float]:
        made = [0] * workers
        async with AsyncTask(task) as atask:

            async def work(n: int) -> None:
                agent = atask.agent(f"c{n}")
                while (claim := await agent.claim(stage="s")) is not None:
                    await agent.put(claim, BODY)
                    made[n] += 1

            t0 = time.perf_counter()
            await asyncio.gather(*(work(n) for n in range(workers)))
            return sum(made), time.perf_counter() - t0

    return asyncio.run(main())


def point(b: Bench, delay_ms: int, workers: int, entries: int) -> dict[str, Any]:
    """Both ways on the same work: threads, then coroutines, then threads again (the
    mean of the two thread runs is the peer, so a drift of the machine shows)."""
    rates: dict[str, list[float]] = {"threads": [], "coroutines": []}
    for way in ("threads", "coroutines", "threads"):
        task, _ = _task(b, delay_ms, way, entries)
        run = with_threads if way == "threads" else with_coroutines
        made, seconds = run(task, workers)
        if made != entries:
            raise RuntimeError(f"{way}: {made} of {entries} entries made ready")
        rates[way].append(made / seconds)
    threads = sum(rates["threads"]) / len(rates["threads"])
    coroutines = rates["coroutines"][0]
    return {
        "delay_ms": delay_ms,
        "workers": workers,
        "entries": entries,
        "threads_per_s": round(threads, 1),
        "coroutines_per_s": round(coroutines, 1),
        "ratio": ratio(coroutines, threads),
    }


def run(b: Bench, workers: list[int], delays: list[int], entries: int) -> dict[str, Any]:
    points = []
    for delay in delays:
        for n in workers:
            p = point(b, delay, n, entries)
            points.append(p)
            say(
                f"aio {delay:>2} ms workers={n:>2}: threads {p['threads_per_s']:7.1f} "
                f"entries/s, coroutines {p['coroutines_per_s']:7.1f} entries/s, "
                f"ratio {fmt(p['ratio'])}"
            )
    return {"entries": entries, "points": points}


def table(section: dict[str, Any]) -> str:
    lines = [
        f"One process, one shard, {section['entries']} entries per run, each `claim(stage=)` "
        "+ `put` of 100 bytes; threads: the sync API, one agent per thread (mean of the runs "
        "before and after); coroutines: `objmanifest.aio`, one agent per coroutine.\n",
        "| added latency | workers | threads entries/s | coroutines entries/s | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in section["points"]:
        lines.append(
            f"| {p['delay_ms']} ms | {p['workers']} | {fmt(p['threads_per_s'], 1)} | "
            f"{fmt(p['coroutines_per_s'], 1)} | {fmt(p['ratio'])} |"
        )
    return "\n".join(lines)
