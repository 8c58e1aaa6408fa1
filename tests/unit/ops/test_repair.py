"""Repair's pieces on a MemoryStore: the CAS loop replaces only the corrupt bytes a repair
copied aside, the replay of records, the rules for each state, and a shard re-created
meanwhile left alone."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import objmanifest as om
from objmanifest.cas.codecs import ShardCodec
from objmanifest.core import checksum
from objmanifest.ops.archive import due
from objmanifest.ops.replay import RECORDS_AT_RISK, RebuildShard, replay
from objmanifest.store import CREATE
from objmanifest.store.errors import PreconditionFailed
from tests.support.internals import engine


def fresh_store() -> om.MemoryStore:
    return om.MemoryStore("unit", uuid.uuid4().hex)


def new_task(store: om.MemoryStore) -> om.Task:
    return om.Task.create(store, "job", stages=["collect"], lease_seconds=30, max_retries=2)


def test_the_cas_loop_replaces_only_the_corrupt_bytes_it_was_told_of() -> None:
    store = fresh_store()
    task = new_task(store)
    task.declare("a", "collect")
    key = engine(task).shard_key("collect")
    codec: ShardCodec = engine(task).codec("collect")
    store.put(key, b"{broken")
    blob = store.get(key)
    assert blob is not None
    rebuilt = codec.empty().with_entries({})
    command = RebuildShard(rebuilt.model_copy(update={"version": 7}))
    store.put(key, b"{broken differently")  # not the bytes the repair copied aside
    with pytest.raises(om.CorruptShard):
        engine(task).docs.commit(key, codec, command, over=blob.etag)
    assert store.get(key).body == b"{broken differently"  # type: ignore[union-attr]
    without = store.get(key)
    assert without is not None
    assert engine(task).docs.commit(key, codec, command, over=without.etag) is True
    assert task.shard("collect").version == 8
    assert [r.command for r in engine(task).journal.records(key, codec)] == ["repair"]


def test_a_shard_recreated_before_the_repair_writes_is_left_alone() -> None:
    store = fresh_store()
    task = new_task(store)
    task.declare("a", "collect")
    key = engine(task).shard_key("collect")
    store.delete(key)
    engine(task).docs.forget(key)
    task.declare("fresh", "collect")  # re-creates the shard, create-only
    command = RebuildShard(engine(task).codec("collect").empty())
    assert engine(task).docs.commit(key, engine(task).codec("collect"), command) is False
    assert set(task.shard("collect").entries) == {"fresh"}


def test_replay_follows_each_entry_to_its_last_recorded_fields() -> None:
    store = fresh_store()
    task = new_task(store)
    task.declare("a", "collect", consumers=["x", "y"])
    task.declare("gone", "collect")
    agent = task.agent("p")
    claim = agent.claim("a")
    assert claim is not None
    agent.put(claim, b"data")
    task.agent("x").consume("a")
    key = engine(task).shard_key("collect")
    seen = replay(engine(task).journal.records(key, engine(task).codec("collect")))
    a = seen["a"]
    assert (a.state, a.epoch, a.producer, a.consumed_by) == ("ready", 1, "p", ("x",))
    entry = task.entry("a")
    assert (a.key, a.size, a.checksum) == (entry.key, 4, entry.checksum)
    assert a.consumers == ("x", "y") and a.declared_at == entry.declared_at
    assert seen["gone"].state == "pending" and seen["gone"].consumers is None


def test_a_deleted_shard_without_blocks_comes_back_from_the_index_fenced() -> None:
    store = fresh_store()
    task = new_task(store)
    task.declare_many([("a", "collect"), ("b", "collect"), ("c", "collect", ["a"])])
    agent = task.agent("p")
    claim = agent.claim("a")
    assert claim is not None
    agent.put(claim, b"data")  # data@1 exists, but its records go with the shard
    held = task.agent("q").claim("b")  # writing at epoch 1: its record goes with the shard
    assert held is not None and held.epoch == 1
    store.delete(engine(task).shard_key("collect"))
    report = task.repair()
    (obj,) = report.objects
    assert (obj.damage, obj.action, obj.records, obj.moved_to) == ("deleted", "rebuilt", 0, None)
    restored = {e.file_id: e for e in obj.entries}
    assert restored["a"].epoch == 1 + 1 + RECORDS_AT_RISK  # above its data key's epoch
    assert restored["b"].epoch == restored["c"].epoch == 1 + RECORDS_AT_RISK
    assert all(e.state == "pending" and "consumers" in e.lost for e in obj.entries)
    assert task.entry("c").depends_on == ("a",)
    for holder, stale in ((agent, claim), (task.agent("q"), held)):
        with pytest.raises(om.LeaseLost):
            holder.put(stale, b"data")
    assert task.agent("q").claim("b").epoch == 2 + RECORDS_AT_RISK  # type: ignore[union-attr]
    # The copy a repair makes of a corrupt object is create-only: it never overwrites.
    aside = engine(task).layout.damaged(engine(task).shard_key("collect"), store.now())
    store.put(aside, b"first", mode=CREATE)
    with pytest.raises(PreconditionFailed):
        store.put(aside, b"second", mode=CREATE)


def test_a_chunked_entry_keeps_its_whole_checksum_through_the_journal_and_a_repair() -> None:
    store = fresh_store()
    task = om.Task.create(
        store,
        "job",
        stages=["collect"],
        lease_seconds=30,
        transfer=om.TransferConfig(threshold=5 << 20, part_size=5 << 20),
    )
    task.declare("big", "collect")
    agent = task.agent("p")
    claim = agent.claim("big")
    assert claim is not None
    body = bytes(range(256)) * (45 << 12)  # 11.25 MiB: three parts
    made = agent.put(claim, body)
    assert made.is_chunked and made.whole_checksum == checksum.of_bytes(body)
    task.agent("x").consume("big")
    key = engine(task).shard_key("collect")
    seen = replay(engine(task).journal.records(key, engine(task).codec("collect")))
    assert seen["big"].whole_checksum == made.whole_checksum
    blob = store.get(key)
    assert blob is not None
    damaged = json.loads(blob.body)
    damaged["entries"] = 7  # its records can be read, its entries not
    store.put(key, json.dumps(damaged).encode())
    report = task.repair()
    assert [o.action for o in report.objects] == ["rebuilt"]
    restored = task.entry("big")
    assert (restored.state, restored.whole_checksum) == (om.State.consumed, made.whole_checksum)


def produce_and_consume(task: om.Task, file_id: str) -> None:
    """``file_id`` declared in ``collect``, produced and consumed: a terminal entry."""
    task.declare(file_id, "collect")
    agent = task.agent("p")
    claim = agent.claim(file_id)
    assert claim is not None
    agent.put(claim, b"x")
    task.agent("c").consume(file_id)


def test_archive_older_than_0_takes_an_entry_stamped_after_this_process_s_now() -> None:
    """A new process knows the store's clock to a ``Date`` header's second: an entry another
    process finished a moment ago may be stamped after its ``now``. ``older_than=0`` takes
    every terminal entry all the same; any other age keeps to the clock."""
    store = fresh_store()
    task = new_task(store)
    produce_and_consume(task, "a")
    shard = engine(task).read_shard(engine(task).layout.shard_of("collect", "a"))
    stamped = shard.entries["a"].updated_at
    assert stamped is not None
    before = stamped - timedelta(seconds=0.5)
    assert set(due(shard, before, 0)) == {"a"}
    assert due(shard, before, 1) == {}
    assert set(due(shard, stamped + timedelta(seconds=1), 1)) == {"a"}


def test_gc_consumed_older_than_0_frees_data_stamped_after_this_process_s_now() -> None:
    """As for archive: data another process consumed a moment ago may be stamped after a new
    process's ``now``; ``consumed_older_than=0`` frees it all the same."""
    clock = [datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)]
    store = om.MemoryStore("unit", uuid.uuid4().hex, clock=lambda: clock[0])
    task = new_task(store)
    produce_and_consume(task, "a")
    clock[0] -= timedelta(seconds=0.5)
    assert task.gc(consumed_older_than=1).bytes_freed == 0
    assert task.gc(consumed_older_than=0).bytes_freed == 1
