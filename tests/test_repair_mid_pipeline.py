"""Repair: each kind of manifest object deleted or damaged mid-pipeline, rebuilt from the
journal (a shard) or the shards (the index), the damaged bytes kept aside, old claims
fenced, and the pipeline then finished. Run on every backend."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest

import objmanifest as om
from objmanifest.cas.blocks import BLOCK
from objmanifest.ops.replay import RECORDS_AT_RISK
from objmanifest.store.errors import NoSuchObject
from tests.support.internals import engine
from tests.support.rawstore import delete as raw_delete
from tests.support.rawstore import get as raw_get
from tests.support.rawstore import put as raw_put

pytestmark = pytest.mark.behaviour

COLLECT = [f"c{i:02d}" for i in range(16)]
WRITE = ["w0", "w1", "w2"]


@dataclass
class Pipeline:
    """A task stopped mid-pipeline: which claims are out, and the data of each entry."""

    task: om.Task
    taken_over: om.Claim  # c12, epoch 1 (a): fenced by the takeover
    holder: om.Claim  # c12, epoch 2 (b): writing when the journal's block ended
    late: om.Claim  # c13, epoch 1 (slow): claimed after the last journal block
    data: dict[str, bytes]


def wait_expired(task: om.Task, claim: om.Claim) -> None:
    while task.store.now() <= claim.lease_expires_at + timedelta(seconds=2.2):
        time.sleep(0.25)


def mid_pipeline(store: om.ObjectStore) -> Pipeline:
    """Versions 1..32 of the collect shard reach a journal block: a declaration, a takeover,
    twelve entries produced, five consumed. Versions 33.. (a claim, a produced entry, a
    consumption) live only in the shard itself."""
    # A lease of 4 s: short enough to wait out once, long enough that no put's background
    # renewal (every third of it) adds a version on a busy machine.
    task = om.Task.create(store, "job", stages=["collect", "write"], lease_seconds=4, max_retries=2)
    task.declare_many(
        [
            {"file_id": f, "stage": "collect", "consumers": ["checker"] if f == "c00" else []}
            for f in COLLECT
        ]
    )
    task.declare_many(
        [{"file_id": w, "stage": "write", "depends_on": [f"c0{i}"]} for i, w in enumerate(WRITE)]
    )
    a, b, slow = task.agent("a"), task.agent("b"), task.agent("slow")
    checker = task.agent("checker")
    data = {f: f"bytes of {f}".encode() for f in [*COLLECT, *WRITE]}
    first = a.claim("c12")  # v2
    assert first is not None
    wait_expired(task, first)
    second = b.claim("c12")  # v3: a takeover, epoch 2
    assert second is not None and second.epoch == 2
    for f in COLLECT[:12]:  # v4..v27
        claim = a.claim(f)
        assert claim is not None
        a.put(claim, data[f])
    checker.consume("c00")  # v28 (a named consumer)
    for f in COLLECT[1:5]:  # v29..v32
        b.consume(f)
    assert task.shard("collect").version == BLOCK
    task.flush_journal()
    late = slow.claim("c13")  # v33
    assert late is not None
    produced = a.claim("c14")
    assert produced is not None
    a.put(produced, data["c14"])  # v34, v35
    b.consume("c05")  # v36
    return Pipeline(task, first, second, late, data)


def finish_pipeline(task: om.Task, data: dict[str, bytes]) -> None:
    """Produce what is left, consume everything: each consume verifies the bytes."""
    worker = task.agent("after")
    for stage in ("collect", "write"):
        for entry in task.entries(stage):
            if entry.state in (om.State.pending, om.State.failed):
                claim = worker.claim(entry.file_id)
                assert claim is not None and claim.epoch > entry.epoch
                worker.put(claim, data[entry.file_id])
    for stage in ("collect", "write"):
        for entry in task.entries(stage):
            if entry.state is om.State.ready:
                role = entry.consumers[0] if entry.consumers else "after"
                got = task.agent(role).consume(entry.file_id)
                assert got == data[entry.file_id]
    status = task.status()
    assert status.finished and status.totals["consumed"] == len(COLLECT) + len(WRITE)
    assert status.unindexed == [] and status.unfinished == []


def assert_fenced(task: om.Task, *claims: om.Claim) -> None:
    for claim in claims:
        holder = task.agent(claim.agent)
        with pytest.raises(om.LeaseLost):
            holder.renew(claim)
        with pytest.raises(om.LeaseLost):
            holder.put(claim, b"late bytes of a fenced holder")


def damage(store: om.ObjectStore, key: str, how: str) -> bytes | None:
    """Damage ``key``; returns the bytes now there (None: deleted)."""
    if how == "delete":
        raw_delete(store, key)
        return None
    if how == "garble":
        body = raw_get(store, key)[:-7] + b"garbage"
    else:  # reshape: valid JSON, an entry of no known state; its journal still readable
        doc = json.loads(raw_get(store, key))
        doc["entries"]["c13"]["state"] = "lost-in-space"
        body = json.dumps(doc).encode()
    raw_put(store, key, body)
    return body


@pytest.mark.parametrize("how", ["delete", "garble", "reshape"])
@pytest.mark.stage_layout
def test_a_damaged_shard_is_rebuilt_from_its_journal(store: om.ObjectStore, how: str) -> None:
    p = mid_pipeline(store)
    task = p.task
    key = engine(task).shard_key("collect")
    damaged = damage(store, key, how)
    reopened = om.Task.open(store, "job")

    dry = reopened.repair(dry_run=True)
    assert dry.dry_run and [o.action for o in dry.objects] == ["would rebuild"]
    if damaged is None:
        with pytest.raises(NoSuchObject):
            store.head(key)
    else:
        assert raw_get(store, key) == damaged

    report = reopened.repair()
    (obj,) = report.objects
    assert (obj.key, obj.kind, obj.action) == (key, "shard", "rebuilt")
    assert obj.damage == ("deleted" if how == "delete" else "corrupt")
    assert report.added == ()
    if damaged is None:
        assert obj.moved_to is None
    else:
        assert obj.moved_to is not None and obj.moved_to.startswith("job/damaged/shards/")
        assert raw_get(store, obj.moved_to) == damaged  # the bytes are kept, aside
    complete = how == "reshape"  # its own records were still readable
    assert obj.journal_complete is complete
    assert obj.records == (36 if complete else BLOCK)
    restored = {e.file_id: e for e in obj.entries}
    assert sorted(restored) == COLLECT
    assert {f for f, e in restored.items() if e.state == "consumed"} >= set(COLLECT[:5])
    assert all(restored[f].state == "ready" and restored[f].epoch == 1 for f in COLLECT[6:12])
    # c12 was writing (b, epoch 2): fenced, claimable again above every epoch seen.
    assert restored["c12"].seen_state == "writing" and restored["c12"].state == "failed"
    margin = 0 if complete else RECORDS_AT_RISK
    assert restored["c12"].epoch == 2 + 1 + margin
    if complete:
        assert restored["c13"].seen_state == "writing" and restored["c13"].state == "failed"
        assert restored["c14"].state == "ready" and restored["c05"].state == "consumed"
    else:  # lost with the shard: slow's claim of c13, c14's production, c05's consumption
        assert restored["c13"].seen_state == "pending" and restored["c13"].epoch > 1
        assert restored["c14"].state == "pending" and restored["c14"].epoch > 1
        assert restored["c05"].state == "ready"
    entry = reopened.entry("c00")
    assert entry.consumers == ("checker",) and entry.consumed_by == ("checker",)

    assert_fenced(reopened, p.taken_over, p.holder, p.late)
    assert reopened.history("c12")[-1].command == "repair"
    assert reopened.repair().clean
    finish_pipeline(reopened, p.data)


TIMES = ("claimed_at", "ready_at", "retry_at")


@pytest.mark.stage_layout
def test_a_rebuilt_shard_keeps_claim_ready_and_retry_times(store: om.ObjectStore) -> None:
    """Deadlines count from ``claimed_at`` and ``ready_at``, a backoff ends at ``retry_at``:
    a shard deleted and rebuilt from its journal keeps each, so none starts over."""
    task = om.Task.create(
        store,
        "job",
        stages=["collect", "write"],
        lease_seconds=600,
        retry_backoff=3600,
        deadlines={"collect": 1800},
    )
    task.declare_many([{"file_id": f, "stage": "collect"} for f in ("r", "c", "f", "w")])
    a = task.agent("a")
    for f in ("r", "c"):
        claim = a.claim(f)
        assert claim is not None
        a.put(claim, f"bytes of {f}".encode())
    task.agent("reader").consume("c")
    failing = a.claim("f")
    assert failing is not None
    a.fail(failing, "boom")
    held = a.claim("w")
    assert held is not None
    while task.shard("collect").version < BLOCK:  # renewals, until a journal block is whole
        held = a.renew(held)
    task.flush_journal()
    before = {f: task.entry(f) for f in ("r", "c", "f", "w")}
    assert all(before[f].ready_at is not None for f in ("r", "c"))
    assert before["f"].retry_at is not None and before["w"].claimed_at is not None

    damage(store, engine(task).shard_key("collect"), "delete")
    reopened = om.Task.open(store, "job")
    (obj,) = reopened.repair().objects
    assert obj.action == "rebuilt" and obj.records == BLOCK
    after = {f: reopened.entry(f) for f in before}
    for f in ("r", "c", "f"):
        assert after[f].state is before[f].state, f
        assert [getattr(after[f], t) for t in TIMES] == [getattr(before[f], t) for t in TIMES]
    # The fenced holder's entry is failed, claimable at once, and remembers its claim.
    assert after["w"].state is om.State.failed and after["w"].retry_at is None
    assert after["w"].claimed_at == before["w"].claimed_at
    with pytest.raises(om.NotClaimable, match="backing off until"):
        reopened.agent("b").claim("f")
    # Rebuilt again (the repair's own record carries the times): still the same.
    damage(store, engine(reopened).shard_key("collect"), "garble")
    again = om.Task.open(store, "job")
    again.repair()
    for f in ("r", "c", "f"):
        assert [getattr(again.entry(f), t) for t in TIMES] == [getattr(before[f], t) for t in TIMES]


@pytest.mark.parametrize("how", ["delete", "garble"])
@pytest.mark.stage_layout
def test_a_damaged_index_is_rebuilt_from_the_shards(store: om.ObjectStore, how: str) -> None:
    p = mid_pipeline(store)
    key = engine(p.task).index_key
    damaged = damage(store, key, how)
    reopened = om.Task.open(store, "job")
    assert [o.action for o in reopened.repair(dry_run=True).objects] == ["would rebuild"]

    report = reopened.repair()
    (obj,) = report.objects
    assert (obj.key, obj.kind, obj.action) == (key, "index", "rebuilt")
    assert sorted(obj.indexed) == sorted([*COLLECT, *WRITE]) and obj.not_restored == ()
    if damaged is not None:
        assert obj.moved_to is not None and raw_get(store, obj.moved_to) == damaged
    index = reopened.index()
    assert index.dependencies("w1") == frozenset({"c01"})
    assert index.stage_of("c13") == "collect"
    assert reopened.repair().clean
    # Nothing in the shards changed: the holders of c12 and c13 keep their claims.
    assert_fenced(reopened, p.taken_over)
    reopened.agent("slow").put(p.late, p.data["c13"])
    reopened.agent("b").put(p.holder, p.data["c12"])
    finish_pipeline(reopened, p.data)


@pytest.mark.stage_layout
def test_an_object_of_a_newer_release_is_left_alone(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect"])
    task.declare("x", "collect")
    key = engine(task).shard_key("collect")
    body = json.dumps({"schema_version": 99, "task_id": "job", "stage": "collect"}).encode()
    raw_put(store, key, body)
    (obj,) = task.repair().objects
    assert (obj.damage, obj.action, obj.moved_to) == ("newer", "left alone", None)
    assert raw_get(store, key) == body
