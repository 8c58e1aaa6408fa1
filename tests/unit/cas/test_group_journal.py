"""A group commit of a real task on ``MemoryStore``: every member is a version of the shard
with its own journal record (the write's commit id, its own command, actor and
transitions), its own event, and its own place in an entry's history; block writes, the
log and a repair from the journal see them as they would see commits written one by one.

Block writes run at once in the committing thread (``INLINE``), so the store holds exactly
what the test says.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest

import objmanifest as om
from objmanifest.cas.codecs import IndexCodec, ShardCodec
from objmanifest.core.commit_events import CommitEvent
from objmanifest.core.model import COMMITS_KEPT
from objmanifest.ops.replay import RECORDS_AT_RISK
from tests.support.internals import engine

from .test_group_commit import until
from .test_journal import INLINE

WAIT = 5.0


class Held:
    """Commits of ``task``'s shard ``a``: the first (in a thread called "leader") stalls in its
    PUT; each ``queue``d one runs in its own thread and is waited for until it is queued."""

    def __init__(self, store: om.MemoryStore, task: om.Task) -> None:
        self.key = engine(task).shard_key("a")
        self.lane = engine(task).docs._lane(self.key)
        self.stalled, self.released = threading.Event(), threading.Event()
        self.threads: list[threading.Thread] = []
        self.got: dict[str, Any] = {}

        def stall(op: str, key: str) -> None:
            leader = threading.current_thread().name == "leader"
            if op == "put" and key == self.key and leader and not self.stalled.is_set():
                self.stalled.set()
                assert self.released.wait(60)

        store.faults.hooks.append(stall)

    def _start(self, name: str, call: Any) -> None:
        def run() -> None:
            try:
                self.got[name] = call()
            except BaseException as e:
                self.got[name] = e

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def hold(self, call: Any) -> None:
        self._start("leader", call)
        assert self.stalled.wait(WAIT)

    def queue(self, name: str, call: Any) -> None:
        before = len(self.lane.queue)
        self._start(name, call)
        until(lambda: len(self.lane.queue) == before + 1)

    def go(self) -> dict[str, Any]:
        self.released.set()
        for thread in self.threads:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in self.threads)
        return self.got


def test_each_member_of_a_group_is_a_version_with_its_own_record_event_and_history() -> None:
    store = om.MemoryStore(f"group-{uuid.uuid4().hex[:8]}", "p", runtime=INLINE)
    task = om.Task.create(store, "job", stages=["a", "b"])
    ids = [f"f{i}" for i in range(6)]
    task.declare_many([(f, "a") for f in ids])  # version 1
    first = task.agent("a0").claim("f0")  # version 2
    assert first is not None
    for _ in range(26):  # versions 3..28
        first = task.agent("a0").renew(first)
    events: list[CommitEvent] = []
    engine(task).docs.observers.subscribe(events.append)
    before = engine(task).docs.stats.commits, engine(task).docs.stats.grouped

    held = Held(store, task)
    held.hold(lambda: task.agent("a1").claim("f1"))  # version 29, stalled
    for n in range(2, 6):  # versions 30..33 in one write: across the end of block 1..32
        held.queue(f"a{n}", lambda n=n: task.agent(f"a{n}").claim(f"f{n}"))
    got = held.go()

    claims = {name: got[name if name != "a1" else "leader"] for name in ("a1", "a2", "a3")}
    assert all(isinstance(c, om.Claim) for c in claims.values())
    assert {got["a4"].file_id, got["a5"].file_id} == {"f4", "f5"}
    assert engine(task).docs.stats.commits - before[0] == 5
    assert engine(task).docs.stats.grouped - before[1] == 3  # two writes for five commits

    key, codec = engine(task).shard_key("a"), engine(task).codec("a")
    shard = engine(task).docs.read(key, codec)
    assert shard.version == 33
    records = engine(task).journal.records(key, codec)
    assert [r.version for r in records] == list(range(1, 34))  # one record per version
    group = records[29:]
    assert len({r.commit_id for r in group}) == 1 and group[0].commit_id != records[28].commit_id
    assert shard.commits[-2:] == (records[28].commit_id, group[0].commit_id)  # each id once
    assert [(r.command, r.actor) for r in group] == [("claim", f"a{n}") for n in range(2, 6)]
    assert [[(c.item, c.before, c.after) for c in r.transitions] for r in group] == [
        [(f"f{n}", "pending", "writing")] for n in range(2, 6)
    ]
    assert len({r.at for r in group}) == 1
    # Block 1..32 holds the group's first three members (the shard still carries them, until
    # its next commit knows the block is stored); the fourth is in the shard only.
    (block,) = [row.key for row in store.list(engine(task).layout.journal_prefix)]
    assert block == engine(task).layout.journal_block(key, shard.journal_id or "", 1, 32)
    assert [r.version for r in shard.journal or ()] == list(range(1, 34))

    # Events: one per member, in its own caller's thread, the same as its record.
    mine = [e for e in events if e.key == key]
    assert sorted(e.version or 0 for e in mine) == list(range(29, 34))
    assert Counter(t.item for e in mine for t in e.transitions) == Counter(ids[1:])
    for e in mine:
        (record,) = [r for r in records if r.version == e.version]
        assert (e.commit_id, e.command, e.actor, e.transitions) == (
            record.commit_id,
            record.command,
            record.actor,
            record.transitions,
        )

    # History and log: each member as a commit of its own.
    assert [(t.command, t.actor, t.to_state) for t in task.history("f3")] == [
        ("declare", "", "pending"),
        ("claim", "a3", "writing"),
    ]
    assert [r.version for r in task.log(agent="a4")] == [group[2].version]

    # A repair from the journal: the block's records rebuild what they saw; the record that
    # went with the shard is covered by the margin, and no claim comes back to life.
    store.delete(key)
    report = task.repair()
    (obj,) = report.objects
    assert (obj.damage, obj.action, obj.records) == ("deleted", "rebuilt", 32)
    restored = {e.file_id: e for e in obj.entries}
    assert {f: restored[f].state for f in ids} == {
        **{f: "failed" for f in ids[:5]},
        "f5": "pending",
    }
    assert all(restored[f].epoch == 1 + 1 + RECORDS_AT_RISK for f in ids[:5])
    for n, claim in [(0, first), *((n, got[f"a{n}" if n else "leader"]) for n in range(2, 6))]:
        with pytest.raises(om.LeaseLost):
            task.agent(f"a{n}").renew(claim)


def test_members_sharing_a_write_remember_its_commit_id_once() -> None:
    codec = ShardCodec(task_id="job", stage="a")
    doc = codec.empty()
    for n in range(COMMITS_KEPT):
        doc = codec.stamp(doc, f"c{n}")
    once = codec.stamp(doc, "g")
    twice = codec.stamp(once, "g")
    assert (once.version, twice.version) == (COMMITS_KEPT + 1, COMMITS_KEPT + 2)
    assert twice.commits == once.commits == (*(f"c{n}" for n in range(1, COMMITS_KEPT)), "g")
    assert codec.stamp(twice, "h").commits[-2:] == ("g", "h")

    index_codec = IndexCodec()
    index = index_codec.empty()
    index = index_codec.stamp(index_codec.stamp(index, "g"), "g")
    assert index.meta.commits == ("g",)
    assert index_codec.stamp(index, "h").meta.commits == ("g", "h")


def test_a_group_that_lost_a_race_says_so_in_its_first_members_record_only() -> None:
    store = om.MemoryStore(f"group-{uuid.uuid4().hex[:8]}", "p", runtime=INLINE)
    task = om.Task.create(store, "job", stages=["a"])
    rival = om.Task.open(store, "job")
    task.declare_many([(f"f{i}", "a") for i in range(5)])
    key = engine(task).shard_key("a")
    raced: list[str] = []

    def race(op: str, at: str) -> None:  # the group's first write loses to the rival's
        name = threading.current_thread().name
        if op == "put" and at == key and name.startswith("g") and not raced:
            raced.append(name)
            rival.agent("r").claim("f4")

    held = Held(store, task)
    store.faults.hooks.append(race)
    held.hold(lambda: task.agent("a0").claim("f0"))
    for n in range(1, 4):
        held.queue(f"g{n}", lambda n=n: task.agent(f"g{n}").claim(f"f{n}"))
    got = held.go()
    assert raced and all(isinstance(got[f"g{n}"], om.Claim) for n in range(1, 4))
    records = engine(task).journal.records(key, engine(task).codec("a"))
    group = [r for r in records if r.actor.startswith("g")]
    assert [r.lost_races for r in group] == [1, None, None]
