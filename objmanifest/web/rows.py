"""What the board counts: entries by state, and entries of each stage that became ready,
were consumed or failed per minute, from the journal (the rows of entries and notes are
``wire.shapes``')."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import objmanifest as om

from ..core.model import Shard
from ..wire.shapes import iso

ATTENTION = ("dead", "overdue", "late", "blocked", "backing_off")


"""The lists of ``TaskStatus`` a board shows as needing attention, in this order (those the
installed release has)."""


THROUGHPUT_KINDS = {"ready": "ready", "consumed": "consumed", "failed": "failed", "dead": "failed"}


"""An entry's new state -> the throughput series it counts in."""


def state_counts(entries: Iterable[om.Entry], archived: Iterable[om.State] = ()) -> dict[str, int]:
    counts = {s.value: 0 for s in om.State}
    for entry in entries:
        counts[entry.state.value] += 1
    for state in archived:
        counts[state.value] += 1
    return counts


class Throughput:
    """Entries of each stage that became ready, were consumed or failed, per minute over
    the last minutes, from the journal records of the task's shards."""

    def __init__(self, task: om.Task, bucket_seconds: float = 60.0, buckets: int = 10) -> None:
        self.task = task
        self.bucket_seconds = bucket_seconds
        self.buckets = buckets
        self._seen: dict[str, tuple[str | None, int]] = {}
        """Shard -> (its journal id, the newest version counted): ``Task.stage_logs``."""
        self._events: deque[tuple[datetime, str, str]] = deque()
        self._lock = threading.Lock()

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=self.bucket_seconds * self.buckets)

    def update(self, now: datetime, shards: dict[str, Shard]) -> None:
        """Count what ``shards`` (each shard of the task as ``status`` just read it) recorded
        since last time."""
        with self._lock:
            start = now - self.window
            logs = self.task.stage_logs(shards, self._seen, start, skip_damaged=True)
            for stage, records in logs.items():
                for record in records:
                    for change in record.transitions:
                        kind = THROUGHPUT_KINDS.get(change.after)
                        if kind is not None and change.before != change.after:
                            self._events.append((record.at, stage, kind))
            while self._events and self._events[0][0] < start:
                self._events.popleft()

    def series(self, now: datetime) -> dict[str, Any]:
        """Per stage (and for the task), counts per bucket, oldest first, ending at ``now``."""
        empty = {kind: [0] * self.buckets for kind in ("ready", "consumed", "failed")}
        stages = {s: {k: list(v) for k, v in empty.items()} for s in self.task.stages}
        total = {k: list(v) for k, v in empty.items()}
        with self._lock:
            events = list(self._events)
        # Buckets are aligned to whole bucket lengths of the store's clock, so a view that
        # did not change keeps its ETag until the next bucket starts.
        width = self.bucket_seconds
        end = (int(now.timestamp() // width) + 1) * width
        for at, stage, kind in events:
            n = self.buckets - 1 - int((end - at.timestamp()) // width)
            if 0 <= n < self.buckets and stage in stages:
                stages[stage][kind][n] += 1
                total[kind][n] += 1
        return {
            "bucket_seconds": width,
            "buckets": self.buckets,
            "ends_at": iso(datetime.fromtimestamp(end, tz=now.tzinfo)),
            "stages": stages,
            "total": total,
        }
