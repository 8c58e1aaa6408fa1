"""The reads a reader that keeps a task open builds on (the web page, ``log -f``,
``AsyncTask.wait``), on every backend: shard names with no request, shards read fresh or as
last read, each stage's new journal records since a cursor, the log and an entry's history
since a cursor, what retention dropped of one stage, and a wait's plan."""

from __future__ import annotations

import pytest

import objmanifest as om
from objmanifest.cas.blocks import BLOCK
from objmanifest.core.pacing import Pace
from tests.support import rawstore
from tests.support.rawstore import requests

pytestmark = pytest.mark.behaviour


def made(store: om.ObjectStore, **kw: object) -> om.Task:
    """A task of two stages, ``collect`` split in two partitions (unless ``kw`` says)."""
    options: dict[str, object] = {"partitions": {"collect": 2}, **kw}
    return om.Task.create(store, "job", stages=["collect", "write"], **options)  # type: ignore[arg-type]


def produce(task: om.Task, file_id: str, agent: str = "p") -> om.Entry:
    producer = task.agent(agent)
    claim = producer.claim(file_id)
    assert claim is not None
    return producer.put(claim, f"data of {file_id}".encode())


def test_shard_names_cost_no_request_and_name_where_an_entry_lives(
    store: om.ObjectStore,
) -> None:
    task = made(store)
    task.declare_many([(f"f{i}", "collect") for i in range(8)])
    claims = task.agent("p").claim_many("collect", limit=8)
    with requests(store) as seen:
        every = task.shard_names()
        parts = task.shard_names("collect")
        homes = {c.file_id: task.shard_names("collect", c.file_id) for c in claims}
        with pytest.raises(om.NotFound, match="its stages are collect, write"):
            task.shard_names("nope")
    assert sum(seen.values()) == 0
    assert len(parts) == 2 and every == [*parts, "write"]
    assert task.shard_names("write") == ["write"]
    assert {fid: [c.shard] for c in claims for fid in [c.file_id]} == homes


def test_shards_read_fresh_or_as_this_object_last_read_them(store: om.ObjectStore) -> None:
    task = made(store)
    task.declare("a", stage="write")
    other = om.Task.open(store, "job")
    task.shards(["write"])  # read once
    other.declare("b", stage="write")
    with requests(store) as seen:
        cached = task.shards(["write"], cached=True)["write"]
    assert sum(seen.values()) == 0
    assert set(cached.entries) == {"a"}
    fresh = task.shards(["write"])["write"]
    assert set(fresh.entries) == {"a", "b"}
    assert set(task.shards()) == set(task.shard_names())


@pytest.mark.parametrize("layout", [None, "task"])
def test_stage_logs_give_each_stage_its_records_since_the_cursor_once(
    store: om.ObjectStore, layout: str | None
) -> None:
    task = made(store, layout=layout, partitions=None) if layout else made(store)
    task.declare("c1", stage="collect")
    task.declare("w1", stage="write", depends_on=["c1"])
    seen: dict[str, tuple[str | None, int]] = {}
    first = task.stage_logs(task.shards(), seen)
    assert set(first) == {"collect", "write"}
    declared = {s: {c.item for r in rs for c in r.transitions} for s, rs in first.items()}
    assert declared == {"collect": {"c1"}, "write": {"w1"}}
    assert task.stage_logs(task.shards(), seen) == {"collect": [], "write": []}
    produce(task, "c1")
    again = task.stage_logs(task.shards(), seen)
    moves = [(c.item, c.before, c.after) for r in again["collect"] for c in r.transitions]
    assert moves == [("c1", "pending", "writing"), ("c1", "writing", "ready")]
    assert again["write"] == []


