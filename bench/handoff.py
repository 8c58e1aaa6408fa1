"""Handoff latency and the cost of waiting: from a producer's ``put`` returning to a waiting
consumer holding the entry, and the requests a waiter makes while nothing happens.

    python -m bench.handoff [--backend real|model] [--delay-ms 25] [--rounds 3] [--json]

Each of ``WAITERS`` entries lives in a stage of its own. Half the waiters wait the way
``consume --wait`` and the MCP server's ``consume(wait=)`` do (``wire.polling.poll`` around
``Agent.consume``), half with ``task.wait([stage])`` and then ``consume``. Producers, each
with a share of the entries, pause a random while (1 to 4 s: long enough for a waiter's
polling to slow down), claim the entry, work on it for ``work`` seconds and put it; a
waiter's handoff is the time from that put returning to its consume returning. Two kinds of
work: ``none`` (claim and put back to back) and ``some`` (1 to 5 s between them, as an agent
doing real work). Two more waiters wait for an entry nobody makes: their requests per
minute, counted after their first ``IDLE_FROM`` seconds, are the idle cost.

``real``: a local SeaweedFS behind the latency proxy, every agent a thread with a task of its
own; ``model``: the same code on the store model (``--profile``, default ``local``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import objmanifest as om
from bench.common import bench_context, pct, say
from objmanifest.errors import NotReady, WaitTimeout
from objmanifest.store import memory
from objmanifest.store.memory import MemoryStore
from objmanifest.wire.polling import poll
from tests.support.des import Scheduler
from tests.support.storemodel import PROFILE_NAMES, ModelStore, StoreModel, profile

WAITERS = 40
PRODUCERS = 4
IDLE_FROM = 30.0
WORK = {"none": (0.0, 0.0), "some": (1.0, 5.0)}
GAP = (1.0, 4.0)
WAIT_S = 900.0
TASK_ID = "handoff"


class Counting:
    """An object store that notes when each request is made through it (one per call)."""

    CALLS = frozenset(
        {
            "get",
            "head",
            "open",
            "put",
            "delete",
            "list",
            "create_upload",
            "upload_part",
            "list_parts",
            "complete_upload",
            "abort_upload",
            "list_uploads",
        }
    )

    def __init__(self, inner: Any, now: Callable[[], float]) -> None:
        self._inner = inner
        self._now = now
        self.made: list[float] = []

    def __getattr__(self, name: str) -> Any:
        got = getattr(self._inner, name)
        if name not in self.CALLS:
            return got

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.made.append(self._now())
            return got(*args, **kwargs)

        return counted


@dataclass
class Clock:
    """Time and sleep of the agents: real, or the simulation's."""

    now: Callable[[], float]
    sleep: Callable[[float], None]


@dataclass
class Record:
    put_at: dict[str, float] = field(default_factory=dict)
    held_at: dict[str, float] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)
    idle: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def stages() -> list[str]:
    return [f"s{i:02d}" for i in range(WAITERS)] + ["idle0", "idle1"]


def waiter(task: om.Task, i: int, clock: Clock, rec: Record) -> None:
    stage, fid = f"s{i:02d}", f"e{i:02d}"
    me = task.agent(f"w{i:02d}")
    try:
        if i % 2 == 0:
            rec.how[fid] = "consume --wait"
            poll(
                lambda: me.consume(fid), WAIT_S, (NotReady,), sleep=clock.sleep, monotonic=clock.now
            )
        else:
            rec.how[fid] = "task.wait"
            task.wait([stage], timeout=WAIT_S)
            me.consume(fid)
        rec.held_at[fid] = clock.now()
    except om.ObjManifestError as e:
        rec.errors.append(f"{fid}: {type(e).__name__}: {e}")


def idle_waiter(
    task: om.Task, store: Counting, n: int, clock: Clock, seconds: float, rec: Record
) -> None:
    me = task.agent(f"idle{n}")
    fid, stage = f"never{n}", f"idle{n}"
    start = clock.now()
    try:
        if n == 0:
            poll(
                lambda: me.consume(fid),
                seconds,
                (NotReady,),
                sleep=clock.sleep,
                monotonic=clock.now,
            )
        else:
            task.wait([stage], timeout=seconds)
    except (NotReady, WaitTimeout):
        pass
    end = clock.now()
    counted = [t for t in store.made if t >= start + IDLE_FROM]
    # Requests per minute over the intervals between them (n requests, n - 1 intervals).
    span = counted[-1] - counted[0] if len(counted) > 1 else 0.0
    rec.idle.append(
        {
            "how": "consume --wait" if n == 0 else "task.wait",
            "requests_per_min": round((len(counted) - 1) / span * 60, 1) if span else None,
            "requests": len(store.made),
            "seconds": round(end - start, 1),
        }
    )


def producer(
    task: om.Task, mine: list[str], work: str, clock: Clock, rng: random.Random, rec: Record
) -> None:
    me = task.agent(f"p{mine[0]}")
    low, high = WORK[work]
    for fid in mine:
        clock.sleep(rng.uniform(*GAP))
        try:
            claim = me.claim(fid)
            assert claim is not None
            clock.sleep(rng.uniform(low, high))
            me.put(claim, f"{fid}|{claim.epoch}".encode())
            rec.put_at[fid] = clock.now()
        except om.ObjManifestError as e:
            rec.errors.append(f"{fid} put: {type(e).__name__}: {e}")


