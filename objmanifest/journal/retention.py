"""Journal retention: a task bounds its journal by age or by count, and says what it dropped.

A trim deletes whole journal blocks (``cas.loop``) that lie entirely beyond the bound: every
record older than ``keep_seconds`` (store time), or at least ``keep_versions`` newer records
of the same object after it. It never touches a record still inside the live object (a
block the object still carries is kept, so no writer can send it again after the trim) nor
one not yet in a block. Before it deletes anything it records the dropped range in the
object's retention marker (``layout.TaskLayout.journal_retention``), by a named commit, so
readers (``journal.history``) say records were dropped, and skip a block a trim that died midway
left behind; the next trim deletes it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from ..cas.loop import Documents
from ..cas.policy import Codec
from ..core.commit_events import Change
from ..core.layout import BlockRef, TaskLayout
from ..core.model import DroppedRange, JournalBlock, JournalRecord, RetentionMarker
from ..errors import NotFound, ObjManifestError
from ..store import ObjectStore, get_if_any
from .history import (
    MARKER_REPAIR,
    MARKER_SCHEMA,
    Dropped,
    covered,
    decode_block,
    decode_marker,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MarkerCodec:
    """A retention marker as the CAS loop writes it: no journal of its own, no versions."""

    object_key: str
    repair: ClassVar[str] = MARKER_REPAIR

    def decode(self, key: str, body: bytes) -> RetentionMarker:
        return decode_marker(key, body, key)

    def encode(self, doc: RetentionMarker) -> bytes:
        return doc.model_dump_json(exclude_none=True).encode()

    def empty(self) -> RetentionMarker:
        return RetentionMarker(object_key=self.object_key)

    def stamp(self, doc: RetentionMarker, commit_id: str) -> RetentionMarker:
        return doc.model_copy(update={"commit_id": commit_id})

    def commit_ids(self, doc: RetentionMarker) -> Sequence[str]:
        return [doc.commit_id] if doc.commit_id else []

    def version(self, doc: RetentionMarker) -> int | None:
        return None

    def transitions(self, before: RetentionMarker, after: RetentionMarker) -> Sequence[Change]:
        return ()

    def journal(self, doc: RetentionMarker) -> tuple[str | None, tuple[JournalRecord, ...]] | None:
        return None

    def with_journal(
        self, doc: RetentionMarker, journal_id: str, records: Sequence[JournalRecord]
    ) -> RetentionMarker:
        return doc


@dataclass(frozen=True)
class TrimJournal:
    """Add what a trim drops to a retention marker: one range per incarnation, widened."""

    dropped: tuple[Dropped, ...]
    actor: str = ""
    name: ClassVar[str] = "trim-journal"

    def apply(self, doc: RetentionMarker, now: datetime) -> tuple[RetentionMarker | None, None]:
        ranges = {d.journal_id: d for d in doc.dropped}
        changed = False
        for new in self.dropped:
            old = ranges.get(new.journal_id)
            if old is not None and new.last <= old.last:
                continue  # a trim that raced this one recorded it already
            changed = True
            if old is None:
                ranges[new.journal_id] = DroppedRange(
                    journal_id=new.journal_id,
                    first=new.first,
                    last=new.last,
                    records=new.records,
                    newest_at=new.newest_at,
                    trimmed_at=now,
                )
                continue
            ranges[new.journal_id] = DroppedRange(
                journal_id=new.journal_id,
                first=min(old.first, new.first),
                last=new.last,
                records=old.records + new.records,
                newest_at=new.newest_at or old.newest_at,
                trimmed_at=now,
            )
        if not changed:
            return None, None
        return doc.model_copy(update={"dropped": tuple(ranges.values())}), None


@dataclass
class Trimmer:
    """Trims the journal of one task to a bound (``keep_seconds``, ``keep_versions``: a
    block beyond either one is dropped)."""

    store: ObjectStore
    docs: Documents
    layout: TaskLayout
    keep_seconds: float | None
    keep_versions: int | None
    actor: str = ""

    def trim(
        self, objects: Iterable[tuple[str, Codec[Any]]], dry_run: bool = False
    ) -> list[Dropped]:
        """Trim every object's journal; what was dropped (or would be, with ``dry_run``)."""
        if self.keep_seconds is None and self.keep_versions is None:
            return []
        cutoff = (
            self.store.now() - timedelta(seconds=self.keep_seconds)
            if self.keep_seconds is not None
            else None
        )
        out: list[Dropped] = []
        for key, codec in objects:
            out += self._trim_one(key, codec, cutoff, dry_run)
        return out

    def _trim_one(
        self, key: str, codec: Codec[Any], cutoff: datetime | None, dry_run: bool
    ) -> list[Dropped]:
        marker_key = self.layout.journal_retention(key)
        marker_codec = MarkerCodec(key)
        marker = self.docs.read(marker_key, marker_codec)
        refs: dict[str, list[BlockRef]] = {}
        leftover: list[str] = []  # blocks a dying trim recorded as dropped but left behind
        for row in self.store.list(self.layout.journal_of(key)):
            ref = self.layout.parse_block(row.key)
            if ref is None or ref.object_key != key:
                continue
            if covered(marker, ref.journal_id, ref.last):
                leftover.append(row.key)
            else:
                refs.setdefault(ref.journal_id, []).append(ref)
        if not refs and not leftover:
            return []
        try:
            live = self.docs.read(key, codec)
        except NotFound:
            live = None
        journal = codec.journal(live) if live is not None else None
        live_id = journal[0] if journal is not None else None
        live_versions = {r.version for r in journal[1]} if journal is not None else set()
        live_version = (codec.version(live) if live is not None else None) or 0
        dropped: list[Dropped] = []
        doomed: list[str] = []
        for journal_id, blocks in sorted(refs.items()):
            current = journal_id == live_id
            newest = max(b.last for b in blocks)
            taken: list[JournalBlock] = []
            for ref in sorted(blocks, key=lambda b: b.first):
                if current and any(ref.first <= v <= ref.last for v in live_versions):
                    break  # still inside the live object: kept
                # Newer records of this object: its later versions, and for an older
                # incarnation the live one's too (other incarnations are not counted, so
                # a doubt keeps a block).
                newer = (live_version - ref.last) if current else (newest - ref.last)
                if not current:
                    newer += live_version
                by_count = self.keep_versions is not None and newer >= self.keep_versions
                block_key = self.layout.journal_block(key, journal_id, ref.first, ref.last)
                if not by_count and cutoff is None:
                    break
                blob = get_if_any(self.store, block_key)
                if blob is None:
                    break  # another trim is at it
                block = decode_block(self.store, block_key, blob.body, ref)
                by_age = cutoff is not None and all(r.at < cutoff for r in block.records)
                if not (by_count or by_age):
                    break  # blocks after this one are newer still
                taken.append(block)
                doomed.append(block_key)
            if taken:
                dropped.append(
                    Dropped(
                        object_key=key,
                        journal_id=journal_id,
                        first=taken[0].first,
                        last=taken[-1].last,
                        records=sum(len(b.records) for b in taken),
                        newest_at=max((r.at for b in taken for r in b.records), default=None),
                        trimmed_at=self.store.now(),
                    )
                )
        if dry_run:
            return dropped
        if dropped:
            # Said first, deleted after: a trim that dies in between leaves blocks readers
            # skip, never a gap nobody mentions.
            self.docs.commit(marker_key, marker_codec, TrimJournal(tuple(dropped), self.actor))
        for block_key in [*leftover, *doomed]:
            try:
                self.store.delete(block_key)
            except ObjManifestError as e:
                log.warning("could not delete journal block %s: %s", block_key, e)
        return dropped


__all__ = ["MARKER_REPAIR", "MARKER_SCHEMA", "MarkerCodec", "TrimJournal", "Trimmer"]
