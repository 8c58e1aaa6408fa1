"""Size: a warm commit (``agent.renew``: build and encode the shard, one conditional PUT)
in a stage of 1k, 10k and 100k entries, held in one shard, split into partitions of 1k
entries each, and with all but 1k of them archived (``task.archive``); and how long
``declare_many`` of the stage took. Beside each, what encoding the committed shard costs
after one entry changed: the task's codec (which reuses the JSON of the entries it encoded
before) next to pydantic's ``model_dump_json`` of the whole shard, the encoding every
commit paid before it.

    python -m bench --only size
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import objmanifest as om
from bench.common import Bench, create_task, fmt, layout_support, ms, new_prefix, pct, say
from objmanifest.cas.blocks import BLOCK
from objmanifest.core.model import Shard
from tests.support.faults import FaultProxy
from tests.support.internals import engine

PER_PARTITION = 1_000
LIVE = 1_000


@dataclass
class _Setup:
    layout: str
    entries: int
    task: om.Task
    agent: om.Agent
    claim: om.Claim
    declare_s: float
    first_s: float = 0.0
    """The first commit after the declaration (its version still carries the record)."""
    times: list[float] = field(default_factory=list)

    def commit(self) -> float:
        t0 = time.perf_counter()
        self.claim = self.agent.renew(self.claim)
        return time.perf_counter() - t0


def _declare(task: om.Task, n: int) -> float:
    t0 = time.perf_counter()
    task.declare_many([(f"s/{i:06d}", "s") for i in range(n)])
    return time.perf_counter() - t0


def setup(b: Bench, layout: str, n: int) -> _Setup:
    """A task whose stage has ``n`` entries in ``layout``, and a claim in it, warm and
    steady: a commit's version carries the journal records not yet in a block (the
    declaration's record names every entry declared, the claim's, reap's and archive's
    every entry they moved); once a block holds them (``BLOCK`` versions later) they leave
    the object, as in a task that has been running a while."""
    prefix = new_prefix(f"size-{layout}-{n}")
    store = b.store(prefix)
    parts = max(1, n // PER_PARTITION) if layout == "partitioned" else 1
    if layout == "archived":
        # Every entry but LIVE dies (claimed, then reaped with no retries left by an agent
        # whose store's clock is an hour later, past every lease), then goes to archive
        # objects; the live entries stay as they were.
        task = create_task(store, "bench", ["s"], "stage", lease_seconds=600, max_retries=0)
        declared = _declare(task, n)
        if n > LIVE:
            task.agent("doomed").claim_many("s", limit=n - LIVE)
            with FaultProxy(b.endpoint_url, date_offset=3600, keep_upstream=True) as later:
                reaper = om.Task.open(b.store(prefix, endpoint=later.endpoint_url), "bench")
                reaper.reap()
                reaper.archive(older_than=0)
    else:
        task = create_task(store, "bench", ["s"], layout, parts, lease_seconds=600)
        declared = _declare(task, n)
    agent = task.agent("bench")
    claim = agent.claim(stage="s")
    assert claim is not None
    s = _Setup(layout, n, task, agent, claim, declared)
    s.first_s = s.commit()
    for _ in range(BLOCK + 2):
        s.commit()
    task.flush_journal()
    return s


def encode_times(codec: Any, doc: Shard, rounds: int = 5) -> tuple[float, float]:
    """Median seconds to encode ``doc`` after one entry changed: by ``codec`` (warm: it
    encoded the version before), and whole by pydantic; in turns, a new change each."""
    live = [e for e in doc.entries.values() if e.state is om.State.pending] or list(
        doc.entries.values()
    )
    codec.encode(doc)
    warm, whole = [], []
    for i in range(rounds):
        one = live[i % len(live)]
        doc = doc.with_entries({one.file_id: one.model_copy(update={"retry_count": i + 1})})
        t0 = time.perf_counter()
        codec.encode(doc)
        t1 = time.perf_counter()
        doc.model_dump_json(exclude_none=True).encode()
        t2 = time.perf_counter()
        warm.append(t1 - t0)
        whole.append(t2 - t1)
    return statistics.median(warm), statistics.median(whole)


def run(b: Bench, sizes: list[int], rounds: int = 20) -> dict[str, Any]:
    """Set every task up first, then time their commits in turns (one commit of each per
    round), so that a change in the machine's load falls on all of them alike."""
    support = layout_support()
    layouts = ["stage", "archived"] + (["partitioned"] if support["partitioned"] else [])
    setups = []
    for layout in layouts:
        for n in sizes:
            if layout != "stage" and n <= LIVE:
                continue  # the same single shard of 1k entries as "stage"
            setups.append(setup(b, layout, n))
            say(f"size: {layout} {n} set up (declare_many {setups[-1].declare_s:.2f} s)")
    for _ in range(rounds):
        for s in setups:
            s.times.append(s.commit())
    points = []
    for s in setups:
        shard = s.claim.shard
        current = engine(s.task).read_shard(shard)
        encode_s, whole_s = encode_times(engine(s.task).codec(shard), current)
        point = {
            "layout": s.layout,
            "entries": s.entries,
            "shards": len(engine(s.task).layout.shards_of("s")),
            "rounds": rounds,
            "commit_median_ms": ms(statistics.median(s.times)),
            "commit_p90_ms": ms(pct(s.times, 90)),
            "shard_bytes": len(engine(s.task).codec(shard).encode(current)),
            "live": len(current.entries),
            "archived": len(current.archived or {}),
            "declare_s": round(s.declare_s, 2),
            "first_commit_ms": ms(s.first_s),
            "encode_ms": ms(encode_s),
            "encode_whole_ms": ms(whole_s),
        }
        points.append(point)
        say(
            f"size {s.layout:11} {s.entries:>6} entries, {point['shards']:>3} shards, "
            f"{point['live']:>6} live in the committed shard "
            f"({point['shard_bytes'] / 1024:.0f} KB): commit {fmt(point['commit_median_ms'])} "
            f"ms (p90 {fmt(point['commit_p90_ms'])}); declare_many {s.declare_s:.2f} s; "
            f"encode after one change {fmt(point['encode_ms'])} ms "
            f"(whole, pydantic: {fmt(point['encode_whole_ms'])} ms)"
        )
    return {"points": points, "per_partition": PER_PARTITION, "live_after_archive": LIVE}
