"""Damaged and missing journal blocks: found, copied aside, and mended or said lost.

A block is written once and read by every reader of the journal (``journal.history``), so one
that does not decode stops ``log`` and ``lineage``, and a shard rebuilt from the journal
would miss its records. ``find`` reads every block of a manifest object and names those
that are not the block their key names (``history.decode_block``), and the ranges of
versions no block, no live record and no retention drop accounts for (a block deleted by
hand). ``mend`` copies a damaged block's bytes to ``damaged/`` (create-only, read back),
then puts its records back from the live object if it still carries them all; otherwise it
records the range as lost in the object's retention marker (``LostRange``, a named commit)
before it deletes the damaged block, so readers say the records were lost, as they say
what retention dropped, and never take the journal for complete.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from ..cas.blocks import BLOCK, block_end
from ..cas.loop import Documents
from ..core.layout import BlockRef, TaskLayout
from ..core.model import JournalBlock, JournalRecord, LostRange, RetentionMarker
from ..errors import CorruptShard, NotFound, UnsupportedSchema
from ..store import CREATE, ObjectStore, get_if_any
from ..store.errors import NoSuchObject, PreconditionFailed
from .history import covered, decode_block, decode_marker, read_marker
from .retention import MarkerCodec

STARTS = ("migrate", "repair")
"""The commands that may begin an object's journal past version 1."""


@dataclass(frozen=True)
class BlockDamage:
    """A journal block that is damaged, or a range of versions whose blocks are gone."""

    object_key: str
    key: str
    """The damaged block's key; for a missing range, the key a block of exactly that range
    would have."""
    journal_id: str
    first: int
    last: int
    damage: Literal["corrupt", "deleted"]
    problem: str
    body: bytes = b""


@dataclass(frozen=True)
class RecordLost:
    """Add a range of records lost with a damaged block to a retention marker."""

    lost: LostRange
    actor: str = ""
    name: ClassVar[str] = "repair"

    def apply(self, doc: RetentionMarker, now: datetime) -> tuple[RetentionMarker | None, None]:
        new = self.lost
        if any(
            d.journal_id == new.journal_id and d.first <= new.first and new.last <= d.last
            for d in doc.lost
        ):
            return None, None  # recorded already (a repair run before this one)
        return doc.model_copy(update={"lost": (*doc.lost, new)}), None


def find(
    store: ObjectStore,
    layout: TaskLayout,
    object_key: str,
    live: tuple[str | None, Sequence[JournalRecord]] | None,
) -> list[BlockDamage]:
    """Every damaged block of ``object_key`` and every range of versions between two known
    ones that nothing accounts for (``live``: the journal id and records the object carries
    now, if it can be read). A corrupt retention marker counts for nothing here (repair
    writes it again first, ``mend_marker``): every range it covered is then a gap."""
    try:
        marker = read_marker(store, layout.journal_retention(object_key))
    except CorruptShard:
        marker = None
    refs: list[BlockRef] = []
    for row in store.list(layout.journal_of(object_key)):
        ref = layout.parse_block(row.key)
        if ref is None or ref.object_key != object_key:
            continue
        if not covered(marker, ref.journal_id, ref.last):
            refs.append(ref)
    found: list[BlockDamage] = []
    # Per incarnation, the ranges of versions known: (first, last, the first's command, or
    # None if unknown: a damaged block).
    known: dict[str, list[tuple[int, int, str | None]]] = {}
    for ref in refs:
        key = layout.journal_block(object_key, ref.journal_id, ref.first, ref.last)
        blob = get_if_any(store, key)
        if blob is None:
            continue  # deleted since the listing (a trim): nothing to mend
        try:
            block = decode_block(store, key, blob.body, ref)
        except (CorruptShard, UnsupportedSchema) as e:
            problem = e.detail if isinstance(e, CorruptShard) else str(e)
            known.setdefault(ref.journal_id, []).append((ref.first, ref.last, None))
            found.append(
                BlockDamage(
                    object_key,
                    key,
                    ref.journal_id,
                    ref.first,
                    ref.last,
                    "corrupt",
                    problem,
                    blob.body,
                )
            )
            continue
        known.setdefault(ref.journal_id, []).append((ref.first, ref.last, block.records[0].command))
    if live is not None and live[0] is not None and live[1]:
        records = live[1]
        known.setdefault(live[0], []).append(
            (records[0].version, records[-1].version, records[0].command)
        )
    for journal_id, ranges in known.items():
        ranges.sort()
        gaps = []
        start, _, command = ranges[0]
        # An incarnation starts at version 1, unless a migration or a repair began its
        # journal later (its first record says so).
        if start > 1 and command is not None and command not in STARTS:
            gaps.append((1, start - 1))
        reach = ranges[0][1]
        for first, last, _ in ranges[1:]:
            if first > reach + 1:
                gaps.append((reach + 1, first - 1))
            reach = max(reach, last)
        for gap in gaps:
            if covered(marker, journal_id, gap[1]):
                continue  # retention dropped them, or a repair said them lost
            key = layout.journal_block(object_key, journal_id, *gap)
            problem = f"no block holds versions {gap[0]}..{gap[1]} (deleted)"
            found.append(BlockDamage(object_key, key, journal_id, *gap, "deleted", problem))
    return sorted(found, key=lambda d: (d.journal_id, d.first))