def create(store: Any) -> None:
    task = om.Task.create(store, TASK_ID, stages(), lease_seconds=120)
    task.declare_many(
        [(f"e{i:02d}", f"s{i:02d}") for i in range(WAITERS)]
        + [("never0", "idle0"), ("never1", "idle1")]
    )


def shares(seed: int) -> list[list[str]]:
    ids = [f"e{i:02d}" for i in range(WAITERS)]
    random.Random(seed).shuffle(ids)
    return [ids[p::PRODUCERS] for p in range(PRODUCERS)]


def run_real(delay_ms: int, work: str, seed: int) -> Record:
    rec = Record()
    with bench_context("seaweedfs") as b:
        prefix = f"handoff-{uuid.uuid4().hex[:8]}"
        create(b.store(prefix))
        clock = Clock(time.monotonic, time.sleep)
        threads = []
        idle_seconds = IDLE_FROM + 60.0

        def connect() -> tuple[om.Task, Counting]:
            store = Counting(b.store(prefix, delay_ms), clock.now)
            return om.Task.open(store, TASK_ID), store  # type: ignore[arg-type]

        for i in range(WAITERS):
            task, _ = connect()
            threads.append(threading.Thread(target=waiter, args=(task, i, clock, rec)))
        for n in range(2):
            task, store = connect()
            threads.append(
                threading.Thread(
                    target=idle_waiter, args=(task, store, n, clock, idle_seconds, rec)
                )
            )
        for p, mine in enumerate(shares(seed)):
            task, _ = connect()
            rng = random.Random(f"{seed}/{p}")
            threads.append(
                threading.Thread(target=producer, args=(task, mine, work, clock, rng, rec))
            )
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S + 60)
    return rec


def run_model(name: str, delay_ms: float, work: str, seed: int) -> Record:
    rec = Record()
    sched = Scheduler()
    bucket = f"handoff-{uuid.uuid4().hex[:8]}"
    model = StoreModel(profile(name, delay_ms), sched, bucket)
    create(MemoryStore(bucket, "runs", clock=model.store_clock))
    clock = Clock(lambda: sched.now, sched.sleep)
    idle_seconds = IDLE_FROM + 60.0

    def connect(tag: str) -> tuple[om.Task, Counting]:
        runtime = sched.runtime(f"{seed}/{tag}")
        store = Counting(ModelStore(model, runtime, f"{seed}/{tag}/store", "runs"), clock.now)
        return om.Task.open(store, TASK_ID), store  # type: ignore[arg-type]

    def later(fn: Callable[[], None], tag: str) -> None:
        sched.spawn(fn, tag)

    for i in range(WAITERS):
        later(lambda i=i: waiter(connect(f"w{i}")[0], i, clock, rec), f"w{i}")
    for n in range(2):

        def idle(n: int = n) -> None:
            task, store = connect(f"idle{n}")
            idle_waiter(task, store, n, clock, idle_seconds, rec)

        later(idle, f"idle{n}")
    for p, mine in enumerate(shares(seed)):
        rng = random.Random(f"{seed}/{p}")
        later(
            lambda p=p, mine=mine, rng=rng: producer(
                connect(f"p{p}")[0], mine, work, clock, rng, rec
            ),
            f"p{p}",
        )
    sched.run(WAIT_S)
    sched.shutdown()
    rec.errors += sched.errors
    memory._BUCKETS.pop(bucket, None)
    return rec


def summary(recs: list[Record]) -> dict[str, Any]:
    by_how: dict[str, list[float]] = {}
    for rec in recs:
        for fid, held in rec.held_at.items():
            if fid in rec.put_at:
                by_how.setdefault(rec.how[fid], []).append(held - rec.put_at[fid])
    every = [x for xs in by_how.values() for x in xs]
    out: dict[str, Any] = {
        "handoffs": len(every),
        "p50_s": _r(pct(every, 50)),
        "p99_s": _r(pct(every, 99)),
        "by_waiter": {
            how: {"n": len(xs), "p50_s": _r(pct(xs, 50)), "p99_s": _r(pct(xs, 99))}
            for how, xs in sorted(by_how.items())
        },
        "idle": [i for rec in recs for i in rec.idle],
        "errors": [e for rec in recs for e in rec.errors][:10],
    }
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.handoff", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--backend", choices=("real", "model"), default="model")
    parser.add_argument("--profile", choices=PROFILE_NAMES, default="local")
    parser.add_argument("--delay-ms", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"backend": args.backend, "delay_ms": args.delay_ms}
    for work in WORK:
        recs = []
        for seed in range(args.rounds):
            if args.backend == "real":
                recs.append(run_real(args.delay_ms, work, seed))
            else:
                recs.append(run_model(args.profile, args.delay_ms, work, seed))
            say(f"{work} round {seed}: {summary(recs[-1:])}")
        report[work] = summary(recs)
    print(json.dumps(report, indent=1 if args.json else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
