"""A shard rebuilt from its journal: records salvaged from damaged bytes, merged, replayed
into entries (every one fenced unless nothing can have followed it), and the named commits
that put a rebuilt shard or index in place."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from pydantic import ValidationError

import shard_index

from ..cas.blocks import BLOCK
from ..cas.codecs import REMOVED
from ..cas.policy import GROUP_MAX
from ..core.model import JournalRecord, Shard, State
from .reports import RestoredEntry

RECORDS_AT_RISK = 2 * BLOCK + GROUP_MAX

"""How many versions an object carries unflushed while its block writes succeed (two blocks,
and a group commit's members, each a version, landed in one write): the epoch margin given
to an entry rebuilt without the object's own records."""


@dataclass(frozen=True)
class RebuildShard:
    """A rebuilt shard in place of a deleted or corrupt one; nothing to write if a valid
    shard is there by now (someone re-created it meanwhile)."""

    rebuilt: Shard
    name: ClassVar[str] = "repair"
    actor: ClassVar[str] = ""

    def apply(self, doc: Shard, now: datetime) -> tuple[Shard | None, bool]:
        if doc.entries or doc.version:
            return None, False
        return self.rebuilt, True


@dataclass(frozen=True)
class RebuildIndex:
    """A rebuilt index in place of a deleted or corrupt one; nothing to write if a valid
    index is there by now."""

    rebuilt: shard_index.ShardIndex
    name: ClassVar[str] = "repair"
    actor: ClassVar[str] = ""

    def apply(
        self, doc: shard_index.ShardIndex, now: datetime
    ) -> tuple[shard_index.ShardIndex | None, bool]:
        if len(doc) or doc.version:
            return None, False
        return self.rebuilt, True


def salvage(body: bytes) -> tuple[list[JournalRecord], bool]:
    """The journal records a damaged object still carries, and whether they could all be
    read (then the journal is complete up to the object's own version)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # not JSON, or nested too deep
        return [], False
    raw = data.get("journal") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        return [], False
    try:
        return [JournalRecord.model_validate(r) for r in raw], True
    except ValidationError:
        return [], False


def merged(records: Iterable[JournalRecord]) -> list[JournalRecord]:
    """One record per version (blocks and the object may hold the same one), oldest first."""
    found: dict[tuple[str, int], JournalRecord] = {}
    for record in records:
        found.setdefault((record.commit_id, record.version), record)
    return sorted(found.values(), key=lambda r: r.version)


@dataclass
class Seen:
    """An entry as its records leave it."""

    file_id: str
    state: str | None = None
    epoch: int = 0
    max_epoch: int = 0
    retry_count: int = 0
    error: str | None = None
    checksum: str | None = None
    key: str | None = None
    size: int | None = None
    part_size: int | None = None
    parts_key: str | None = None
    whole_checksum: str | None = None
    consumed_by: tuple[str, ...] = ()
    depends_on: tuple[str, ...] | None = None
    consumers: tuple[str, ...] | None = None
    producer: str | None = None
    declared_at: datetime | None = None
    updated_at: datetime | None = None
    claimed_at: datetime | None = None
    ready_at: datetime | None = None
    retry_at: datetime | None = None
    removed: bool = False


def replay(records: Iterable[JournalRecord]) -> dict[str, Seen]:
    """Every entry's last known fields, from the transitions of ``records`` in order."""
    seen: dict[str, Seen] = {}
    for record in records:
        for change in record.transitions:
            entry = seen.setdefault(change.item, Seen(change.item))
            if change.after == REMOVED:
                entry.removed = True
                continue
            if change.before is None:  # declared (again, after it was removed)
                entry.removed = False
                entry.declared_at = record.at
                entry.depends_on, entry.consumers = change.depends_on, change.consumers
            if change.after == State.ready.value and change.before != State.ready.value:
                entry.producer = record.actor
            entry.state = change.after
            entry.updated_at = record.at
            if change.epoch is not None:
                entry.epoch = change.epoch
                entry.max_epoch = max(entry.max_epoch, change.epoch)
            entry.retry_count = change.retry_count or 0
            entry.error = change.error
            entry.checksum = change.checksum
            entry.key, entry.size = change.key, change.size
            entry.part_size, entry.parts_key = change.part_size, change.parts_key
            entry.whole_checksum = change.whole_checksum
            entry.consumed_by = change.consumed_by or ()
            # Recorded when they change (``retry_at`` whenever the entry has one).
            entry.claimed_at = change.claimed_at or entry.claimed_at
            entry.ready_at = change.ready_at or entry.ready_at
            entry.retry_at = change.retry_at
    return seen


@dataclass
class ShardPlan:
    """A shard to rebuild: its entries and the report of each."""

    shard: Shard
    restored: list[RestoredEntry] = field(default_factory=list)
