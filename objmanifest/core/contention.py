"""How often writers of a stage collide, from the journal records its shards carry.

Every commit's record says how many conditional writes it lost before its own landed
(``JournalRecord.lost_races``), and a shard carries its newest records: any process that
reads the stage's shards (``status``, the web page, the metrics) sees where agents collide,
not only the agents that lost. A stage whose recent commits lose a race every few commits
has more agents than its shards take: it needs more partitions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from .model import JournalRecord

RECENT = timedelta(minutes=10)
"""Only commits decided this recently (store time) count."""
CONTENDED = 0.3
"""Lost races per landed commit from which a stage is named as contended."""
MIN_COMMITS = 10
"""Fewer recent commits than this say nothing either way."""


@dataclass(frozen=True)
class Contention:
    """Recent commits of one stage and the races they lost on the way."""

    commits: int = 0
    lost: int = 0

    @property
    def per_commit(self) -> float:
        return self.lost / self.commits if self.commits else 0.0

    @property
    def contended(self) -> bool:
        return self.commits >= MIN_COMMITS and self.per_commit >= CONTENDED

    def __add__(self, other: Contention) -> Contention:
        return Contention(self.commits + other.commits, self.lost + other.lost)


def of_records(records: Iterable[JournalRecord], now: datetime) -> Contention:
    """The commits among ``records`` decided within ``RECENT`` of ``now``, and their losses."""
    since = now - RECENT
    recent = [r for r in records if r.at >= since]
    return Contention(len(recent), sum(r.lost_races or 0 for r in recent))
