"""One capacity point: one hot stage on a model of a cloud store, the real ``Task``,
``Agent`` and commit loop, only the store and the clock simulated (``tests/support/des.py``,
``tests/support/storemodel.py``). ``python -m bench.capacity`` runs it.

Entries of one stage are declared beforehand (not counted). Every agent is a ``Task`` of
its own (no commit shared between agents: the worst case) that claims by stage and puts
100 bytes, one entry per claim and put (``--batch B``: ``claim_many`` + ``put_many`` of B),
from a random start in the first second. After a warm-up, a window of simulated time is
measured: entries made ready, each claim + put's latency, every request the agents sent
(throttled ones and retries included), lost races per landed commit. Faults are on (a
write's answer lost now and then, a read refused), and the checker judges the run (its
nine invariants; entries still pending at the end are fine, the run is not drained).
"""

from __future__ import annotations

import contextlib
import gc
import math
import random
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct
from objmanifest.core.layout import AUTO, TaskLayout, auto_partitions
from objmanifest.core.model import MAX_PARTITIONS, MAX_SPREAD_PARTITIONS
from objmanifest.errors import LeaseLost, ObjManifestError
from objmanifest.store import memory
from objmanifest.store.memory import MemoryStore
from objmanifest.task import Task
from tests.support import checker
from tests.support.checker import REFUSED, UNKNOWN, OpLog
from tests.support.des import Scheduler
from tests.support.storemodel import (
    Faults,
    ModelStore,
    Profile,
    StoreModel,
    profile,
)

TASK_ID = "capacity"
STAGE = "hot"
PREFIX = "runs"
LEASE = 120.0
PAYLOAD = 100
FAULTS = Faults(lost_write=0.002, failed_read=0.001)


@dataclass(frozen=True)
class Plan:
    """One capacity point."""

    profile: str = "s3-standard"
    agents: int = 100
    partitions: int | str = "auto"
    """A number, or ``auto``: chosen by the library from ``agents`` (``partitions="auto"``)."""
    spread: bool | None = None
    """Each partition under key prefixes of its own; None: the library's default."""
    layout: str = "partitioned"
    """``partitioned`` (the stage in ``partitions``), ``stage`` (one shard for the stage),
    ``task`` (one shard for the whole task)."""
    batch: int = 1
    seconds: float | None = None
    """Simulated seconds measured (default: enough round trips for the profile)."""
    warmup: float = 3.0
    seed: int = 0
    faults: bool = True
    delay_ms: float = 60.0
    """The local profile's added latency."""
    stagger: float = 1.0
    """Agents start at random instants within this many seconds."""
    threads: bool = False
    """Every fiber an OS thread instead of a greenlet (slower; the same numbers)."""
    calibrated: Profile | None = None
    """A profile to use instead of ``profile`` (the local one, as ``--calibrate`` measured)."""

    def store_profile(self) -> Profile:
        return self.calibrated or profile(self.profile, self.delay_ms)

    def window(self) -> float:
        if self.seconds is not None:
            return self.seconds
        p = self.store_profile()
        per_entry = 2 * p.cas.median + p.put.median
        return float(min(60.0, max(3.0, math.ceil(40 * per_entry))))


def partitions_of(plan: Plan) -> int:
    if plan.layout != "partitioned":
        return 1
    if plan.partitions == AUTO:
        most = MAX_PARTITIONS if plan.spread is False else MAX_SPREAD_PARTITIONS
        return auto_partitions(plan.agents, most)
    return int(plan.partitions)


def entries_to_declare(plan: Plan, partitions: int) -> int:
    """Enough that no partition runs out within the run: each partition's share of what
    the agents could make at most, with room to spare."""
    p = plan.store_profile()
    agent_rate = plan.batch / (2 * p.cas.median + p.put.median)
    rate = plan.agents * agent_rate
    if p.cas_per_object:
        rate = min(rate, partitions * p.cas_per_object / 2 * plan.batch)
    per_partition = rate / partitions * (plan.warmup + 1.0 + plan.window())
    return partitions * (int(per_partition * 1.5) + 4 + plan.batch)


# -- a run ------------------------------------------------------------------------------------


