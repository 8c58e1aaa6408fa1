"""A shard rebuilt from its journal: records salvaged from damaged bytes, merged, replayed
into entries (every one fenced unless nothing can have followed it: ``rebuilt_entry``), and
the named commits that put a rebuilt shard or index in place."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from pydantic import ValidationError

import shard_index

from ..cas.blocks import BLOCK
from ..cas.codecs import REMOVED
from ..cas.policy import GROUP_MAX
from ..core.layout import TaskLayout
from ..core.model import Entry, JournalRecord, Shard
from ..core.plain import MAX_NESTING, nesting_bound
from ..core.states import State
from ..data import transfer
from ..errors import ChecksumMismatch, NotFound
from ..store import ObjectStore
from ..store.errors import NoSuchObject
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
    if nesting_bound(body) > MAX_NESTING:
        return [], False
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):  # not JSON
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


def rebuilt_entry(
    store: ObjectStore,
    layout: TaskLayout,
    stage: str,
    s: Seen,
    floor: int,
    index: shard_index.ShardIndex | None,
) -> tuple[Entry, RestoredEntry]:
    """The entry ``s`` is rebuilt as, by the rules of ``ops.repair`` (``floor``: the epoch
    a fenced entry gets), and its note for the report."""
    lost: list[str] = []
    declared = s.declared_at is not None
    # The index is authoritative for dependencies; a declaration record names them
    # (and the consumers) when there are any.
    if index is not None and s.file_id in index:
        depends_on = tuple(sorted(index.dependencies(s.file_id)))
    elif declared:
        depends_on = s.depends_on or ()
    else:
        depends_on = ()
        lost.append("depends_on")
    consumers = s.consumers or ()
    if not declared:
        lost += ["consumers", "declared_at"]
    base: dict[str, Any] = {
        "file_id": s.file_id,
        "stage": stage,
        "retry_count": s.retry_count,
        "depends_on": depends_on,
        "consumers": consumers,
        "declared_at": s.declared_at,
        "updated_at": s.updated_at,
        "claimed_at": s.claimed_at,
        "ready_at": s.ready_at,
    }
    seen_state = s.state
    if seen_state == State.consumed.value:
        if s.key is None or s.size is None:
            lost += [f for f, v in (("key", s.key), ("size", s.size)) if v is None]
        entry = _holding_data(base, s, State.consumed, s.key, s.size)
        rule = "consumed is terminal: restored as the journal last saw it"
        return entry, _note(entry, s, rule, lost)
    if seen_state == State.ready.value:
        data, why = _verified(store, layout, stage, s)
        if data is not None:
            entry = _holding_data(base, s, State.ready, *data)
            rule = (
                "ready, its data verifies: restored at its epoch (consumptions after "
                "the last record may be lost)"
            )
            return entry, _note(entry, s, rule, lost)
        state, rule = State.failed, f"ready but {why}: made claimable again"
        error: str | None = f"repair: {why}"
    elif seen_state == State.writing.value:
        state = State.failed
        rule = f"writing (epoch {s.epoch}): its holder is fenced, claimable again"
        error = f"repair: the claim of epoch {s.epoch} was fenced when the shard was rebuilt"
    elif seen_state in (State.pending.value, State.failed.value, State.dead.value):
        state = State(seen_state)
        rule = f"{seen_state}: kept, at an epoch above any seen"
        error = s.error
        if state is State.failed:
            base["retry_at"] = s.retry_at  # its backoff goes on where it was
    else:
        state = State.pending
        rule = "only the index knows it: pending, at an epoch above any seen"
        error = None
        lost.append("its history (declared after the last journal block)")
    entry = Entry(**base, state=state, epoch=floor, error=error)
    return entry, _note(entry, s, rule, lost)


def _holding_data(
    base: dict[str, Any], s: Seen, state: State, key: str | None, size: int | None
) -> Entry:
    """A ready or consumed entry rebuilt at its epoch, with the data the journal last saw
    (at ``key``, of ``size`` bytes) and the marks made on it."""
    return Entry(
        **base,
        state=state,
        epoch=s.epoch,
        owner=s.producer,
        checksum=s.checksum,
        key=key,
        size=size,
        part_size=s.part_size,
        parts_key=s.parts_key,
        whole_checksum=s.whole_checksum,
        consumed_by=s.consumed_by,
    )


def _note(entry: Entry, s: Seen, rule: str, lost: list[str]) -> RestoredEntry:
    return RestoredEntry(
        file_id=entry.file_id,
        state=entry.state.value,
        epoch=entry.epoch,
        seen_state=s.state,
        seen_epoch=s.epoch if s.state is not None else None,
        rule=rule,
        lost=tuple(dict.fromkeys(lost)),
    )


def _verified(
    store: ObjectStore, layout: TaskLayout, stage: str, s: Seen
) -> tuple[tuple[str, int] | None, str]:
    """The data key and size of a ready entry if its bytes exist and verify."""
    if s.checksum is None:
        return None, "no checksum was recorded"
    key = s.key or layout.data(stage, s.file_id, s.epoch)
    try:
        head = store.head(key)
    except NoSuchObject:
        return None, f"its data {key} is missing"
    size = s.size if s.size is not None else head.size
    if s.part_size is not None:
        # A chunked entry: its parts are verified by whoever consumes it.
        if head.size != size or s.parts_key is None:
            return None, f"its data {key} does not match the recorded size"
        return (key, size), ""
    try:
        transfer.download(store, s.file_id, key, s.checksum, size)
    except ChecksumMismatch:
        return None, f"its data {key} does not verify"
    except NotFound:
        return None, f"its data {key} is missing"
    return (key, size), ""


@dataclass
class ShardPlan:
    """A shard to rebuild: its entries and the report of each."""

    shard: Shard
    restored: list[RestoredEntry] = field(default_factory=list)
