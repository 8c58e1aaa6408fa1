"""Agent processes for the benchmarks: a pool of real OS processes (spawned once, reused
for every point), each told by a pipe what to produce, made ready, then started at the
same instant as the others, for a fixed time.

A job produces entries of one stage: ``claim(stage=)`` + ``put`` of a small payload (batch
1), or ``claim_many(stage, limit=B)`` + ``put_many`` (batch B), in ``threads`` threads of
the process (each its own agent). It reports the entries it made ready, each operation's
latency, and the commits and lost races of its process (``task.request_counts()``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

_STORES: dict[tuple[str, str, str], Any] = {}


def _store(endpoint: str, bucket: str, prefix: str) -> Any:
    import objmanifest as om
    from objmanifest.store import make_client

    key = (endpoint, bucket, "")
    if key not in _STORES:
        _STORES[key] = make_client(endpoint, max_pool_connections=128)
    return om.connect(f"s3://{bucket}/{prefix}", client=_STORES[key])


def produce(job: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """Run one job (see the module's docstring); talks to the pool over ``conn``."""
    import objmanifest as om

    os.environ.update(job.get("env", {}))
    store = _store(job["endpoint"], job["bucket"], job["prefix"])
    task = om.Task.open(store, job["task_id"])
    stage: str = job["stage"]
    task.shards(task.shard_names(stage))  # warm: the agent has seen its shards
    threads = int(job.get("threads", 1))
    batch = int(job.get("batch", 1))
    many = bool(job.get("many", batch > 1))
    payload = b"x" * int(job.get("size", 100))
    agents = [task.agent(f"{job['agent']}-{t}") for t in range(threads)]
    put_many = getattr(om.Agent, "put_many", None)

    conn.send(("ready", None))
    start_at = conn.recv()
    pause = start_at - time.time()
    if pause > 0:
        time.sleep(pause)
    deadline = start_at + float(job["duration"])
    cpu0 = os.times()
    before = task.request_counts()
    latencies: list[float] = []
    ends: list[float] = []
    entries = [0]
    errors: Counter[str] = Counter()
    ran_out = [False]
    lock = threading.Lock()

    def work(agent: Any) -> None:
        mine: list[float] = []
        made = 0
        last = 0.0
        while time.time() < deadline and not ran_out[0]:
            t0 = time.perf_counter()
            try:
                if not many:
                    claim = agent.claim(stage=stage)
                    if claim is None:
                        ran_out[0] = True
                        break
                    agent.put(claim, payload)
                    done = 1
                else:
                    claims = agent.claim_many(stage, limit=batch)
                    if not claims:
                        ran_out[0] = True
                        break
                    if put_many is not None:
                        results = agent.put_many(claims, [payload] * len(claims))
                        done = 0
                        for r in results:
                            if isinstance(r, BaseException):
                                with lock:
                                    errors[type(r).__name__] += 1
                            else:
                                done += 1
                    else:
                        for claim in claims:
                            agent.put(claim, payload)
                        done = len(claims)
            except om.ObjManifestError as e:
                with lock:
                    errors[type(e).__name__] += 1
                continue
            mine.append(time.perf_counter() - t0)
            made += done
            last = time.time()
        with lock:
            latencies.extend(mine)
            entries[0] += made
            if made:
                ends.append(last)

    pool = [threading.Thread(target=work, args=(a,), daemon=True) for a in agents]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    cpu1 = os.times()
    after = task.request_counts()
    return {
        "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        "entries": entries[0],
        "latencies": latencies,
        "last_end": max(ends) if ends else start_at,
        "start_at": start_at,
        "commits": after["commits"] - before["commits"],
        "conflicts": after["conflicts"] - before["conflicts"],
        "errors": dict(errors),
        "ran_out": ran_out[0],
    }


def _serve(conn: Connection) -> None:
    """A pool process: run jobs until told to stop (None)."""
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            result = produce(job, conn)
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("done", result))


class Pool:
    """Agent processes, started on first need and reused."""

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[tuple[Any, Connection]] = []

    def _grow(self, size: int) -> None:
        while len(self._workers) < size:
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(target=_serve, args=(child,), daemon=True)
            proc.start()
            child.close()
            self._workers.append((proc, parent))

    def run(
        self,
        jobs: list[dict[str, Any]],
        timeout: float = 120.0,
        on_ready: Callable[[], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Run ``jobs`` (one per process), started together once all are ready (warmed up:
        ``on_ready`` is called then, so that what it counts leaves the warm-up out)."""
        self._grow(len(jobs))
        conns = [conn for _, conn in self._workers[: len(jobs)]]
        for conn, job in zip(conns, jobs, strict=True):
            conn.send(job)
        failures = []
        for conn in conns:
            kind, detail = self._receive(conn, timeout)
            if kind != "ready":
                failures.append(detail)
        if failures:
            raise RuntimeError(f"an agent process failed to start its job:\n{failures[0]}")
        if on_ready is not None:
            on_ready()
        start_at = time.time() + 0.25
        for conn in conns:
            conn.send(start_at)
        results = []
        for conn in conns:
            kind, detail = self._receive(conn, timeout + max(j["duration"] for j in jobs))
            if kind != "done":
                raise RuntimeError(f"an agent process failed:\n{detail}")
            results.append(detail)
        return results

    @staticmethod
    def _receive(conn: Connection, timeout: float) -> tuple[str, Any]:
        if not conn.poll(timeout):
            raise RuntimeError(f"an agent process did not answer within {timeout:.0f} s")
        message: tuple[str, Any] = conn.recv()
        return message

    def close(self) -> None:
        for _, conn in self._workers:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc, _ in self._workers:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        self._workers.clear()


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One point from the reports of its processes."""
    from bench.common import ms, pct

    entries = sum(r["entries"] for r in results)
    start = min(r["start_at"] for r in results)
    end = max(r["last_end"] for r in results)
    ran_out = any(r["ran_out"] for r in results)
    # The window: to the deadline, or to the last entry made if the stage ran out before.
    duration = max(end - start, 1e-9)
    latencies = [x for r in results for x in r["latencies"]]
    commits = sum(r["commits"] for r in results)
    conflicts = sum(r["conflicts"] for r in results)
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    cpu = sum(r["cpu_s"] for r in results)
    return {
        "entries": entries,
        "seconds": round(duration, 3),
        "entries_per_s": round(entries / duration, 2),
        "ops": len(latencies),
        "p50_ms": ms(pct(latencies, 50)),
        "p99_ms": ms(pct(latencies, 99)),
        "commits": commits,
        "conflicts": conflicts,
        "conflicts_per_commit": round(conflicts / commits, 3) if commits else None,
        "errors": dict(errors),
        "ran_out": ran_out,
        "agents_cpu_s": round(cpu, 2),
        "agents_cpu_ms_per_entry": round(cpu / entries * 1000, 2) if entries else None,
    }
