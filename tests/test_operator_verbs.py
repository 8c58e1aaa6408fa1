"""Lifecycle verbs operators need, on every backend: release, revive, undeclare, list and
delete, each journaled; hostile input refused with nothing changed."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest

import objmanifest as om
from objmanifest.cas.codecs import HeaderCodec
from objmanifest.core import operator_changes
from objmanifest.data.chunked import UploadCodec
from objmanifest.ops import deletion
from tests.support.breaking import BreakingFile
from tests.support.internals import engine

pytestmark = pytest.mark.behaviour

MiB = 1024 * 1024
PART = 5 * MiB


def commands(task: om.Task, file_id: str) -> list[str]:
    return [t.command for t in task.history(file_id)]


def keys(store: om.ObjectStore, prefix: str = "") -> list[str]:
    return [row.key for row in store.list(prefix)]


@pytest.fixture(autouse=True)
def _free_uploads(store: om.ObjectStore) -> Iterator[None]:
    yield
    for key, upload_id in list(store.list_uploads("")):
        store.abort_upload(key, upload_id)


# -- release ----------------------------------------------------------------------------


def test_release_gives_the_claim_back_without_a_retry(task: om.Task) -> None:
    task.declare("a", stage="collect")
    agent = task.agent("w1")
    claim = agent.claim("a")
    assert claim is not None
    entry = agent.release(claim)
    assert (entry.state, entry.retry_count, entry.owner, entry.epoch) == (
        om.State.pending,
        0,
        None,
        1,
    )
    assert task.entry("a") == entry
    again = task.agent("w2").claim("a")
    assert again is not None and again.epoch == 2
    assert commands(task, "a") == ["declare", "claim", "release", "claim"]
    step = task.history("a")[2]
    assert (step.actor, step.from_state, step.to_state, step.retry_count) == (
        "w1",
        "writing",
        "pending",
        0,
    )


def test_release_is_fenced_a_stale_or_foreign_claim_writes_nothing(task: om.Task) -> None:
    task.declare("a", stage="collect")
    first = task.agent("w1").claim("a")
    assert first is not None
    task.agent("w1").release(first)
    second = task.agent("w2").claim("a")
    assert second is not None
    before = task.entry("a")
    with pytest.raises(om.LeaseLost, match=r"lease on 'a' \(epoch 1, agent w1\) is lost"):
        task.agent("w1").release(first)  # stale epoch
    with pytest.raises(om.LeaseLost, match="belongs to agent 'w2'"):
        task.agent("w3").release(second)  # another agent
    forged = dataclasses.replace(second, agent="w3")
    with pytest.raises(om.LeaseLost):
        task.agent("w3").release(forged)
    assert task.entry("a") == before
    assert task.agent("w2").release(second).state is om.State.pending


def test_a_released_entry_that_failed_before_is_failed_with_its_count(task: om.Task) -> None:
    task.declare("a", stage="collect")
    agent = task.agent("w1")
    claim = agent.claim("a")
    assert claim is not None
    agent.fail(claim, "flaky")
    claim = agent.claim("a")
    assert claim is not None
    entry = agent.release(claim)
    assert (entry.state, entry.retry_count, entry.error) == (om.State.failed, 1, "flaky")


def test_a_released_chunked_entry_keeps_its_upload_for_the_next_holder(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(store, "job", stages=["make"])
    task.declare("big", stage="make")
    data = random.Random(7).randbytes(3 * PART)
    agent = task.agent("p1")
    claim = agent.claim("big")
    assert claim is not None
    with pytest.raises(OSError, match="SIGTERM"):
        agent.put(
            claim,
            BreakingFile(data, 2 * PART, "SIGTERM"),
            part_size=PART,
            threshold=MiB,
            concurrency=1,
        )  # type: ignore[arg-type]
    agent.release(claim)
    key = engine(task).layout.upload_state("make", "big")
    blob = store.get(key)
    assert blob is not None
    state = UploadCodec("job", "make", "big").decode(key, blob.body)
    assert state.status == "open" and len(state.parts) == 2
    assert [k for k, _ in store.list_uploads("")] == ["job/data/make/big@1"]
    assert task.sweep_uploads() == []  # a pending entry's upload may still be adopted
    second = task.agent("p2")
    again = second.claim("big")
    assert again is not None and again.epoch == 2
    entry = second.put(again, data, part_size=PART, threshold=MiB)
    assert (entry.state, entry.key, entry.retry_count) == (om.State.ready, "job/data/make/big@1", 0)
    assert task.agent("c").consume("big") == data


# -- revive -----------------------------------------------------------------------------


def test_revive_brings_a_dead_entry_back_with_its_retries_reset(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect"], max_retries=0)
    task.declare("a", stage="collect")
    agent = task.agent("w")
    claim = agent.claim("a")
    assert claim is not None
    assert agent.fail(claim, "bad input").state is om.State.dead
    with pytest.raises(om.NotClaimable):
        agent.claim("a")
    revived = task.revive("a")
    assert (revived.state, revived.retry_count, revived.error) == (om.State.failed, 0, "bad input")
    again = agent.claim("a")
    assert again is not None and again.epoch == 2
    assert agent.put(again, b"fixed").state is om.State.ready
    assert commands(task, "a") == ["declare", "claim", "fail", "revive", "claim", "finish"]


def test_revive_refuses_an_entry_that_is_not_dead(task: om.Task) -> None:
    task.declare("a", stage="collect")
    before = task.entry("a")
    with pytest.raises(om.WrongState, match=r"^'a' is pending, not dead: only a dead entry"):
        task.revive("a")
    assert task.entry("a") == before
    with pytest.raises(om.NotFound, match="'nope' is not declared"):
        task.revive("nope")
    with pytest.raises(om.InvalidFileId):
        task.revive("../etc")


# -- undeclare --------------------------------------------------------------------------


@pytest.mark.stage_layout
def test_undeclare_removes_a_pending_entry_from_its_shard_and_the_index(task: om.Task) -> None:
    task.declare("a", stage="collect")
    task.declare("b", stage="collect")
    removed = task.undeclare("a")
    assert removed is not None and removed.file_id == "a"
    assert "a" not in task.shard("collect").entries and "a" not in task.index()
    with pytest.raises(om.NotFound):
        task.entry("a")
    assert [e.file_id for e in task.entries()] == ["b"]
    assert task.status().unfinished == [] and task.status().unindexed == []
    records = [r for r in task.log() if r.command == "undeclare"]
    assert [(r.object_key, [t.item for t in r.transitions]) for r in records] == [
        (engine(task).shard_key("collect"), ["a"]),
        (engine(task).index_key, ["a"]),
    ]
    with pytest.raises(om.NotFound):
        task.undeclare("a")
    task.declare("a", stage="write")  # the id is free again
    assert task.entry("a").stage == "write"


@pytest.mark.stage_layout
def test_undeclare_finishes_an_interrupted_one(task: om.Task) -> None:
    task.declare("a", stage="collect")
    engine(task).docs.commit(
        engine(task).shard_key("collect"),
        engine(task).codec("collect"),
        operator_changes.Undeclare("a"),
    )
    assert task.status().unfinished != []  # in the index only: it does not look healthy
    assert task.undeclare("a") is None
    assert "a" not in task.index() and task.status().unfinished == []


def test_undeclare_refuses_dependents_and_other_states(task: om.Task) -> None:
    task.declare("a", stage="collect")
    task.declare("b", stage="write", depends_on=["a"])
    task.declare("c", stage="collect", depends_on=["a"])
    with pytest.raises(om.HasDependents, match=r"'a' cannot be undeclared: b, c depend") as info:
        task.undeclare("a")
    assert info.value.dependents == ("b", "c")
    assert "a" in task.index() and "a" in task.shard("collect").entries
    task.declare("d", stage="collect")
    claim = task.agent("w").claim("d")
    assert claim is not None
    with pytest.raises(om.WrongState, match=r"^'d' is writing, not pending"):
        task.undeclare("d")
    assert "d" in task.index() and task.entry("d").state is om.State.writing
    with pytest.raises(om.NotFound):
        task.undeclare("zzz")
    with pytest.raises(om.InvalidFileId):
        task.undeclare("")


# -- list, delete -----------------------------------------------------------------------


def test_list_names_the_tasks_under_the_prefix(store: om.ObjectStore) -> None:
    assert om.Task.list(store) == []
    om.Task.create(store, "job", stages=["s"])
    om.Task.create(store, "another", stages=["s"])
    store.put("stray/notes.txt", b"not a task")
    assert om.Task.list(store) == ["another", "job"]


def full_task(store: om.ObjectStore) -> om.Task:
    """A task with every kind of object: shards, index, data, journal, an open upload."""
    task = om.Task.create(store, "job", stages=["make", "use"], lease_seconds=30)
    task.declare("small", stage="make")
    task.declare("big", stage="make")
    task.declare("user", stage="use", depends_on=["small"])
    agent = task.agent("p")
    claim = agent.claim("small")
    assert claim is not None
    agent.put(claim, b"hello")
    big = agent.claim("big")
    assert big is not None
    data = random.Random(3).randbytes(2 * PART)
    with pytest.raises(OSError):
        agent.put(big, BreakingFile(data, PART, "broke"), part_size=PART, threshold=MiB)  # type: ignore[arg-type]
    task.flush_journal()
    return task


def test_delete_refuses_live_leases_then_removes_everything_when_forced(
    store: om.ObjectStore,
) -> None:
    task = full_task(store)
    om.Task.create(store, "other", stages=["s"])
    before = keys(store, "job/")
    assert any(k.startswith("job/data/") for k in before)
    assert any(k.startswith("job/uploads/") for k in before)
    with pytest.raises(
        om.LeasesLive, match=r"task 'job' has 1 live lease\(s\): big \(p, epoch 1"
    ) as info:
        task.delete()
    assert len(info.value.holders) == 1
    assert keys(store, "job/") == before  # nothing was touched
    assert om.Task.open(store, "job").entry("big").state is om.State.writing
    done = task.delete(force=True)
    assert (done.task_id, done.objects, done.uploads_aborted) == ("job", len(before), 1)
    assert keys(store, "job/") == []
    assert [k for k, _ in store.list_uploads("job/")] == []
    assert om.Task.list(store) == ["other"]
    assert om.Task.open(store, "other").stages == ("s",)
    with pytest.raises(om.NotFound, match="task 'job' does not exist"):
        om.Task.open(store, "job")
    with pytest.raises(om.NotFound, match="task 'job' does not exist"):
        om.Task.delete_by_id(store, "job")


def test_delete_without_live_leases_needs_no_force(task: om.Task) -> None:
    task.declare("a", stage="collect")
    agent = task.agent("w")
    claim = agent.claim("a")
    assert claim is not None
    agent.put(claim, b"x")
    assert task.delete().task_id == "job"
    assert keys(task.store) == []


@pytest.mark.stage_layout
def test_a_half_deleted_task_is_refused_and_finished_by_deleting_again(
    store: om.ObjectStore,
) -> None:
    task = full_task(store)
    engine(task).docs.commit(
        engine(task).layout.header, HeaderCodec("job"), deletion.MarkDeleting()
    )
    store.delete(engine(task).shard_key("make"))  # the delete crashed after this
    with pytest.raises(om.NotFound, match=r"task 'job' at .* is being deleted \(since"):
        om.Task.open(store, "job")
    assert om.Task.list(store) == []
    with pytest.raises(om.AlreadyExists, match="is being deleted"):
        om.Task.create(store, "job", stages=["make"])
    done = om.Task.delete_by_id(store, "job")  # marked: live leases no longer matter
    assert done.uploads_aborted == 1 and keys(store) == []


def test_leftovers_without_a_header_are_deleted_too(store: om.ObjectStore) -> None:
    task = full_task(store)
    store.delete(engine(task).layout.header)  # crashed after the header, or a late writer
    assert om.Task.list(store) == []
    with pytest.raises(om.NotFound):
        om.Task.open(store, "job")
    done = om.Task.delete_by_id(store, "job")
    assert done.objects > 0 and keys(store) == [] and list(store.list_uploads("")) == []


def test_delete_hostile_ids(store: om.ObjectStore) -> None:
    for bad in ("", "../x", "a/b"):
        with pytest.raises(om.InvalidInput):
            om.Task.delete_by_id(store, bad)
    with pytest.raises(om.NotFound):
        om.Task.delete_by_id(store, "never")