def test_stage_logs_read_no_shard_and_leave_a_damaged_block_out_when_told(
    store: om.ObjectStore,
) -> None:
    task = made(store, partitions=None)
    for i in range(2 * BLOCK):  # whole journal blocks of the collect shard
        task.declare(f"c{i:03d}", stage="collect")
    task.flush_journal()
    cursor: dict[str, tuple[str | None, int]] = {}
    task.stage_logs(task.shards(), cursor)
    produce(task, "c000")
    shards = task.shards()
    with requests(store) as seen:
        new = task.stage_logs(shards, cursor)  # the live shard carries what is new
    assert sum(seen.values()) == 0
    assert [r.command for r in new["collect"]] == ["claim", "finish"]

    (block, *_) = [k for k in rawstore.keys(store, "job/journal/") if "collect" in k]
    store.put(block, b"{not a block")
    with pytest.raises(om.CorruptShard):
        task.stage_logs(shards, {})  # a first look reads the blocks
    left = task.stage_logs(shards, {}, skip_damaged=True)
    assert left["collect"] == [] and left["write"] == []


def test_the_log_and_a_history_since_a_cursor_hold_only_what_came_since(
    store: om.ObjectStore,
) -> None:
    task = made(store)
    task.declare_many([("a", "collect"), ("b", "write")])
    everything = task.log()
    cursor: dict[str, int] = {}
    for record in everything:
        assert record.object_key is not None
        cursor[record.object_key] = max(cursor.get(record.object_key, 0), record.version)
    assert task.log(after=cursor) == []
    produce(task, "a")
    new = task.log(after=cursor)
    assert [r.command for r in new] == ["claim", "finish"]
    assert task.log(after=cursor) == []
    produce(task, "b")
    assert [r.command for r in task.log(stage="write", after=cursor)] == ["claim", "finish"]

    steps = task.history("a")
    mark = {steps[-1].object_key: steps[-1].version}
    assert task.history("a", after=mark) == []
    task.agent("r").consume("a")
    assert [t.to_state for t in task.history("a", after=mark)] == ["consumed"]


def test_dropped_of_a_stage_names_only_its_objects(store: om.ObjectStore) -> None:
    task = made(store, partitions=None)
    task.declare("w", stage="write")
    for i in range(3 * BLOCK):
        task.declare(f"c{i:03d}", stage="collect")
    task.flush_journal()
    task.declare("c-last", stage="collect")  # knows its whole blocks are stored
    task.flush_journal()
    assert task.trim_journal(keep_versions=5)
    collect = {d.object_key for d in task.dropped(stage="collect")}
    assert collect == {d.object_key for d in task.dropped("c000")}
    assert task.dropped(stage="write") == task.dropped("w") == []
    assert {d.object_key for d in task.dropped()} > collect  # the index's too


def test_a_wait_plan_checks_its_arguments_with_no_request(store: om.ObjectStore) -> None:
    task = made(store)
    with requests(store) as seen:
        plan = task.wait_plan(["write", "write"], "consumed", 5)
        with pytest.raises(om.NotFound):
            task.wait_plan(["nope"])
        with pytest.raises(om.InvalidInput, match="until must be"):
            task.wait_plan(until="done")
        with pytest.raises(om.InvalidInput, match="timeout must be"):
            task.wait_plan(timeout=float("nan"))
    assert sum(seen.values()) == 0
    assert (plan.stages, plan.until, plan.timeout) == (("write",), "consumed", 5)
    pace = Pace()
    quiet = {"x": om.State.pending}
    idle = [round(plan.pause(pace, quiet, quiet, ["x"]), 3) for _ in range(8)]
    assert idle == [0.25, 0.375, 0.562, 0.844, 1.266, 1.898, 2.0, 2.0]  # nothing happens
    busy = {"x": om.State.writing}
    assert plan.pause(pace, busy, quiet, ["x"]) == 0.25  # a change: look again soon
    assert [plan.pause(pace, busy, busy, ["x"]) for _ in range(3)] == [0.375, 0.5, 0.5]
    timeout = plan.timed_out(["x"])
    assert isinstance(timeout, om.WaitTimeout) and timeout.file_ids == ("x",)
    assert task.wait_plan().stages == ("collect", "write")
