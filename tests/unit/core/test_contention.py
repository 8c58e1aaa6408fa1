"""A stage's collisions, read from the records its shards carry."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from objmanifest.core.contention import CONTENDED, MIN_COMMITS, RECENT, Contention, of_records
from objmanifest.core.model import JournalRecord

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


def record(version: int, lost: int | None, ago: float = 1.0) -> JournalRecord:
    return JournalRecord(
        version=version,
        commit_id=f"c{version}",
        command="claim",
        actor="a",
        at=NOW - timedelta(seconds=ago),
        lost_races=lost,
    )


def test_recent_commits_that_lose_races_name_the_stage_contended() -> None:
    got = of_records([record(v, 1 if v % 2 else None) for v in range(20)], NOW)
    assert (got.commits, got.lost) == (20, 10)
    assert got.per_commit == 0.5 and got.contended


def test_old_commits_count_for_nothing() -> None:
    old = RECENT.total_seconds() + 1
    got = of_records([record(v, 3, ago=old) for v in range(30)] + [record(99, None)], NOW)
    assert (got.commits, got.lost, got.contended) == (1, 0, False)


def test_a_few_commits_say_nothing_and_partitions_add_up() -> None:
    few = of_records([record(v, 1) for v in range(MIN_COMMITS - 1)], NOW)
    assert few.per_commit >= CONTENDED and not few.contended
    calm = of_records([record(v, None) for v in range(50)], NOW)
    assert not (few + calm).contended and (few + calm).commits == 50 + MIN_COMMITS - 1
    assert not Contention().contended and Contention().per_commit == 0.0
