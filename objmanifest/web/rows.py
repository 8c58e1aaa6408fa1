"""How one entry, a count of entries and a throughput series look in the page's JSON: the rows
every view is built from."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import objmanifest as om

from ..core.model import EntryNote, Shard, State

ATTENTION = ("dead", "overdue", "late", "blocked", "backing_off")


"""The lists of ``TaskStatus`` a board shows as needing attention, in this order (those the
installed release has)."""


THROUGHPUT_KINDS = {"ready": "ready", "consumed": "consumed", "failed": "failed", "dead": "failed"}


"""An entry's new state -> the throughput series it counts in."""


def iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def entry_row(entry: om.Entry, partition: str | None = None) -> dict[str, Any]:
    """One entry as the API gives it (the page computes the lease left from
    ``lease_expires_at`` and the view's ``store_time``)."""
    return {
        "file_id": entry.file_id,
        "stage": entry.stage,
        "state": entry.state.value,
        "holder": entry.owner,
        "epoch": entry.epoch,
        "lease_expires_at": iso(entry.lease_expires_at),
        "retries": entry.retry_count,
        "size": entry.size,
        "checksum": entry.checksum,
        "error": entry.error,
        "declared_at": iso(entry.declared_at),
        "updated_at": iso(entry.updated_at),
        "claimed_at": iso(entry.claimed_at),
        "ready_at": iso(entry.ready_at),
        "retry_at": iso(entry.retry_at),
        "depends_on": list(entry.depends_on),
        "consumers": list(entry.consumers),
        "consumed_by": list(entry.consumed_by),
        "chunked": entry.is_chunked,
        "data_removed_at": iso(entry.data_removed_at),
        "partition": partition,
        "archived": False,
    }


def state_counts(entries: Iterable[om.Entry], archived: Iterable[State] = ()) -> dict[str, int]:
    counts = {s.value: 0 for s in State}
    for entry in entries:
        counts[entry.state.value] += 1
    for state in archived:
        counts[state.value] += 1
    return counts


def note_row(note: EntryNote) -> dict[str, Any]:
    return {
        "file_id": note.file_id,
        "stage": note.stage,
        "state": note.state.value,
        "reason": note.reason,
    }


class Throughput:
    """Entries of each stage that became ready, were consumed or failed, per minute over
    the last minutes, from the journal records of the task's shards."""

    def __init__(self, task: om.Task, bucket_seconds: float = 60.0, buckets: int = 10) -> None:
        self.task = task
        self.bucket_seconds = bucket_seconds
        self.buckets = buckets
        self._seen: dict[str, tuple[str | None, int]] = {}
        """Shard key -> (its journal id, the newest version counted)."""
        self._events: deque[tuple[datetime, str, str]] = deque()
        self._lock = threading.Lock()

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=self.bucket_seconds * self.buckets)

    def update(self, now: datetime, shards: dict[str, Shard]) -> None:
        """Count what ``shards`` (each shard of the task as ``status`` just read it) recorded
        since last time."""
        task = self.task
        with self._lock:
            start = now - self.window
            single = task.layout.single
            index = None
            if single:
                try:
                    index = task.docs.cached(task.layout.index, task.index_codec)
                except om.CorruptShard:  # status names it under damage
                    index = None
            for shard, doc in shards.items():
                key, codec = task.layout.shard(shard), task.codec(shard)
                try:
                    found = self._new_records(key, codec, doc, start)
                except om.CorruptShard:  # a damaged journal block: `repair` mends it
                    found = []
                for record in found:
                    stage_of_shard = task.layout.stage_of_shard(shard)
                    for change in record.transitions:
                        kind = THROUGHPUT_KINDS.get(change.after)
                        if kind is None or change.before == change.after:
                            continue
                        stage = stage_of_shard or (index.stage_of(change.item) if index else None)
                        if stage is not None:
                            self._events.append((record.at, stage, kind))
            while self._events and self._events[0][0] < start:
                self._events.popleft()

    def _new_records(
        self, key: str, codec: Any, doc: Any, start: datetime
    ) -> list[om.JournalRecord]:
        journal = codec.journal(doc)
        if journal is None:
            return []  # a task at schema 1 keeps no journal
        journal_id, live = journal
        seen = self._seen.get(key)
        if not live:
            return []
        newest = live[-1].version
        if seen is not None and seen[0] == journal_id and live[0].version <= seen[1] + 1:
            found = [r for r in live if r.version > seen[1]]
        else:
            # The first look, a new incarnation, or records moved to blocks in between.
            after = seen[1] if seen is not None and seen[0] == journal_id else 0
            found = [
                r
                for r in self.task.journal.records(key, codec, after=after)
                if r.version > after and r.at >= start
            ]
        self._seen[key] = (journal_id, max(newest, seen[1] if seen else 0))
        return sorted(found, key=lambda r: r.version)

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
