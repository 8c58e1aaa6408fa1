"""The checker sees each invariant broken: a real run on MemoryStore, then a doctored log or
a doctored commit (a named command that does what no command of the library may)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from objmanifest.core import checksum
from objmanifest.core.model import Entry, Shard
from objmanifest.core.states import State
from objmanifest.store.memory import MemoryStore
from objmanifest.task import Task
from tests.support.checker import (
    ACK_MISSING,
    BAD_BYTES,
    CLAIM,
    CONSUME,
    DECLARE,
    FAIL,
    FENCED_CHANGE,
    JOURNAL_GAP,
    LEASE_STOLEN,
    LIFECYCLE,
    NOT_SETTLED,
    OK,
    PUT,
    READY_TWICE,
    REFUSED,
    UNASKED_CHANGE,
    Op,
    OpLog,
    Violation,
    check,
    summary,
)
from tests.support.internals import engine
from tests.support.stores import ManualClock


@dataclass(frozen=True)
class Doctor:
    """A commit that sets fields of one entry, named like a command of the library."""

    name: str
    actor: str
    file_id: str
    fields: tuple[tuple[str, Any], ...]

    def apply(self, shard: Shard, now: datetime) -> tuple[Shard, Entry]:
        changed = shard.entries[self.file_id].model_copy(
            update={**dict(self.fields), "updated_at": now}
        )
        return shard.with_entries({self.file_id: changed}), changed


@dataclass
class Run:
    task: Task
    clock: ManualClock
    log: OpLog

    def doctor(self, name: str, actor: str, file_id: str, **fields: Any) -> None:
        task = self.task
        shard = engine(task).layout.shard_of(task.stage_of(file_id), file_id)
        engine(task).docs.commit(
            engine(task).layout.shard(shard),
            engine(task).codec(shard),
            Doctor(name, actor, file_id, tuple(fields.items())),
        )

    def produce(self, agent: str, file_id: str, data: bytes) -> Entry:
        claim = self.task.agent(agent).claim(file_id)
        assert claim is not None
        self.log.record(agent, CLAIM, file_id=file_id, stage="make", epoch=claim.epoch)
        entry = self.task.agent(agent).put(claim, data)
        self.log.record(
            agent, PUT, file_id=file_id, stage="make", epoch=claim.epoch, checksum=entry.checksum
        )
        return entry

    def consume(self, agent: str, file_id: str) -> bytes:
        data = self.task.agent(agent).consume(file_id)
        self.log.record(agent, CONSUME, file_id=file_id, checksum=checksum.of_bytes(data))
        return data

    def declare(self, *file_ids: str) -> None:
        self.task.declare_many([(f, "make") for f in file_ids])
        for f in file_ids:
            self.log.record("boss", DECLARE, file_id=f, stage="make")

    def found(self, **kwargs: Any) -> dict[str, int]:
        return {k: n for k, n in summary(check(self.task, self.log, **kwargs)).items() if n}


@pytest.fixture
def run() -> Run:
    clock = ManualClock()
    store = MemoryStore(f"checker-{uuid.uuid4().hex[:12]}", clock=clock)
    task = Task.create(store, "job", ["make"], lease_seconds=30, max_retries=5)
    r = Run(task, clock, OpLog())
    r.declare("a")
    r.produce("p", "a", b"hello")
    r.consume("c", "a")
    return r


def test_a_correct_run_has_no_violation(run: Run) -> None:
    assert check(run.task, run.log) == []


def test_the_log_is_json_lines_and_merges(run: Run, tmp_path: Path) -> None:
    run.log.save(tmp_path / "a.jsonl")
    OpLog([Op("q", CLAIM, REFUSED, file_id="z")]).save(tmp_path / "b.jsonl")
    merged = OpLog.load(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert [op.kind for op in merged] == [DECLARE, CLAIM, PUT, CONSUME, CLAIM]
    assert list(merged)[:4] == list(run.log)
    assert json.loads((tmp_path / "a.jsonl").read_text().splitlines()[2])["epoch"] == 1
    with pytest.raises(ValueError, match="unknown op kind 'teleport'"):
        Op("q", "teleport")


def test_an_entry_made_ready_twice_in_one_epoch(run: Run) -> None:
    run.doctor("doctor", "p", "a", state=State.writing, owner="p")
    run.doctor("finish", "p", "a", state=State.ready)
    assert READY_TWICE in run.found(settled=False)


def test_a_change_by_a_fenced_holder(run: Run) -> None:
    run.declare("b")
    old = run.task.agent("p").claim("b")
    assert old is not None
    run.log.record("p", CLAIM, file_id="b", epoch=old.epoch)
    run.clock.advance(60)
    new = run.task.agent("q").claim("b")
    assert new is not None and new.epoch == old.epoch + 1
    run.log.record("q", CLAIM, file_id="b", epoch=new.epoch)
    assert run.found(settled=False) == {}
    key = engine(run.task).layout.data("make", "b", old.epoch)
    run.doctor("finish", "p", "b", state=State.ready, owner=None, key=key, checksum="xxh3-128:0")
    assert run.found(settled=False) == {FENCED_CHANGE: 2}  # a stale holder, an old key


def test_a_change_its_agent_was_told_was_refused(run: Run) -> None:
    run.declare("b")
    claim = run.task.agent("p").claim("b")
    assert claim is not None
    run.log.record("p", CLAIM, REFUSED, file_id="b", detail="NotClaimable")
    assert run.found(settled=False) == {UNASKED_CHANGE: 1}


def test_a_lease_taken_over_before_it_ended(run: Run) -> None:
    run.declare("b")
    claim = run.task.agent("p").claim("b")
    assert claim is not None
    run.log.record("p", CLAIM, file_id="b", epoch=claim.epoch)
    run.clock.advance(29)
    run.doctor("claim", "q", "b", owner="q", epoch=claim.epoch + 1)
    run.log.record("q", CLAIM, file_id="b", epoch=claim.epoch + 1)
    assert run.found(settled=False) == {LEASE_STOLEN: 1}


def test_an_acknowledged_commit_that_is_missing(run: Run) -> None:
    run.declare("b")
    claim = run.task.agent("p").claim("b")
    assert claim is not None
    run.log.record("p", CLAIM, file_id="b", epoch=claim.epoch)
    run.log.record("p", PUT, OK, file_id="b", epoch=claim.epoch, checksum="xxh3-128:1")
    assert run.found(settled=False) == {ACK_MISSING: 1}


def test_consumed_bytes_that_match_no_checksum(run: Run) -> None:
    run.log.record("c", CONSUME, file_id="a", checksum=checksum.of_bytes(b"hellp"))
    assert run.found() == {BAD_BYTES: 1}


def test_entries_left_neither_terminal_nor_legitimately_leased(run: Run) -> None:
    run.declare("b", "c")
    claim = run.task.agent("p").claim("c")
    assert claim is not None
    run.log.record("p", CLAIM, file_id="c", epoch=claim.epoch)
    assert run.found(live_agents={"p"}) == {NOT_SETTLED: 1}  # b: pending
    assert run.found(live_agents={"q"}) == {NOT_SETTLED: 2}  # and c: held by the dead
    assert run.found(settled=False) == {}
    run.clock.advance(31)
    found = check(run.task, run.log, settled=False)
    assert [(v.invariant, v.file_id) for v in found] == [(NOT_SETTLED, "c")]


def test_an_entry_blocked_behind_a_dead_dependency_is_settled(run: Run) -> None:
    run.task.declare("dep", "make")
    run.task.declare("after", "make", depends_on=["dep"])
    for _ in range(6):  # max_retries=5: the sixth failure kills it
        claim = run.task.agent("p").claim("dep")
        assert claim is not None
        run.log.record("p", CLAIM, file_id="dep", epoch=claim.epoch)
        run.task.agent("p").fail(claim, "bad")
        run.log.record("p", FAIL, file_id="dep", epoch=claim.epoch)
    assert run.task.entry("dep").state is State.dead
    assert run.found() == {}
    run.task.declare("other", "make", depends_on=["a"])  # a is consumed: claimable
    assert run.found() == {NOT_SETTLED: 1}


def test_a_journal_with_a_gap(run: Run) -> None:
    key = engine(run.task).layout.shard("make")
    blob = run.task.store.get(key)
    assert blob is not None
    doc = json.loads(blob.body)
    assert [r["command"] for r in doc["journal"]][-2:] == ["finish", "consume"]
    doc["journal"] = doc["journal"][:-2] + doc["journal"][-1:]  # the finish's record lost
    run.task.store.put(key, json.dumps(doc).encode())
    found = check(run.task, run.log)
    assert found[0].invariant == JOURNAL_GAP and "missing [" in found[0].message
    # and so the put and the bytes consumed are no longer accounted for
    assert [v.invariant for v in found[1:]] == [ACK_MISSING, BAD_BYTES]


def test_a_transition_the_lifecycle_table_forbids(run: Run) -> None:
    run.declare("b")
    run.doctor("consume", "c", "b", state=State.consumed)
    assert run.found() == {LIFECYCLE: 1}


def test_a_violation_names_its_invariant() -> None:
    assert str(Violation(LIFECYCLE, "x -> y", "a")) == "lifecycle: x -> y"
