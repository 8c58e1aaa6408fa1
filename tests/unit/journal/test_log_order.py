"""The task's log: within one object its versions are the order, whatever the times its
writers' store clocks gave them; across objects, store time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from objmanifest.core.model import JournalRecord
from objmanifest.journal.history import decided_order

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def record(key: str, version: int, seconds: float, command: str) -> JournalRecord:
    return JournalRecord(
        version=version,
        commit_id=f"{key}-{version}",
        command=command,
        actor="a",
        at=T0 + timedelta(seconds=seconds),
        object_key=key,
    )


def test_a_later_version_stamped_earlier_by_another_clock_stays_after_its_predecessor() -> None:
    shard = [
        record("shards/collect.json", 1, 0.9, "declare"),
        record("shards/collect.json", 2, 0.2, "claim_many"),  # another process's clock
        record("shards/collect.json", 3, 1.5, "finish"),
    ]
    index = [record("index.json", 1, 0.8, "declare")]
    got = [(r.object_key, r.version) for r in decided_order([shard, index])]
    assert got == [
        ("index.json", 1),
        ("shards/collect.json", 1),
        ("shards/collect.json", 2),
        ("shards/collect.json", 3),
    ]


def test_objects_interleave_by_store_time_then_key_then_version() -> None:
    a = [record("a", 1, 1.0, "x"), record("a", 2, 3.0, "x")]
    b = [record("b", 1, 2.0, "x"), record("b", 2, 3.0, "x")]
    got = [(r.object_key, r.version) for r in decided_order([b, a])]
    assert got == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
