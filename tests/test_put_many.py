"""``Agent.put_many``: the data of many claims goes up in parallel, then one commit per
shard makes them ready; each claim gets its own result (a fenced one ``LeaseLost``, a
failed upload its error) while the others still become ready. On every backend; the
exactly-once race runs agent processes against the S3 servers."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

import objmanifest as om
from objmanifest.core import checksum
from tests.support.breaking import BreakingFile
from tests.support.internals import engine
from tests.support.stores import Server
from tests.test_races import WORKER, Worker

MiB = 1024 * 1024
PART = 5 * MiB


def wait_expired(task: om.Task, *claims: om.Claim) -> None:
    """Sleep until the store's clock is past every claim's lease (as its entry has it now)
    and the 2 s margin."""
    expiry = max(task.entry(c.file_id).lease_expires_at or c.lease_expires_at for c in claims)
    deadline = time.monotonic() + 60
    while task.store.now() <= expiry + timedelta(seconds=2.2):
        assert time.monotonic() < deadline, "the lease never expired on the store's clock"
        time.sleep(0.1)


def data_of(claim: om.Claim) -> bytes:
    return f"{claim.file_id}|{claim.agent}|{claim.epoch}".encode()


def data_keys(store: om.ObjectStore, task_id: str = "job") -> list[str]:
    return sorted(k for k in store.list_keys(f"{task_id}/data/"))


def recorder(task: om.Task) -> list[om.CommitEvent]:
    seen: list[om.CommitEvent] = []
    task.subscribe(seen.append)
    return seen


# -- the batch, its commits and its data ---------------------------------------------------


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_a_batch_of_100_becomes_ready_with_one_shard_commit(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect", "write"], lease_seconds=300)
    ids = [f"raw/{i:03d}.json" for i in range(100)]
    task.declare_many([(fid, "collect") for fid in ids])
    seen = recorder(task)
    before = engine(task).docs.stats.commits
    agent = task.agent("w")

    claims = agent.claim_many("collect", limit=100)
    results = agent.put_many(claims, [data_of(c) for c in claims])

    assert engine(task).docs.stats.commits - before == 2, "claim_many + one finish_many"
    assert [(e.command, e.key, e.actor) for e in seen] == [
        ("claim_many", "job/shards/collect.json", "w"),
        ("finish_many", "job/shards/collect.json", "w"),
    ]
    moves = [(t.item, t.before, t.after, t.epoch) for t in seen[1].transitions]
    assert sorted(moves) == [(fid, "writing", "ready", 1) for fid in ids]
    assert [r.file_id if isinstance(r, om.Entry) else r for r in results] == ids
    for claim, entry in zip(claims, results, strict=True):
        assert isinstance(entry, om.Entry)
        data = data_of(claim)
        assert (entry.state, entry.owner, entry.epoch) == (om.State.ready, "w", 1)
        assert entry.key == f"job/data/collect/{claim.file_id}@1"
        assert (entry.checksum, entry.size) == (checksum.of_bytes(data), len(data))
    assert data_keys(store) == sorted(f"job/data/collect/{fid}@1" for fid in ids)

    fresh = om.Task.open(store, "job")
    assert {e.state for e in fresh.entries("collect")} == {om.State.ready}
    reader = fresh.agent("reader")
    for claim in claims:
        assert reader.consume(claim.file_id) == data_of(claim)
    history = fresh.history(ids[7])
    assert [(h.command, h.to_state) for h in history][-3:] == [
        ("claim_many", "writing"),
        ("finish_many", "ready"),
        ("consume", "consumed"),
    ]

    # The same batch again is a no-op that returns the entries: nothing is written.
    again = task.agent("w").put_many(claims, [data_of(c) for c in claims])
    assert [r.state if isinstance(r, om.Entry) else r for r in again] == [om.State.consumed] * 100
    assert engine(task).docs.stats.commits - before == 2


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_claims_of_several_shards_get_one_commit_each(task: om.Task) -> None:
    task.declare_many([("a1", "collect"), ("a2", "collect"), ("b1", "write"), ("b2", "write")])
    agent = task.agent("w")
    claims = agent.claim_many("write", limit=5) + agent.claim_many("collect", limit=5)
    mixed = [claims[0], claims[2], claims[1], claims[3]]  # b1, a1, b2, a2
    seen = recorder(task)
    results = agent.put_many(mixed, [data_of(c) for c in mixed])
    assert [r.file_id if isinstance(r, om.Entry) else r for r in results] == [
        "b1",
        "a1",
        "b2",
        "a2",
    ]
    # One commit per shard; the two go out in parallel, so in either order.
    assert sorted((e.command, e.key, sorted(t.item for t in e.transitions)) for e in seen) == [
        ("finish_many", "job/shards/collect.json", ["a1", "a2"]),
        ("finish_many", "job/shards/write.json", ["b1", "b2"]),
    ]
    assert {e.stage: e.key for e in results if isinstance(e, om.Entry)} == {
        "write": "job/data/write/b2@1",
        "collect": "job/data/collect/a2@1",
    }


# -- one claim's trouble stays its own -----------------------------------------------------


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_a_fenced_claim_gets_lease_lost_in_its_slot_while_the_others_become_ready(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(store, "job", stages=["collect"], lease_seconds=1, max_retries=3)
    task.declare_many([("a", "collect"), ("b", "collect"), ("c", "collect")])
    slow = task.agent("slow")
    claims = slow.claim_many("collect", limit=3)
    assert [(c.file_id, c.epoch) for c in claims] == [("a", 1), ("b", 1), ("c", 1)]
    wait_expired(task, *claims)
    rescuer = task.agent("rescuer")
    taken = rescuer.claim("b")  # a takeover: slow's claim on b is fenced
    assert taken is not None and taken.epoch == 2
    seen = recorder(task)

    results = slow.put_many(claims, [b"slow a", b"slow b", b"slow c"])

    assert isinstance(results[0], om.Entry) and isinstance(results[2], om.Entry)
    assert (results[0].state, results[0].epoch, results[0].owner) == (om.State.ready, 1, "slow")
    assert (results[2].state, results[2].key) == (om.State.ready, "job/data/collect/c@1")
    lost = results[1]
    assert isinstance(lost, om.LeaseLost)
    assert str(lost) == (
        "lease on 'b' (epoch 1, agent slow) is lost: the entry is now writing at epoch 2, held "
        "by rescuer. Stop working on it; claim it again if it is still wanted."
    )
    b = task.entry("b")
    assert (b.state, b.epoch, b.owner, b.key) == (om.State.writing, 2, "rescuer", None)
    finishes = [e for e in seen if e.command == "finish_many"]
    assert len(finishes) == 1
    assert sorted(t.item for t in finishes[0].transitions) == ["a", "c"]
    # The fenced holder's bytes are gone: no entry can ever point at them.
    assert data_keys(store) == ["job/data/collect/a@1", "job/data/collect/c@1"]

    assert rescuer.put(taken, b"rescued b").key == "job/data/collect/b@2"
    reader = om.Task.open(store, "job").agent("reader")
    assert [reader.consume(f) for f in "abc"] == [b"slow a", b"rescued b", b"slow c"]


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_an_upload_that_fails_is_that_claims_error_and_it_stays_held(
    task: om.Task, tmp_path: Path
) -> None:
    task.declare_many([("a", "collect"), ("b", "collect"), ("c", "collect")])
    agent = task.agent("w")
    claims = agent.claim_many("collect", limit=3)
    good = tmp_path / "c.bin"
    good.write_bytes(b"from a file")
    missing = tmp_path / "nope.bin"

    results = agent.put_many(claims, [b"bytes of a", missing, good])

    assert isinstance(results[1], FileNotFoundError)
    assert str(results[1]) == f"cannot read {str(missing)!r}: no such file"
    assert [r.state for r in (results[0], results[2]) if isinstance(r, om.Entry)] == [
        om.State.ready,
        om.State.ready,
    ]
    b = task.entry("b")
    assert (b.state, b.owner, b.epoch) == (om.State.writing, "w", 1), "still held: put it again"
    assert agent.put_many([claims[1]], [b"bytes of b"])[0] == task.entry("b")
    reader = task.agent("reader")
    assert [reader.consume(f) for f in "abc"] == [b"bytes of a", b"bytes of b", b"from a file"]


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_chunked_data_goes_up_in_parts_and_is_finished_with_the_rest_in_one_commit(
    task: om.Task,
) -> None:
    task.declare_many([("small", "collect"), ("big1", "collect"), ("big2", "collect")])
    agent = task.agent("w")
    claims = agent.claim_many("collect", limit=3)
    big1, big2 = b"1" * (PART + 10), b"2" * (PART + 20)
    seen = recorder(task)

    results = agent.put_many(claims, [b"x", big1, big2], threshold=1, part_size=PART, concurrency=3)

    small, e1, e2 = results
    assert isinstance(small, om.Entry) and isinstance(e1, om.Entry) and isinstance(e2, om.Entry)
    assert not small.is_chunked and e1.is_chunked and e2.is_chunked
    assert (e1.size, e2.size, e1.part_size) == (PART + 10, PART + 20, PART)
    assert checksum.is_composite(e1.checksum) and not checksum.is_composite(small.checksum)
    shard_commits = [e.command for e in seen if e.key == "job/shards/collect.json"]
    assert shard_commits == ["finish_many"]
    assert list(task.store.list_uploads("")) == [], "every upload completed"
    reader = task.agent("reader")
    assert [reader.consume(f) for f in ("small", "big1", "big2")] == [b"x", big1, big2]


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_an_entry_taken_over_and_made_ready_as_one_object_has_the_old_upload_aborted(
    store: om.ObjectStore,
) -> None:
    """The side effects of the transitions run from the batch's commit event too."""
    task = om.Task.create(store, "job", stages=["make"], lease_seconds=1.5, max_retries=2)
    task.declare_many([("big", "make"), ("other", "make")])
    producer = task.agent("producer")
    crashed = producer.claim("big")
    assert crashed is not None
    data = bytes(range(256)) * (3 * PART // 256)
    with pytest.raises(OSError, match="disk failed"):
        producer.put(
            crashed,
            BreakingFile(data, PART, "the producer's disk failed"),  # type: ignore[arg-type]
            part_size=PART,
            threshold=MiB,
            concurrency=1,
        )
    assert [k for k, _ in store.list_uploads("") if "big" in k] != [], "no upload left open"
    wait_expired(task, crashed)
    rescuer = task.agent("rescuer")
    claims = rescuer.claim_many("make", limit=2)
    assert [(c.file_id, c.epoch) for c in claims] == [("big", 2), ("other", 1)]
    results = rescuer.put_many(claims, [b"small now", b"other"])
    assert [r.state for r in results if isinstance(r, om.Entry)] == [om.State.ready] * 2
    assert [k for k, _ in store.list_uploads("") if "big" in k] == []


# -- bad input: refused before anything is sent ------------------------------------------


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_bad_batches_are_refused_before_anything_is_written(task: om.Task) -> None:
    task.declare_many([("a", "collect"), ("b", "collect")])
    agent = task.agent("w")
    a, b = agent.claim_many("collect", limit=2)
    other = om.Task.create(task.store, "other", stages=["collect"])
    other.declare("a", stage="collect")
    foreign_task = other.agent("w").claim("a")
    assert foreign_task is not None
    before = engine(task).docs.stats.commits

    def refused(error: type[Exception], message: str, claims: object, datas: object) -> None:
        with pytest.raises(error) as caught:
            agent.put_many(claims, datas)  # type: ignore[arg-type]
        assert str(caught.value) == message

    refused(
        om.InvalidInput,
        "put_many() got 2 claims and 1 datas: give one data per claim, in the same order",
        [a, b],
        [b"a"],
    )
    refused(
        om.InvalidInput,
        "claims[0] and claims[1] are both on 'a': give each entry once per batch",
        [a, a],
        [b"1", b"2"],
    )
    with pytest.raises(om.InvalidInput) as foreign:
        task.agent("eve").put_many([b], [b"2"])
    assert str(foreign.value) == (
        "claims[0] on 'b' belongs to agent 'w' of task 'job', not to 'eve' of 'job': call "
        "put_many() on the agent that claimed it"
    )
    refused(
        om.InvalidInput,
        "claims[1] on 'a' belongs to agent 'w' of task 'other', not to 'w' of 'job': call "
        "put_many() on the agent that claimed it",
        [b, foreign_task],
        [b"1", b"2"],
    )
    refused(
        om.InvalidInput,
        "put_many() takes a list of claims, not one Claim: wrap it in a list ([...]), or call "
        "put() for one entry",
        a,
        [b"1"],
    )
    refused(
        om.InvalidInput,
        "put_many() takes a list of datas, one per claim, not one bytes: wrap it in a list "
        "([...]), or call put() for one entry",
        [a],
        b"1",
    )
    refused(
        TypeError,
        "claims[1] is a str, not a Claim: pass the claims claim() or claim_many() returned",
        [a, "b"],
        [b"1", b"2"],
    )
    refused(
        TypeError,
        "put_many() (datas[1], for 'b') takes bytes (the data), a path (str or os.PathLike) "
        "or a binary file object, not int",
        [a, b],
        [b"1", 2],
    )
    assert engine(task).docs.stats.commits == before
    assert data_keys(task.store) == []
    assert {e.state for e in task.entries("collect")} == {om.State.writing}
    assert agent.put_many([], []) == []
    assert engine(task).docs.stats.commits == before


# -- exactly once, under contention, with real processes -----------------------------------


@pytest.mark.one_server  # the suites race writers on every store
@pytest.mark.heavy
def test_racing_batch_producers_make_each_entry_ready_exactly_once(
    server: Server, store: om.ObjectStore
) -> None:
    stage, limit = "collect", 10
    task = om.Task.create(store, "job", stages=[stage], lease_seconds=300, max_retries=2)
    ids = [f"item-{i:03d}" for i in range(200)]
    task.declare_many([(fid, stage) for fid in ids])
    workers: list[Worker] = []
    try:
        for i in range(4):
            cmd = [
                *(sys.executable, str(WORKER), "--bucket", store.bucket, "--prefix", store.prefix),
                *("--task", "job", "--name", f"batcher-{i}", "--wait-go", "--max-seconds", "120"),
                *("produce-many", "--stage", stage, "--limit", str(limit)),
            ]
            env = {**os.environ, **server.env, "PYTHONUNBUFFERED": "1"}
            workers.append(Worker(cmd, env, f"batcher-{i}"))
        for w in workers:
            w.next("waiting", timeout=60)
        for w in workers:  # released together, so their commits race
            w.send("go")
        lines = {w.name: w.finish(timeout=180) for w in workers}
    finally:
        for w in workers:
            w.kill()

    produced: dict[str, list[tuple[str, int]]] = {}
    conflicts = 0
    for name, out in lines.items():
        assert [x for x in out if x["event"] == "error"] == [], name
        for x in out:
            if x["event"] == "produced":
                produced.setdefault(x["file_id"], []).append((name, x["epoch"]))
        (done,) = [x for x in out if x["event"] == "done"]
        conflicts += done["stats"]["conflicts"]
        # One claim_many and one finish_many per batch: never a commit per entry.
        assert done["stats"]["commits"] == 2 * done["batches"], name
        assert done["produced"] <= limit * done["batches"]
    assert sorted(produced) == ids, "every entry produced"
    assert [fid for fid, by in produced.items() if len(by) > 1] == [], "none twice"
    assert conflicts > 0, "the producers never raced: the test proved nothing"

    fresh = om.Task.open(server.connect(store.prefix), "job")
    reader = fresh.agent("reader")
    for entry in fresh.entries(stage):
        ((name, epoch),) = produced[entry.file_id]
        data = f"{entry.file_id}|{name}|{epoch}".encode()
        assert (entry.state, entry.owner, entry.epoch) == (om.State.ready, name, 1)
        assert entry.key == f"job/data/{stage}/{entry.file_id}@1"
        assert (entry.checksum, entry.size) == (checksum.of_bytes(data), len(data))
        assert reader.consume(entry.file_id) == data
    finishes = [r for r in fresh.log() if r.command == "finish_many"]
    assert sum(len(r.transitions) for r in finishes) == len(ids)
    assert Counter(t.item for r in finishes for t in r.transitions) == Counter(ids)
