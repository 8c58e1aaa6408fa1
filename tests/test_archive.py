"""Archiving: terminal entries leave the live shards and are still found, on every backend."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import objmanifest as om
from objmanifest.core import commands
from tests.support.internals import engine
from tests.support.rawstore import delete as raw_delete
from tests.support.rawstore import put as raw_put

pytestmark = pytest.mark.behaviour


def produce(task: om.Task, file_id: str, agent: str = "p") -> None:
    worker = task.agent(agent)
    claim = worker.claim(file_id)
    assert claim is not None
    worker.put(claim, file_id.encode())


def kill(task: om.Task, file_id: str) -> None:
    """Fail the entry until it is dead (the task fixture allows 2 retries)."""
    while task.entry(file_id).state is not om.State.dead:
        worker = task.agent("k")
        claim = worker.claim(file_id)
        assert claim is not None
        worker.fail(claim, "bad input")


def test_archive_mid_pipeline_keeps_every_promise(task: om.Task) -> None:
    """Archive in a loop while a producer and a consumer work: then every entry is found
    exactly once (live or archived), with its history, lineage, status and dependencies."""
    n = 12
    for i in range(n):
        task.declare(f"raw{i}", "collect")
        task.declare(f"out{i}", "write", depends_on=[f"raw{i}"])
    task.declare("bad", "collect")
    task.declare("after-bad", "write", depends_on=["bad"])
    kill(task, "bad")

    done = threading.Event()
    errors: list[BaseException] = []

    def pipeline() -> None:
        try:
            for i in range(n):
                produce(task, f"raw{i}")
                task.agent("c").consume(f"raw{i}")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    worker = threading.Thread(target=pipeline)
    worker.start()
    reports = []
    while not done.is_set():
        reports.append(task.archive(older_than=0))
    worker.join()
    reports.append(task.archive(older_than=0))
    assert errors == []

    moved = Counter(f for r in reports for ids in r.archived.values() for f in ids)
    assert set(moved) == {f"raw{i}" for i in range(n)} | {"bad"}
    assert set(moved.values()) == {1}  # nothing archived twice
    collect = task.shard("collect")
    assert collect.entries == {}
    assert set(collect.archived or {}) == set(moved)

    # entry, history, lineage of an archived entry
    raw = task.entry("raw3")
    assert (raw.state, raw.checksum is not None, raw.consumed_by) == (
        om.State.consumed,
        True,
        ("c",),
    )
    steps = [(t.command, t.to_state) for t in task.history("raw3")]
    assert steps[:4] == [
        ("declare", "pending"),
        ("claim", "writing"),
        ("finish", "ready"),
        ("consume", "consumed"),
    ]
    assert steps[-1] == ("archive", "removed")
    graph = task.lineage("out3")
    assert [tuple(e) for e in graph.edges] == [("out3", "raw3")]
    assert graph.nodes["raw3"].checksum == raw.checksum

    # status counts archived entries in their state, and says how many are archived
    status = task.status()
    assert status.stages["collect"]["consumed"] == n
    assert status.stages["collect"]["dead"] == 1
    assert status.archived == {"collect": n + 1, "write": 0, "check": 0}
    assert status.unfinished == []
    assert [b.file_id for b in status.blocked] == ["after-bad"]

    # dependencies: archived consumed -> claimable, archived dead -> blocked
    claim = task.agent("w").claim("out3")
    assert claim is not None
    with pytest.raises(om.NotClaimable, match="dead"):
        task.agent("w").claim("after-bad")


def test_redeclaring_an_archived_id(task: om.Task) -> None:
    task.declare("a", "collect", consumers=["r"])
    produce(task, "a")
    task.agent("r").consume("a")
    report = task.archive(older_than=0)
    assert isinstance(report, om.ArchiveReport)
    assert report.archived["collect"] == ["a"]
    again = task.declare("a", "collect", consumers=["r"])
    assert (again.state, again.consumed_by) == (om.State.consumed, ("r",))
    assert "a" not in task.shard("collect").entries  # no fresh entry
    with pytest.raises(om.DeclarationConflict):
        task.declare("a", "collect", consumers=["other"])
    with pytest.raises(om.DeclarationConflict):
        task.declare("a", "collect", depends_on=["x"], consumers=["r"])
    assert "a" not in task.shard("collect").entries


def test_young_and_live_entries_stay(task: om.Task) -> None:
    task.declare("old", "collect")
    task.declare("ready", "collect")
    produce(task, "old")
    task.agent("c").consume("old")
    produce(task, "ready")
    assert task.archive(older_than=3600).archived == {"collect": [], "write": [], "check": []}
    report = task.archive(older_than=0)
    assert report.archived["collect"] == ["old"]
    assert set(task.shard("collect").entries) == {"ready"}
    with pytest.raises(om.InvalidInput, match="older_than"):
        task.archive(older_than=-1)


@pytest.mark.parametrize("age", [7e10, 1e11, 1e308, float("inf"), float("nan"), -1, True])
def test_an_age_past_the_bound_is_invalid_input_naming_it(task: om.Task, age: float) -> None:
    """An age subtracted from the store's clock would reach back before year 1: one bound
    (1000 years) for ``archive`` and ``gc``, said the same way, and nothing changed."""
    task.declare("old", "collect")
    produce(task, "old")
    task.agent("c").consume("old")
    rule = "must be a finite number of seconds from 0 to 31557600000 (1000 years), not "
    with pytest.raises(om.InvalidInput) as caught:
        task.archive(older_than=age)
    assert str(caught.value) == f"older_than {rule}{age!r}"
    with pytest.raises(om.InvalidInput) as caught:
        task.gc(consumed_older_than=age)
    assert str(caught.value) == f"consumed_older_than {rule}{age!r}"
    assert task.entry("old").state is om.State.consumed and task.entry("old").key is not None
    assert task.archive(older_than=31557600000).archived["collect"] == []


class Died(Exception):
    """The archiver dies between its two writes."""


@pytest.mark.stage_layout
def test_archiver_dying_between_its_writes_loses_nothing(task: om.Task) -> None:
    task.declare("a", "collect")
    task.declare("b", "collect")
    for fid in ("a", "b"):
        produce(task, fid)
        task.agent("c").consume(fid)

    def dies(shard: str, command: commands.Archive) -> list[str]:
        raise Died

    with pytest.raises(Died):
        engine(task).archives.archive_shard(task.shard("collect"), 0, dies)
    left = [r.key for r in task.store.list(engine(task).layout.archive_of("collect"))]
    assert len(left) == 1  # the archive object was written, the shard commit was not
    # nothing lost, nothing twice: the entries are live, found once, no map names the object
    shard = task.shard("collect")
    assert set(shard.entries) == {"a", "b"} and not shard.archived
    assert task.status().stages["collect"]["consumed"] == 2
    assert task.entry("a").state is om.State.consumed

    # the next archiver commits what the dead one wrote (though none is due by its age)
    report = task.archive(older_than=3600)
    assert report.adopted == left
    assert report.archived["collect"] == ["a", "b"]
    assert report.objects == []
    shard = task.shard("collect")
    assert shard.entries == {}
    assert {ref.archive for ref in (shard.archived or {}).values()} == {
        engine(task).layout.parse_archive(left[0], "collect")
    }
    assert task.entry("b").state is om.State.consumed
    assert task.status().stages["collect"]["consumed"] == 2
    assert task.archive(older_than=0).archived["collect"] == []


@pytest.mark.stage_layout
def test_an_entry_changed_after_the_archive_object_stays_live(task: om.Task) -> None:
    """The stale copy in an archive object is never read: the shard commit only takes
    entries still exactly as written there."""
    task.declare("a", "collect")
    produce(task, "a")
    task.agent("c").consume("a")
    task.declare("d", "collect")
    kill(task, "d")
    shard = task.shard("collect")
    stale = dict(shard.entries)
    stale["a"] = stale["a"].model_copy(update={"error": "an older copy"})
    archive_id = engine(task).archives.write("collect", stale, task.store.now())
    moved = engine(task).docs.commit(
        engine(task).shard_key("collect"),
        engine(task).codec("collect"),
        commands.Archive(archive_id, stale),
    )
    assert moved == ["d"]
    assert set(task.shard("collect").entries) == {"a"}
    assert task.entry("a").error is None
    assert task.entry("d").state is om.State.dead


@pytest.mark.parametrize("damage", ["deleted", "garbled"])
@pytest.mark.stage_layout
def test_a_repaired_shard_keeps_its_archived_entries_archived(
    task: om.Task, store: om.ObjectStore, damage: str
) -> None:
    """A shard rebuilt by ``repair`` gets its ``archived`` map back from its archive
    objects: an archived entry is still found (not brought back as a fresh pending entry to
    be produced again), status counts it, its dependant is claimable, and an entry still
    live stays live."""
    task.declare("old", "collect")
    task.declare("live", "collect")
    task.declare("next", "write", depends_on=["old"])
    produce(task, "old")
    task.agent("c").consume("old")
    assert task.archive(older_than=0).archived["collect"] == ["old"]
    produce(task, "live")

    key = f"{task.task_id}/shards/collect.json"
    if damage == "deleted":
        raw_delete(store, key)
    else:
        raw_put(store, key, b"{not json")
    report = task.repair()
    (shard_report,) = [o for o in report.objects if o.kind == "shard"]
    assert shard_report.action == "rebuilt"
    rules = {e.file_id: e.rule for e in shard_report.entries}
    assert rules["old"].startswith("archived in ")

    collect = task.shard("collect")
    assert set(collect.entries) == {"live"}
    assert set(collect.archived or {}) == {"old"}
    old = task.entry("old")
    assert (old.state, old.consumed_by, old.checksum is not None) == (
        om.State.consumed,
        ("c",),
        True,
    )
    assert task.status().archived["collect"] == 1
    claim = task.agent("w").claim("next")
    assert claim is not None and claim.file_id == "next"


def test_an_archived_dead_entry_is_revived_and_an_archived_id_is_not_undeclared(
    task: om.Task,
) -> None:
    """``revive`` brings an archived dead entry back into its live shard (its dependant,
    blocked while it was dead, can then run once it is produced); ``undeclare`` refuses an
    archived id and the index keeps it."""
    task.declare("bad", "collect")
    task.declare("after", "write", depends_on=["bad"])
    task.declare("done", "collect")
    produce(task, "done")
    task.agent("c").consume("done")
    kill(task, "bad")
    assert sorted(task.archive(older_than=0).archived["collect"]) == ["bad", "done"]

    with pytest.raises(om.WrongState, match="'done' is archived \\(consumed\\), not pending"):
        task.undeclare("done")
    assert task.entry("done").state is om.State.consumed
    assert task.stage_of("done") == "collect"

    revived = task.revive("bad")
    assert (revived.state, revived.retry_count) == (om.State.failed, 0)
    collect = task.shard("collect")
    assert "bad" in collect.entries and "bad" not in (collect.archived or {})
    assert task.status().archived["collect"] == 1
    assert [t.command for t in task.history("bad")][-2:] == ["archive", "revive"]
    produce(task, "bad")
    assert task.agent("w").claim("after") is not None


def test_an_archived_queue_entry_is_read_again_by_its_consumer_and_refused_to_others(
    task: om.Task,
) -> None:
    task.declare("q", "collect")
    produce(task, "q")
    assert task.agent("c").consume("q") == b"q"
    assert task.archive(older_than=0).archived["collect"] == ["q"]
    assert task.agent("c").consume("q") == b"q"  # its own consumer reads it again
    with pytest.raises(om.AlreadyConsumed):
        task.agent("other").consume("q")
    fresh = om.Task.open(task.store, task.task_id)  # as a CLI process would see it
    assert fresh.agent("c").consume("q") == b"q"
    assert fresh.entry("q").state is om.State.consumed


def test_gc_frees_the_data_of_archived_consumed_entries_past_their_retention(
    task: om.Task,
) -> None:
    for file_id in ("old", "young"):
        task.declare(file_id, "collect")
        produce(task, file_id)
    task.agent("c").consume("old")
    task.archive(older_than=0)
    key = task.entry("old").key
    assert key is not None
    dry = task.gc(dry_run=True, consumed_older_than=0)
    assert [(i.kind, i.key) for i in dry.removed] == [("consumed_data", key)]
    assert dry.kept == []  # the report never says it both removed and kept a key
    assert task.entry("old").data_removed_at is None  # a dry run marks nothing
    report = task.gc(consumed_older_than=0)
    assert [(i.kind, i.key, i.size) for i in report.removed] == [("consumed_data", key, 3)]
    assert report.kept == [] and report.errors == []
    assert task.gc().kept == []  # the data of an archived entry is its own, as a live one's
    entry = om.Task.open(task.store, task.task_id).entry("old")
    assert entry.state is om.State.consumed and entry.data_removed_at is not None
    assert entry.checksum is not None  # its record stays, as for a live entry
    with pytest.raises(om.DataRemoved):
        task.agent("c").consume("old")
    assert task.agent("c2").consume("young") == b"young"  # ready, never consumed: kept
    assert task.gc(consumed_older_than=3600).removed == []  # consumed just now: kept
    assert task.status().stages["collect"]["consumed"] == 2
