"""The journal on ``MemoryStore``: one record per committed version of every manifest
object, carried inside the object until a write-once block holds it, never lost when a
block write fails, is lost with its writer, or races another writer's.

The runtime's pool runs block writes at once in the committing thread (``INLINE``), or
never (``NEVER``: a writer that dies before its background write), so every test states
exactly what is in the store.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import objmanifest as om
from objmanifest.cas.blocks import BLOCK, BlockWriter
from objmanifest.cas.policy import Stats
from objmanifest.core.commands import Declare
from objmanifest.core.model import Declaration, JournalBlock, JournalRecord, TaskHeader
from objmanifest.core.runtime import DEFAULT, Runtime
from objmanifest.errors import UnsupportedSchema
from objmanifest.store import CREATE
from tests.support.internals import engine


class _Inline(cf.Executor):
    """Runs each job at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # pragma: no cover - the job logs its own failures
            future.set_exception(e)
        return future


class _Never(cf.Executor):
    """Accepts jobs and never runs them: the process died before its background work."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        future.set_result(None)
        return future


INLINE = replace(DEFAULT, pool=lambda workers, name: _Inline())
NEVER = replace(DEFAULT, pool=lambda workers, name: _Never())


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def store(
    bucket: str, runtime: Runtime = INLINE, clock: Callable[[], datetime] | None = None
) -> om.MemoryStore:
    return om.MemoryStore(bucket, "p", runtime=runtime, clock=clock)


def fresh(runtime: Runtime = INLINE, **kwargs: Any) -> tuple[om.MemoryStore, om.Task]:
    s = store(f"journal-{uuid.uuid4().hex[:8]}", runtime)
    task = om.Task.create(s, "job", stages=["a", "b"], **kwargs)
    return s, task


def produce(task: om.Task, agent: om.Agent, file_id: str, stage: str = "a") -> None:
    task.declare(file_id, stage)
    claim = agent.claim(file_id)
    assert claim is not None
    agent.put(claim, file_id.encode())


def versions(records: list[om.JournalRecord]) -> list[int]:
    return [r.version for r in records]


def check_complete(task: om.Task, key: str, codec: Any) -> list[om.JournalRecord]:
    """Versions 1..N of ``key`` each have exactly one record, and the newest records are
    those of the commit ids the object itself remembers."""
    records = engine(task).journal.records(key, codec)
    doc = engine(task).docs.read(key, codec)
    n = codec.version(doc)
    assert versions(records) == list(range(1, n + 1)), key
    ids = list(codec.commit_ids(doc))
    assert [r.commit_id for r in records[-len(ids) :]] == ids
    return records


def raw(s: om.MemoryStore, key: str) -> dict[str, Any]:
    blob = s.get(key)
    assert blob is not None
    data: dict[str, Any] = json.loads(blob.body)
    return data


def raw_records(s: om.MemoryStore, key: str) -> list[om.JournalRecord]:
    """The records the object ``key`` carries."""
    return [om.JournalRecord.model_validate(r) for r in raw(s, key).get("journal", [])]


def blocks(s: om.MemoryStore, task: om.Task) -> list[str]:
    return sorted(row.key for row in s.list(engine(task).layout.journal_prefix))


# -- one record per version --------------------------------------------------------------------


def test_every_committed_version_of_the_shard_and_the_index_has_one_record() -> None:
    _, task = fresh()
    agent = task.agent("ann")
    for i in range(30):
        produce(task, agent, f"f{i}")
    shard = check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))
    index = check_complete(task, engine(task).index_key, engine(task).index_codec)
    assert len(shard) == 90 and len(index) == 30  # declare, claim, finish; one declaration
    first = shard[:3]
    assert [(r.command, r.actor) for r in first] == [
        ("declare", ""),
        ("claim", "ann"),
        ("finish", "ann"),
    ]
    assert [(c.item, c.before, c.after) for c in first[2].transitions] == [
        ("f0", "writing", "ready")
    ]
    assert first[2].transitions[0].checksum == task.entry("f0").checksum
    assert all(r.object_key == engine(task).shard_key("a") for r in shard)


def test_records_move_to_write_once_blocks_and_leave_the_object() -> None:
    s, task = fresh()
    agent = task.agent("ann")
    for i in range(30):  # 90 versions of shard a: blocks 1-32 and 33-64
        produce(task, agent, f"f{i}")
    shard_blocks = [k for k in blocks(s, task) if "/shards/a/" in k]
    doc = raw(s, engine(task).shard_key("a"))
    assert len(shard_blocks) == 2
    assert shard_blocks[0].endswith(f"/{1:012d}-{BLOCK:012d}.json")
    assert shard_blocks[1].endswith(f"/{BLOCK + 1:012d}-{2 * BLOCK:012d}.json")
    assert f"/{doc['journal_id']}/" in shard_blocks[0]
    block = JournalBlock.model_validate(raw(s, shard_blocks[0]))
    assert (block.first, block.last) == (1, BLOCK)
    assert versions(list(block.records)) == list(range(1, BLOCK + 1))
    # The object keeps only what no block holds (dropped by the commit after the block).
    carried = [r["version"] for r in doc["journal"]]
    assert carried == list(range(2 * BLOCK + 1, 91))
    assert engine(task).docs.stats.journal_blocks == len(blocks(s, task))


def test_a_warm_commit_is_one_put_and_a_block_one_more_per_block() -> None:
    s, task = fresh()
    agent = task.agent("ann")
    task.declare("x", "a")
    claim = agent.claim("x")
    assert claim is not None
    s.faults.calls.clear()
    for _ in range(2 * BLOCK):
        claim = agent.renew(claim)
    assert s.faults.calls["put"] == 2 * BLOCK + 2  # the renewals, and two blocks
    assert s.faults.calls["get"] == 0
    check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))


# -- nothing lost -------------------------------------------------------------------------------


def test_a_block_that_cannot_be_written_keeps_its_records_in_the_object() -> None:
    s, task = fresh()
    agent = task.agent("ann")
    s.faults.add("put", "/journal/", "fail", times=1000)
    for i in range(30):
        produce(task, agent, f"f{i}")
    assert blocks(s, task) == []
    assert len(raw(s, engine(task).shard_key("a"))["journal"]) == 90
    s.faults.clear()
    produce(task, agent, "late")
    assert len(blocks(s, task)) > 0
    check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))
    assert len(raw(s, engine(task).shard_key("a"))["journal"]) < 2 * BLOCK


def test_a_writer_that_dies_before_its_block_write_loses_nothing() -> None:
    bucket = f"journal-{uuid.uuid4().hex[:8]}"
    dying = om.Task.create(store(bucket, NEVER), "job", stages=["a", "b"])
    agent = dying.agent("ann")
    for i in range(30):
        produce(dying, agent, f"f{i}")
    s = store(bucket)
    # Its background writes never ran; its commits stored, before going on, only the block
    # the object would otherwise have carried two blocks' worth past (versions 1..32).
    assert [k.rsplit("/", 1)[-1] for k in blocks(s, dying) if "/shards/a/" in k] == [
        f"{1:012d}-{BLOCK:012d}.json"
    ]
    assert len(raw(s, engine(dying).shard_key("a"))["journal"]) < 2 * BLOCK
    task = om.Task.open(s, "job")
    produce(task, task.agent("bob"), "next")
    assert len(blocks(s, task)) > 0
    records = check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))
    assert {r.actor for r in records} == {"", "ann", "bob"}


def test_commits_each_from_a_new_process_keep_the_object_bounded_and_cost_two_puts() -> None:
    """CLI steps and tool calls: every commit from a process that knows of no block stored.
    The object still carries fewer than two blocks' worth, each block goes out about twice
    (once by the process that completed it, once, a 412, by the one that must drop it), and
    nothing is lost."""
    bucket = f"journal-{uuid.uuid4().hex[:8]}"
    om.Task.create(store(bucket), "job", stages=["a", "b"])
    puts: list[int] = []
    carried: list[int] = []
    for i in range(5 * BLOCK):
        s = store(bucket)  # a new process: an empty cache, no block known stored
        task = om.Task.open(s, "job")
        task.declare(f"f{i}", "a")  # the shard's and the index's commit
        task.flush_journal()  # what the process does as it exits
        puts.append(s.faults.calls["put"])
        carried.append(len(raw(s, engine(task).shard_key("a"))["journal"]))
        assert len(raw(s, engine(task).index_key)["journal"]) < 2 * BLOCK
    assert max(carried) == 2 * BLOCK - 1 and carried[-1] < 2 * BLOCK
    assert sum(puts) / len(puts) <= 2 + 4 / BLOCK + 0.01  # two, plus each block twice
    assert max(puts) <= 6
    s = store(bucket)
    task = om.Task.open(s, "job")
    records = check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))
    assert len(records) == 5 * BLOCK
    check_complete(task, engine(task).index_key, engine(task).index_codec)
    names = [k for k in blocks(s, task) if "/shards/a/" in k]
    assert len(names) == 5  # 1..160, the last block written by the process that completed it


def test_a_block_written_already_is_recognised_and_not_written_twice() -> None:
    bucket = f"journal-{uuid.uuid4().hex[:8]}"
    first = om.Task.create(store(bucket), "job", stages=["a", "b"])
    second = om.Task.open(store(bucket), "job")
    for i in range(20):  # two agents with caches of their own, interleaved
        produce(first, first.agent("ann"), f"ann{i}")
        produce(second, second.agent("bob"), f"bob{i}")
    s = store(bucket)
    names = blocks(s, first)
    assert len(names) == len(set(names)) > 0
    check_complete(second, engine(second).shard_key("a"), engine(second).codec("a"))
    for key in names:  # every block holds exactly the versions its key names
        block = JournalBlock.model_validate(raw(s, key))
        assert versions(list(block.records)) == list(range(block.first, block.last + 1))


def test_a_block_whose_key_is_taken_is_not_overwritten() -> None:
    s, task = fresh()
    agent = task.agent("ann")
    produce(task, agent, "f0")
    journal_id = raw(s, engine(task).shard_key("a"))["journal_id"]
    key = engine(task).layout.journal_block(engine(task).shard_key("a"), journal_id, 1, BLOCK)
    s.put(key, b"written by another", mode=CREATE)
    for i in range(1, 12):
        produce(task, agent, f"f{i}")
    blob = s.get(key)
    assert blob is not None and blob.body == b"written by another"


def test_a_lost_answer_leaves_exactly_one_record() -> None:
    s, task = fresh()
    agent = task.agent("ann")
    task.declare("x", "a")
    s.faults.add("put", "/shards/a.json", "lose")
    claim = agent.claim("x")  # applied; the answer lost; the re-read recognises it
    assert claim is not None
    records = check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))
    assert [r.command for r in records] == ["declare", "claim"]


def test_a_commit_that_lost_races_says_how_many_in_its_record() -> None:
    """Any reader of the object sees where writers collide, not only the loser."""
    s, task = fresh()
    other = om.Task.open(s, "job")
    task.declare_many([("x", "a"), ("y", "a")])
    ann, bob = task.agent("ann"), other.agent("bob")
    claim = ann.claim("x")  # ann's task keeps the version its claim wrote
    assert claim is not None
    bob.claim("y")  # which bob's write makes stale
    ann.put(claim, b"x")  # tried on it first: 412, a read, and again
    records = check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))
    assert [(r.command, r.actor, r.lost_races) for r in records] == [
        ("declare", "", None),
        ("claim", "ann", None),
        ("claim", "bob", None),
        ("finish", "ann", 1),
    ]
    assert '"lost_races"' not in json.dumps(raw(s, engine(task).shard_key("a"))["journal"][:3])


# -- reading history ----------------------------------------------------------------------------


def test_history_follows_an_entry_across_a_takeover() -> None:
    clock = Clock()
    s = store(f"journal-{uuid.uuid4().hex[:8]}", clock=clock)
    task = om.Task.create(s, "job", stages=["a"], lease_seconds=10, max_retries=3)
    task.declare("x", "a", consumers=["checker"])
    ann, bob = task.agent("ann"), task.agent("bob")
    assert ann.claim("x") is not None
    clock.advance(60)  # ann's lease runs out; bob takes over
    claim = bob.claim("x")
    assert claim is not None
    bob.put(claim, b"bytes")
    task.agent("c1", role="checker").consume("x")
    steps = task.history("x")
    assert [(t.command, t.actor, t.from_state, t.to_state, t.epoch) for t in steps] == [
        ("declare", "", None, "pending", 0),
        ("claim", "ann", "pending", "writing", 1),
        ("claim", "bob", "writing", "writing", 2),
        ("finish", "bob", "writing", "ready", 2),
        ("consume", "c1", "ready", "consumed", 2),
    ]
    assert [t.version for t in steps] == [1, 2, 3, 4, 5]
    assert steps[1].at < steps[2].at
    assert steps[3].checksum == task.entry("x").checksum


def test_log_filters_by_time_stage_and_agent() -> None:
    clock = Clock()
    s = store(f"journal-{uuid.uuid4().hex[:8]}", clock=clock)
    task = om.Task.create(s, "job", stages=["a", "b"])
    produce(task, task.agent("ann"), "x", "a")
    clock.advance(10)
    middle = clock.now
    produce(task, task.agent("bob"), "y", "b")
    everything = task.log()
    assert [r.at for r in everything] == sorted(r.at for r in everything)
    assert {r.object_key for r in everything} == {
        engine(task).shard_key("a"),
        engine(task).shard_key("b"),
        engine(task).index_key,
    }
    assert {r.actor for r in task.log(agent="bob")} == {"bob"}
    assert {r.object_key for r in task.log(stage="b")} == {engine(task).shard_key("b")}
    assert all(r.at >= middle for r in task.log(since=middle))
    assert len(task.log(since=middle)) == 4  # y: declared in the index and b, claimed, made ready


def test_lineage_walks_dependencies_across_shards() -> None:
    _, task = fresh()
    ann = task.agent("ann")
    produce(task, ann, "raw1", "a")
    produce(task, ann, "raw2", "a")
    task.declare("out", "b", depends_on=["raw1", "raw2", "never"])
    graph = task.lineage("out")
    assert set(graph.nodes) == {"out", "raw1", "raw2", "never"}
    assert sorted(graph.edges) == [("out", "never"), ("out", "raw1"), ("out", "raw2")]
    raw1 = graph.nodes["raw1"]
    assert (raw1.producer, raw1.epoch, raw1.size) == ("ann", 1, 4)
    assert raw1.checksum == task.entry("raw1").checksum
    made = [t.at for t in task.history("raw1") if t.to_state == "ready"]
    assert raw1.ready_at == made[0]
    assert graph.nodes["never"].state is None
    assert graph.nodes["out"].producer is None
    with pytest.raises(om.NotFound, match="'nope' is not declared"):
        task.lineage("nope")


# -- a task made before the journal, and its migration ------------------------------------------


def old_task(s: om.MemoryStore) -> om.Task:
    """A task whose header says schema 1, as 0.1.0 wrote it."""
    header = TaskHeader(
        schema_version=1,
        task_id="job",
        stages=("a", "b"),
        lease_seconds=300,
        max_retries=3,
        created_at=s.now(),
        creation_id="c",
    )
    s.put("job/task.json", header.model_dump_json(exclude_none=True).encode(), mode=CREATE)
    return om.Task.open(s, "job")


def test_a_task_at_schema_1_is_written_at_1_until_it_is_migrated() -> None:
    s = store(f"journal-{uuid.uuid4().hex[:8]}")
    task = old_task(s)
    produce(task, task.agent("ann"), "x")
    shard = raw(s, engine(task).shard_key("a"))
    assert shard["schema_version"] == 1 and "journal" not in shard
    assert json.loads(s.get(engine(task).index_key).body)["schema_version"] == 1  # type: ignore[union-attr]
    assert task.history("x") == []

    moved = task.migrate()
    assert moved == ["job/task.json", engine(task).shard_key("a"), engine(task).index_key]
    assert task.migrate() == []
    assert raw(s, "job/task.json")["schema_version"] == 2
    assert raw(s, "job/task.json")["requires"] == "0.2.0"
    produce(task, task.agent("bob"), "y")
    reopened = om.Task.open(s, "job")
    assert engine(reopened).schema_version == 2
    steps = reopened.history("y")
    assert [t.command for t in steps] == ["declare", "claim", "finish"]
    records = engine(reopened).journal.records(
        engine(task).shard_key("a"), engine(reopened).codec("a")
    )
    assert records[0].command == "migrate" and records[0].version == 4


def test_a_newer_schema_is_refused_naming_the_release_that_reads_it() -> None:
    s = store(f"journal-{uuid.uuid4().hex[:8]}")
    body = json.dumps(
        {
            "schema_version": 9,
            "task_id": "job",
            "stages": ["a"],
            "lease_seconds": 1,
            "max_retries": 1,
            "created_at": "2030-01-01T00:00:00Z",
            "requires": "7.1.0",
        }
    ).encode()
    s.put("job/task.json", body, mode=CREATE)
    with pytest.raises(UnsupportedSchema, match=r"install objmanifest 7\.1\.0 or newer"):
        om.Task.open(s, "job")
    assert s.get("job/task.json").body == body  # type: ignore[union-attr]


# -- the block writer ---------------------------------------------------------------------------


class _Gated(cf.ThreadPoolExecutor):
    """Real worker threads whose every job waits until the test opens the gate."""

    gate = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        def gated() -> Any:
            self.gate.wait(timeout=30)
            return fn(*args, **kwargs)

        return super().submit(gated)


def test_blocks_go_out_on_one_background_thread_and_flush_waits_for_them() -> None:
    asked: list[tuple[int, str]] = []

    def pool(workers: int, name: str) -> cf.Executor:
        asked.append((workers, name))
        return _Gated(workers, thread_name_prefix=name)

    s, task = fresh(replace(DEFAULT, pool=pool))
    s.faults.add("put", f"-{BLOCK:012d}.json", "fail", times=1)  # block 1's first try
    agent = task.agent("ann")
    task.declare("x", "a")
    claim = agent.claim("x")
    assert claim is not None
    s.faults.calls.clear()
    _Gated.gate.clear()
    for _ in range(2 * BLOCK - 3):  # to version 63: block 1 is whole, and out
        claim = agent.renew(claim)
    assert s.faults.calls["put"] == 2 * BLOCK - 3  # the block waits at the gate
    _Gated.gate.set()
    task.flush_journal()
    assert s.faults.calls["put"] - (2 * BLOCK - 3) == 1  # block 1, refused once
    assert [k for k in blocks(s, task) if "/shards/a/" in k] == []
    # Version 64 may not carry block 1 any longer: its commit stores it first, then sends
    # block 2 (which it made whole) in the background.
    claim = agent.renew(claim)
    task.flush_journal()
    shard_blocks = [k for k in blocks(s, task) if "/shards/a/" in k]
    assert len(shard_blocks) == 2
    assert s.faults.calls["put"] - (2 * BLOCK - 3) == 4  # block 1 twice, v64, block 2
    assert asked == [(1, "objmanifest-journal")]
    for key in shard_blocks:
        blob = s.get(key)
        assert blob is not None and b"null" not in blob.body  # nothing empty is written
    assert versions(raw_records(s, engine(task).shard_key("a"))) == list(
        range(BLOCK + 1, 2 * BLOCK + 1)
    )
    check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))


def test_a_detached_view_writes_blocks_through_its_parent() -> None:
    s, task = fresh()
    docs = engine(task).docs.detached()
    key, codec = engine(task).shard_key("a"), engine(task).codec("a")
    for i in range(BLOCK + 1):
        docs.commit(key, codec, Declare([Declaration(file_id=f"d{i}", stage="a")]))
    assert [k for k in blocks(s, task) if "/shards/a/" in k]
    assert len(raw(s, key)["journal"]) == 1  # the parent knows the block; the view trimmed


def test_a_block_that_failed_keeps_its_records_though_a_later_block_was_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s, task = fresh()
    agent = task.agent("ann")
    s.faults.add("put", f"-{BLOCK:012d}.json", "fail", times=1)  # the first block of each
    for i in range(30):
        produce(task, agent, f"f{i}")
    shard = raw(s, engine(task).shard_key("a"))
    failed = [r for r in caplog.records if "could not write journal block" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "WARNING"
    message = failed[0].getMessage()
    assert message.startswith("could not write journal block job/journal/shards/a/")
    assert message.endswith(f"-{BLOCK:012d}.json: injected fault")
    assert message.count(f"-{BLOCK:012d}.json") == 2  # the key, and the store's error
    check_complete(task, engine(task).shard_key("a"), engine(task).codec("a"))
    assert "journal" in shard


def test_after_a_migration_the_first_block_starts_at_the_first_journaled_version() -> None:
    s = store(f"journal-{uuid.uuid4().hex[:8]}")
    task = old_task(s)
    produce(task, task.agent("ann"), "x")  # versions 1-3 at schema 1: no records
    task.migrate()  # version 4
    for i in range(15):
        produce(task, task.agent("ann"), f"y{i}")  # versions 5-49
    names = [k for k in blocks(s, task) if "/shards/a/" in k]
    assert names[0].endswith(f"/{4:012d}-{BLOCK:012d}.json")
    records = engine(task).journal.records(engine(task).shard_key("a"), engine(task).codec("a"))
    assert versions(records) == list(range(4, 50))
    assert min(r["version"] for r in raw(s, engine(task).shard_key("a"))["journal"]) == BLOCK + 1


class _Held(cf.Executor):
    """Keeps each job until ``run`` is called."""

    def __init__(self) -> None:
        self.jobs: list[tuple[cf.Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        self.jobs.append((future, lambda: fn(*args, **kwargs)))
        return future

    def run(self) -> None:
        jobs, self.jobs = self.jobs, []
        for future, job in jobs:
            future.set_result(job())


def test_a_block_stored_while_a_commit_carrying_it_was_in_flight_is_not_sent_again() -> None:
    held = _Held()
    s, task = fresh(replace(DEFAULT, pool=lambda workers, name: held))
    agent = task.agent("ann")
    task.declare("x", "a")
    claim = agent.claim("x")
    assert claim is not None
    for _ in range(2 * BLOCK):  # until a version makes the shard's first block whole
        if held.jobs:
            break
        claim = agent.renew(claim)
    assert len(held.jobs) == 1
    shard = engine(task).layout.shard("a")

    def store_the_block_first(name: str, key: str) -> None:
        if name == "put" and key == shard and held.jobs:
            held.run()  # the block lands while the next commit, still carrying it, is out

    s.faults.hooks.append(store_the_block_first)
    claim = agent.renew(claim)
    assert held.jobs == []  # the version that landed still carries it: it is not sent again
    assert engine(task).docs.stats.journal_blocks == 1
    claim = agent.renew(claim)  # this one no longer carries it
    assert held.jobs == []
    assert len([k for k in blocks(s, task) if "/shards/a/" in k]) == 1


def test_without_a_block_key_no_block_is_ever_started() -> None:
    pools: list[str] = []

    def pool(workers: int, name: str) -> cf.Executor:
        pools.append(name)
        return _Inline()

    s = store(f"journal-{uuid.uuid4().hex[:8]}", replace(DEFAULT, pool=pool))
    writer = BlockWriter(s, Stats(), None)
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    records = [
        JournalRecord(version=v, commit_id=f"c.{v}", command="renew", actor="ann", at=at)
        for v in range(1, BLOCK + 1)
    ]
    writer.write_due("k", "j", records, 1)
    writer.store_old("k", "j", records, 3 * BLOCK)
    assert pools == [] and s.faults.calls["put"] == 0
    assert writer.unstored("k", "j", records) == records
    assert writer.unstored("k", "j", []) == []


# -- BlockWriter on its own: which blocks it sends, waits for and leaves ------------------------


class _LazyFuture(cf.Future[Any]):
    """A job that runs when somebody waits for its result (or when the test runs it)."""

    def __init__(self, job: Callable[[], Any]) -> None:
        super().__init__()
        self.job = job

    def run(self) -> None:
        if not self.done():
            self.set_result(self.job())

    def result(self, timeout: float | None = None) -> Any:
        self.run()
        return super().result(timeout)


class _Lazy(cf.Executor):
    """Keeps each job until its result is awaited or ``run`` is called."""

    def __init__(self) -> None:
        self.futures: list[_LazyFuture] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future = _LazyFuture(lambda: fn(*args, **kwargs))
        self.futures.append(future)
        return future

    def run(self) -> None:
        for future in self.futures:
            future.run()


def block_writer(pool: cf.Executor | None = None) -> tuple[om.MemoryStore, BlockWriter]:
    executor = pool or _Inline()
    s = store(f"blocks-{uuid.uuid4().hex[:8]}", replace(DEFAULT, pool=lambda w, n: executor))
    writer = BlockWriter(s, Stats(), lambda key, jid, first, last: f"b/{key}/{jid}/{first}-{last}")
    return s, writer


def records_to(last: int, first: int = 1) -> list[JournalRecord]:
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    return [
        JournalRecord(version=v, commit_id=f"c.{v}", command="renew", actor="ann", at=at)
        for v in range(first, last + 1)
    ]


def stored_blocks(s: om.MemoryStore) -> list[str]:
    return sorted(row.key for row in s.list("b/"))


def test_store_old_writes_each_whole_block_a_block_before_the_version_once() -> None:
    s, writer = block_writer()
    writer.store_old("k", "j", records_to(70), 70)  # block 32 only: 64 is not whole before 71
    assert stored_blocks(s) == ["b/k/j/1-32"] and s.faults.calls["put"] == 1
    writer.store_old("k", "j", records_to(70), 70)  # known to be stored: not sent again
    assert s.faults.calls["put"] == 1
    # Block 32 stored (passed over first), block 64 due now: the rest are still looked at.
    writer.store_old("k", "j", records_to(100), 100)
    assert stored_blocks(s) == ["b/k/j/1-32", "b/k/j/33-64"] and s.faults.calls["put"] == 2
    assert writer.unstored("k", "j", records_to(100)) == records_to(100, first=65)


def test_store_old_skips_a_block_not_whole_and_an_object_without_a_journal_id() -> None:
    s, writer = block_writer()
    writer.store_old("k", None, records_to(100), 100)  # no journal id: nothing to store
    assert s.faults.calls["put"] == 0
    writer.store_old("k", "j", records_to(40), 100)  # block 64 holds only 33..40
    assert stored_blocks(s) == ["b/k/j/1-32"]


def test_store_old_waits_for_this_processes_own_writes_of_its_blocks_and_sends_each_once() -> None:
    lazy = _Lazy()
    s, writer = block_writer(lazy)
    writer.write_due("k", "j", records_to(64), 1)  # blocks 32 and 64, in the background
    assert len(lazy.futures) == 2 and s.faults.calls["put"] == 0
    writer.store_old("k", "j", records_to(100), 100)
    # Both were awaited, so the next version drops them, and none was sent twice.
    assert all(f.done() for f in lazy.futures)
    assert writer.unstored("k", "j", records_to(100)) == records_to(100, first=65)
    lazy.run()
    assert stored_blocks(s) == ["b/k/j/1-32", "b/k/j/33-64"] and s.faults.calls["put"] == 2


def test_write_due_sends_the_blocks_this_write_made_whole_and_none_stored() -> None:
    s, writer = block_writer()
    writer.write_due("k", "j", records_to(70), 40)  # block 32 was an earlier write's to send
    assert stored_blocks(s) == ["b/k/j/33-64"] and s.faults.calls["put"] == 1

    s, writer = block_writer()
    writer.store_old("k", "j", records_to(70), 70)  # block 32 stored; the doc still has it
    writer.write_due("k", "j", records_to(70), 1)
    assert stored_blocks(s) == ["b/k/j/1-32", "b/k/j/33-64"] and s.faults.calls["put"] == 2


def test_write_due_sends_again_a_block_whose_write_here_failed() -> None:
    s, writer = block_writer()
    s.faults.add("put", "b/k/j/1-32", "fail", times=1)
    writer.write_due("k", "j", records_to(32), 32)  # refused: it stays with the object
    assert stored_blocks(s) == [] and s.faults.calls["put"] == 1
    writer.write_due("k", "j", records_to(40), 40)  # made whole earlier, but not stored
    assert stored_blocks(s) == ["b/k/j/1-32"] and s.faults.calls["put"] == 2
    assert writer.unstored("k", "j", records_to(40)) == records_to(40, first=33)


def test_a_commit_that_lost_two_races_says_two() -> None:
    s, task = fresh()
    other = om.Task.open(s, "job")
    task.declare_many([("x", "a"), ("y", "a"), ("z", "a")])
    ann, bob = task.agent("ann"), other.agent("bob")
    claim = ann.claim("x")
    assert claim is not None
    rivals = ["y", "z"]
    key = engine(task).shard_key("a")

    busy: list[bool] = []

    def race(op: str, at: str) -> None:  # bob claims before each of ann's first two writes
        if op == "put" and at.endswith(key) and rivals and not busy:
            busy.append(True)  # bob's own write passes through here too
            try:
                bob.claim(rivals.pop(0))
            finally:
                busy.clear()

    s.faults.hooks.append(race)
    ann.renew(claim)
    s.faults.hooks.remove(race)
    records = check_complete(task, key, engine(task).codec("a"))
    assert [(r.command, r.actor, r.lost_races) for r in records][-3:] == [
        ("claim", "bob", None),
        ("claim", "bob", None),
        ("renew", "ann", 2),
    ]
