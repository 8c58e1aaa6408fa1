"""The objects beside a shard that ``repair`` mends: a journal's retention marker, and the
archive objects a shard's ``archived`` map points at.

A marker that does not decode stops every reader of its object's journal: it is copied
aside and written again empty, so the ranges it covered are found as gaps and said lost
(``journal.mending``). An archive object that does not decode stops every read of the
entries it holds (``show``, ``consume``, ``lineage``, ``gc``): it is copied aside, its
entries are written to a new archive object from their journal records (what a record
did not carry is taken from the shard's map and the index, and named), the shard's map is
pointed at it, and the damaged object is deleted, its bytes kept under ``damaged/``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

import shard_index

from ..cas.codecs import ShardCodec
from ..cas.loop import Documents
from ..core.layout import TaskLayout
from ..core.model import Entry, JournalRecord, Shard
from ..errors import CorruptShard, NotFound, UnsupportedSchema
from ..journal import mending
from ..store import CREATE, ObjectStore
from ..store.errors import NoSuchObject
from .archive import Archives
from .replay import Seen, merged, replay
from .reports import Action, Damage, ObjectRepair, RestoredEntry


@dataclass(frozen=True)
class Found:
    """A manifest object as the store holds it: missing, corrupt (with its bytes and ETag),
    newer than this release, or fine."""

    key: str
    damage: Damage | None
    problem: str = ""
    body: bytes = b""
    etag: str | None = None


def inspect(store: ObjectStore, key: str, decode: Callable[[str, bytes], object]) -> Found:
    """What is wrong with ``key``, if anything (a raw read: the CAS cache is not trusted)."""
    try:
        blob = store.get(key)
    except NoSuchObject:
        return Found(key, "deleted", "it does not exist")
    assert blob is not None
    try:
        decode(key, blob.body)
    except UnsupportedSchema as e:
        return Found(key, "newer", str(e))
    except CorruptShard as e:
        return Found(key, "corrupt", e.detail, blob.body, blob.etag)
    return Found(key, None)


def copy_aside(store: ObjectStore, layout: TaskLayout, key: str, body: bytes, what: str) -> str:
    """A damaged object's ``body`` copied create-only to ``TASK/damaged/OBJECT@TIME`` and
    read back: where it went. Nothing may replace the object until this returns."""
    aside = layout.damaged(key, store.now())
    store.put(aside, body, mode=CREATE)
    try:
        copy = store.get(aside)
    except NoSuchObject as e:  # removed since: nothing was replaced
        raise NotFound(str(e)) from e
    if copy is None or copy.body != body:
        raise CorruptShard(
            aside,
            f"the copy of the damaged {what} does not read back as written; nothing was replaced",
            store.describe(aside),
        )
    return aside


def marker(
    store: ObjectStore, docs: Documents, layout: TaskLayout, object_key: str, dry_run: bool
) -> ObjectRepair | None:
    """The retention marker of ``object_key`` if it does not decode: copied aside and
    written again empty (with ``dry_run``: only said)."""
    found = mending.damaged_marker(store, layout, object_key)
    if found is None:
        return None
    key, problem, _, _ = found
    moved = None
    action: Action = "would rebuild"
    if not dry_run:
        moved, landed = mending.mend_marker(store, docs, layout, object_key, found)
        action = "rebuilt" if landed else "left alone"
    return ObjectRepair(
        key=key,
        kind="retention marker",
        damage="corrupt",
        problem=problem,
        action=action,
        moved_to=moved,
        not_restored=(
            f"which records of {object_key} retention dropped: the versions no block holds "
            "are said lost",
        ),
    )


@dataclass(frozen=True)
class Repoint:
    """The shard's ``archived`` map: the entries it said ``old`` holds, now in ``new``."""

    old: str
    new: str
    name: ClassVar[str] = "repair"
    actor: ClassVar[str] = ""

    def apply(self, doc: Shard, now: datetime) -> tuple[Shard | None, list[str]]:
        archived = dict(doc.archived or {})
        moved = sorted(f for f, ref in archived.items() if ref.archive == self.old)
        if not moved:
            return None, []
        for file_id in moved:
            archived[file_id] = archived[file_id].model_copy(update={"archive": self.new})
        return doc.model_copy(update={"archived": archived}), moved


EntryFrom = Callable[[str, Seen, int, "shard_index.ShardIndex | None"], tuple[Entry, RestoredEntry]]


@dataclass(frozen=True)
class Place:
    """Where repair works: the store, its documents, the task's keys and archive objects."""

    store: ObjectStore
    docs: Documents
    layout: TaskLayout
    archives: Archives


def archives(
    place: Place,
    shard: str,
    doc: Shard,
    codec: ShardCodec,
    records: Sequence[JournalRecord],
    index: shard_index.ShardIndex | None,
    entry_from: EntryFrom,
    dry_run: bool,
) -> list[ObjectRepair]:
    """Every archive object ``doc``'s map points at that does not decode, rebuilt from
    ``records`` (the shard's journal) as the module says."""
    store, layout = place.store, place.layout
    out: list[ObjectRepair] = []
    named = sorted({ref.archive for ref in (doc.archived or {}).values()})
    seen = replay(merged(records))
    for archive_id in named:
        key = layout.archive_object(shard, archive_id)
        try:
            place.archives.read(shard, archive_id)
            continue
        except NotFound:
            blob = None
            problem = "it does not exist"
        except CorruptShard as e:
            problem = e.detail
            blob = store.get(key)
        ids = sorted(f for f, ref in (doc.archived or {}).items() if ref.archive == archive_id)
        entries: dict[str, Entry] = {}
        notes: list[RestoredEntry] = []
        for file_id in ids:
            ref = (doc.archived or {})[file_id]
            stage = layout.stage_of_shard(shard) or (
                index.stage_of(file_id) if index is not None else None
            )
            if stage is None:
                notes.append(
                    RestoredEntry(
                        file_id,
                        "lost",
                        0,
                        ref.state.value,
                        None,
                        "the index, which names its stage, is damaged: repair again once it "
                        "is repaired",
                        ("all",),
                    )
                )
                continue
            s = seen.get(file_id) or Seen(file_id)
            if s.state is None or s.state != ref.state.value:
                s.state = ref.state.value  # the map's state is the one archived
            entry, note = entry_from(stage, s, s.max_epoch, index)
            entry = entry.model_copy(update={"state": ref.state})
            entries[file_id] = entry
            notes.append(note)
        not_restored = tuple(f"{n.file_id}: {', '.join(n.lost)}" for n in notes if n.lost)
        moved = None
        action: Action = "would rebuild"
        if not dry_run and entries:
            if blob is not None:
                moved = copy_aside(store, layout, key, blob.body, "archive object")
            new = place.archives.write(shard, entries, store.now())
            place.docs.commit(layout.shard(shard), codec, Repoint(archive_id, new))
            if blob is not None:
                store.delete(key)  # its bytes are kept aside; the map points elsewhere
            action = "rebuilt"
        elif not dry_run:
            action = "left alone"
        out.append(
            ObjectRepair(
                key=key,
                kind="archive object",
                damage="corrupt" if blob is not None else "deleted",
                problem=problem,
                action=action,
                moved_to=moved,
                records=len(ids),
                entries=tuple(notes),
                not_restored=not_restored,
                source="journal",
            )
        )
    return out


__all__ = ["Found", "Place", "Repoint", "archives", "copy_aside", "inspect", "marker"]