def mend(
    store: ObjectStore,
    docs: Documents,
    layout: TaskLayout,
    damage: BlockDamage,
    carried: dict[int, JournalRecord],
) -> tuple[Literal["rebuilt", "recorded as lost"], str | None]:
    """Copy a damaged block aside, then write its records again from ``carried`` (the
    records of its incarnation the live object carries, by version) if all are there, or
    record the range as lost; a damaged block is deleted only after either. Returns what
    was done and where the bytes went."""
    moved = None
    if damage.damage == "corrupt":
        moved = layout.damaged(damage.key, store.now())
        store.put(moved, damage.body, mode=CREATE)
        try:
            blob = store.get(moved)
        except NoSuchObject as e:  # removed since: nothing was replaced
            raise NotFound(str(e)) from e
        if blob is None or blob.body != damage.body:
            raise CorruptShard(
                moved,
                "the copy of the damaged block does not read back as written; nothing was replaced",
                store.describe(moved),
            )
    wanted = range(damage.first, damage.last + 1)
    if all(v in carried for v in wanted):
        if damage.damage == "corrupt":
            store.delete(damage.key)
        for end in range(block_end(damage.first), damage.last + 1, BLOCK):
            records = tuple(carried[v] for v in wanted if block_end(v) == end)
            first, last = records[0].version, records[-1].version
            block = JournalBlock(
                object_key=damage.object_key,
                journal_id=damage.journal_id,
                first=first,
                last=last,
                records=records,
            )
            key = layout.journal_block(damage.object_key, damage.journal_id, first, last)
            body = block.model_dump_json(exclude_none=True).encode()
            with contextlib.suppress(PreconditionFailed):  # written meanwhile: the same
                store.put(key, body, mode=CREATE)
        return "rebuilt", moved
    lost = LostRange(
        journal_id=damage.journal_id,
        first=damage.first,
        last=damage.last,
        problem=damage.problem,
        moved_to=moved,
        found_at=store.now(),
    )
    marker_key = layout.journal_retention(damage.object_key)
    docs.commit(marker_key, MarkerCodec(damage.object_key), RecordLost(lost))
    if damage.damage == "corrupt":
        store.delete(damage.key)  # said first, deleted after: readers skip it either way
    return "recorded as lost", moved


@dataclass(frozen=True)
class RebuildMarker:
    """A retention marker written again, empty, in place of one that does not decode (its
    bytes copied aside first): the ranges it covered are found as gaps and said lost."""

    object_key: str
    actor: str = ""
    name: ClassVar[str] = "repair"

    def apply(self, doc: RetentionMarker, now: datetime) -> tuple[RetentionMarker | None, bool]:
        if doc.dropped or doc.lost or doc.commit_id:
            return None, False  # a sound marker is there by now
        return RetentionMarker(object_key=self.object_key), True


def damaged_marker(
    store: ObjectStore, layout: TaskLayout, object_key: str
) -> tuple[str, str, bytes, str | None] | None:
    """The retention marker of ``object_key`` if it does not decode: (its key, the
    problem, its bytes, its ETag)."""
    key = layout.journal_retention(object_key)
    blob = get_if_any(store, key)
    if blob is None:
        return None
    try:
        decode_marker(key, blob.body, store.describe(key))
    except CorruptShard as e:
        return key, e.detail, blob.body, blob.etag
    except UnsupportedSchema:
        return None  # a newer release's: not damage
    return None


def mend_marker(
    store: ObjectStore,
    docs: Documents,
    layout: TaskLayout,
    object_key: str,
    found: tuple[str, str, bytes, str | None],
) -> tuple[str, bool]:
    """Copy a damaged marker aside (create-only, read back), then write it again empty by a
    commit over exactly those bytes; returns where the bytes went and whether it landed."""
    key, _, body, etag = found
    moved = layout.damaged(key, store.now())
    store.put(moved, body, mode=CREATE)
    blob = store.get(moved)
    if blob is None or blob.body != body:
        raise CorruptShard(
            moved,
            "the copy of the damaged marker does not read back as written; nothing was replaced",
            store.describe(moved),
        )
    landed = docs.commit(key, MarkerCodec(object_key), RebuildMarker(object_key), over=etag)
    return moved, bool(landed)


__all__ = [
    "BlockDamage",
    "RebuildMarker",
    "RecordLost",
    "damaged_marker",
    "find",
    "mend",
    "mend_marker",
]