@dataclass
class Made:
    """What the agents did: each claim + put (when it ended, how long it took, entries made),
    errors by name, and the agents' tasks (for their commit counts)."""

    ops: list[tuple[float, float, int]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    tasks: list[Task] = field(default_factory=list)
    ran_out: int = 0
    busy: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    """Per agent, the operations it has sent and not yet heard the end of: when the run
    stops they are logged with an unknown outcome, as a killed agent's would be."""

    def error(self, e: BaseException) -> None:
        name = type(e).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


def _content(file_id: str, agent: str, epoch: int) -> bytes:
    unit = f"{file_id}|{agent}|{epoch}|".encode()
    return (unit * (PAYLOAD // len(unit) + 1))[:PAYLOAD]


class Run:
    """One capacity point, set up and run (see the module's docstring)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.profile = plan.store_profile()
        self.partitions = partitions_of(plan)
        self.sched = Scheduler(threads=plan.threads)
        self.bucket = f"capacity-{plan.seed}-{random.Random().getrandbits(48):012x}"
        self.layout = TaskLayout(TASK_ID)
        self.model = StoreModel(
            self.profile,
            self.sched,
            self.bucket,
            FAULTS if plan.faults else Faults(),
            classify=self._classify,
        )
        self.god = MemoryStore(self.bucket, PREFIX, clock=self.model.store_clock)
        self.log = OpLog()
        self.made = Made()
        self.declared = 0
        self.spread = False

    def _classify(self, full_key: str) -> str:
        return self.layout.parse(full_key[len(PREFIX) + 1 :]).kind

    def setup(self) -> None:
        settings: dict[str, Any] = {"spread": self.plan.spread}
        if self.plan.layout == "task":
            settings["layout"] = "task"
        elif self.plan.partitions == AUTO and self.plan.layout == "partitioned":
            settings["partitions"] = {STAGE: AUTO}
            settings["agents"] = self.plan.agents
        elif self.partitions > 1:
            settings["partitions"] = {STAGE: self.partitions}
        task = Task.create(self.god, TASK_ID, [STAGE], lease_seconds=LEASE, **settings)
        self.layout = TaskLayout.of(task.header)
        self.spread = bool(task.header.spread)
        assert self.partitions == len(task.shard_names(STAGE))
        n = entries_to_declare(self.plan, self.partitions)
        task.declare_many([(f"f{i:07d}", STAGE) for i in range(n)])
        self.declared = n

    def agent(self, i: int) -> None:
        plan, sched, made, log = self.plan, self.sched, self.made, self.log
        name = f"a{i:05d}"
        runtime = sched.runtime(f"{plan.seed}/{name}")
        store = ModelStore(self.model, runtime, f"{plan.seed}/{name}/store", PREFIX)
        while True:
            try:
                task = Task.open(store, TASK_ID)
                break
            except ObjManifestError as e:
                made.error(e)
                sched.sleep(0.5)
        made.tasks.append(task)
        me = task.agent(name)
        while True:
            began = sched.now
            made.busy[name] = [(checker.CLAIM_MANY, {"stage": STAGE})]
            try:
                claims = (
                    me.claim_many(STAGE, plan.batch)
                    if plan.batch > 1
                    else [c for c in [me.claim(stage=STAGE)] if c is not None]
                )
            except ObjManifestError as e:
                made.error(e)
                log.record(name, checker.CLAIM_MANY, UNKNOWN, stage=STAGE, detail=type(e).__name__)
                continue
            if not claims:
                made.ran_out += 1
                sched.sleep(1.0)
                continue
            for c in claims:
                log.record(name, checker.CLAIM, file_id=c.file_id, stage=STAGE, epoch=c.epoch)
            made.busy[name] = [
                (checker.PUT, {"file_id": c.file_id, "stage": STAGE, "epoch": c.epoch})
                for c in claims
            ]
            datas = [_content(c.file_id, name, c.epoch) for c in claims]
            if plan.batch > 1:
                results: list[Any] = me.put_many(claims, datas)
            else:
                try:
                    results = [me.put(claims[0], datas[0])]
                except ObjManifestError as e:
                    results = [e]
            done = 0
            for c, r in zip(claims, results, strict=True):
                fields = {"file_id": c.file_id, "stage": STAGE, "epoch": c.epoch}
                if isinstance(r, LeaseLost):
                    log.record(name, checker.PUT, REFUSED, detail="LeaseLost", **fields)
                    made.error(r)
                elif isinstance(r, BaseException):
                    log.record(name, checker.PUT, UNKNOWN, detail=type(r).__name__, **fields)
                    made.error(r)
                else:
                    log.record(name, checker.PUT, checksum=r.checksum, **fields)
                    done += 1
            made.busy.pop(name, None)
            made.ops.append((sched.now, sched.now - began, done))

    def run(self) -> dict[str, Any]:
        with _old_objects_left_alone():
            return self._run()

    def _run(self) -> dict[str, Any]:
        plan, sched = self.plan, self.sched
        wall0, cpu0 = time.monotonic(), time.process_time()
        self.setup()
        gc.collect()
        gc.freeze()  # what setup left is the store's: no collection need look at it again
        setup_s = time.monotonic() - wall0
        starts = random.Random(f"{plan.seed}/starts")
        for i in range(plan.agents):
            sched.spawn(lambda i=i: self.agent(i), f"a{i}", at=starts.uniform(0.0, plan.stagger))
        sched.run(plan.warmup)
        self.model.mark()
        before = [t.request_counts() for t in self.made.tasks]
        window = plan.window()
        sched.run(plan.warmup + window)
        after = [t.request_counts() for t in self.made.tasks]
        run_s = time.monotonic() - wall0 - setup_s
        counts = self.model.counts
        for name, ops in self.made.busy.items():  # stopped mid-call: outcome unknown
            for kind, fields in ops:
                self.log.record(
                    name, kind, UNKNOWN, detail="in flight when the run stopped", **fields
                )
        sched.shutdown()
        self.made.tasks.clear()  # the agents' caches, freed for the checker to use
        gc.collect()
        check0 = time.monotonic()
        task = Task.open(self.god, TASK_ID)
        violations = checker.check(task, self.log, settled=False)
        check_s = time.monotonic() - check0
        memory._BUCKETS.pop(self.bucket, None)
        return self.result(
            window,
            before,
            after,
            counts,
            violations,
            {
                "setup_s": round(setup_s, 1),
                "run_s": round(run_s, 1),
                "check_s": round(check_s, 1),
                "cpu_s": round(time.process_time() - cpu0, 1),
            },
        )

    def result(
        self,
        window: float,
        before: list[dict[str, int]],
        after: list[dict[str, int]],
        counts: Any,
        violations: list[checker.Violation],
        timing: dict[str, float],
    ) -> dict[str, Any]:
        plan, p = self.plan, self.profile
        start = plan.warmup
        ops = [(at, took, n) for at, took, n in self.made.ops if at > start]
        entries = sum(n for _, _, n in ops)
        latencies = [took for _, took, n in ops if n]
        commits = sum(a["commits"] - b.get("commits", 0) for a, b in self._pairs(before, after))
        conflicts = sum(
            a["conflicts"] - b.get("conflicts", 0) for a, b in self._pairs(before, after)
        )
        requests = counts.total
        dollars = (
            counts.billed_writes * p.prices.writes / 1000
            + counts.billed_reads * p.prices.reads / 1000
            + counts.bytes_up / 1e9 * p.prices.upload_gb
            + counts.bytes_down / 1e9 * p.prices.download_gb
        )
        by_kind: dict[str, int] = {}
        for what, n in counts.requests.items():
            by_kind[what] = by_kind.get(what, 0) + n
        out = {
            "profile": p.name,
            "agents": plan.agents,
            "partitions": self.partitions if plan.layout == "partitioned" else plan.layout,
            "layout": plan.layout,
            "spread": self.spread,
            "batch": plan.batch,
            "seed": plan.seed,
            "warmup": plan.warmup,
            "seconds": window,
            "entries": entries,
            "entries_per_s": round(entries / window, 1),
            "p50_s": _round(pct(latencies, 50)),
            "p99_s": _round(pct(latencies, 99)),
            "requests_per_entry": round(requests / entries, 3) if entries else None,
            "conflicts_per_commit": round(conflicts / commits, 3) if commits else None,
            "max_object_cas_per_s": self.model.max_object_cas_per_s,
            "max_prefix_requests_per_s": self.model.max_scope_requests_per_s,
            "dollars_per_million": round(dollars / entries * 1e6, 2) if entries else None,
            "violations": len(violations),
            "limits": {
                "object_cas_per_s": p.cas_per_object,
                "scopes": [asdict(limit) for limit in p.limits],
            },
            "requests": requests,
            "throttled": counts.throttled,
            "busy": counts.busy,
            "stale": counts.stale,
            "retries": counts.retries,
            "faults": dict(counts.faults),
            "errors": self.made.errors,
            "ran_out": self.made.ran_out,
            "declared": self.declared,
            "by_request": dict(sorted(by_kind.items())),
            "invariants": checker.summary(violations),
            "violation_examples": [str(v) for v in violations[:5]],
            "escaped": self.sched.errors[:5],
            "events": self.sched.events,
            "threads": self.sched.threads_made,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            **timing,
        }
        out["limited_by"] = limited_by(out, p)
        return out

    @staticmethod
    def _pairs(
        before: list[dict[str, int]], after: list[dict[str, int]]
    ) -> list[tuple[dict[str, int], dict[str, int]]]:
        padded = before + [{}] * (len(after) - len(before))
        return list(zip(after, padded, strict=True))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def limited_by(r: dict[str, Any], p: Profile) -> str:
    """What held the point back, in words, from its counts."""
    requests = r["requests"] or 1
    if r["throttled"] / requests > 0.01:
        return (
            "request rate of a prefix (throttled)"
            if any(lim.scope == "prefix" for lim in p.limits)
            else "request rate of the bucket (throttled)"
        )
    conflicts = r["conflicts_per_commit"] or 0.0
    if p.cas_per_object and r["max_object_cas_per_s"] >= 0.9 * p.cas_per_object and conflicts > 0.2:
        return "conditional writes per object (too few partitions)"
    if conflicts > 0.2:
        return "lost races (agents share partitions)"
    if r["ran_out"]:
        return "entries ran out"
    return "the agents' own round trips"


@contextlib.contextmanager
def _old_objects_left_alone() -> Iterator[None]:
    """Only young objects collected while a point runs. Every full collection walks every
    object alive, and a point of thousands of agents holds millions of them (shards,
    journals, caches), so full collections as the heap grows would cost far more than the
    agents themselves; young cycles (lost races' exceptions, futures) are still collected."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def run(plan: Plan) -> dict[str, Any]:
    return Run(plan).run()


KEYS = (
    "entries_per_s",
    "p50_s",
    "p99_s",
    "requests_per_entry",
    "conflicts_per_commit",
    "max_object_cas_per_s",
    "max_prefix_requests_per_s",
    "dollars_per_million",
    "violations",
)
