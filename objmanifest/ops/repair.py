"""Repair: a stage shard or the index that was deleted or damaged, restored or rebuilt.

Where the store keeps versions of its objects, a deleted or damaged shard, index or upload
state is first restored exactly from its newest sound version that is at least as new as
its journal (``restore``: nothing the version held is lost, and no claim is fenced). Only
without one is it rebuilt as follows.

A shard is rebuilt from its journal (the write-once blocks, plus the records a damaged
object still carries if its JSON can be read), combined with the index (stage and
dependencies); the index is rebuilt from the shards. A corrupt object is first copied
aside (``layout.TaskLayout.damaged``), and only then replaced, by a commit conditional on
exactly the bytes that were copied; a deleted object is re-created create-only. Both are
named commits (``repair``), so they are journaled like any other.

The newest records of an object travel inside it until a block holds them, so a lost
object may take its latest records with it. Each rebuilt entry therefore follows these
rules (``RULES`` in the docs):

* ``consumed``: restored as the journal last saw it (terminal: nothing can follow it).
* ``ready``: restored at its epoch only if its data object exists and verifies against the
  recorded checksum and size (the only ways out of ``ready`` are a consumption and a
  mismatch, and a mismatch cannot follow bytes that verify, so no claim can have followed
  it). Consumptions after the last record may be lost: it may be consumed again.
* anything else (``writing``, ``pending``, ``failed``, ``dead``, a ``ready`` whose data
  does not verify, an id only the index knows): a fenced state at an epoch above any the
  task has seen for it (the journal, data keys), plus ``RECORDS_AT_RISK`` when the
  object's own records were lost (each lost version can have raised an epoch by one), so
  no claim ever given out comes back to life: ``writing`` and an unverified ``ready``
  become ``failed`` (claimable again, no retry counted), ``pending`` stays ``pending``,
  ``failed`` stays ``failed``, ``dead`` stays ``dead``.

Every rebuilt entry keeps the times its records carried: when it was claimed and became
ready (a stage's deadline counts from them) and, if it stays ``failed``, when its retry
backoff ends; a fenced ``writing`` entry becomes claimable at once.

What a record did not carry (consumers and dependencies of entries declared before the
journal recorded them, the data key or size of an older record) is taken from the index or
the data object where it can be, and named in the report where it cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar

import shard_index

from ..cas.codecs import IndexCodec, ShardCodec, index_error
from ..cas.loop import Documents
from ..cas.policy import Codec
from ..core.layout import TaskLayout
from ..core.model import Archived, Entry, JournalRecord, Shard, declaration_digest
from ..data.chunked.rebuild import RebuildUpload, needs_parts, read_parts, rebuilt_state
from ..data.chunked.state import UploadCodec
from ..errors import CorruptShard, NotFound, UnsupportedSchema
from ..journal import mending
from ..journal.history import History
from ..store import ObjectStore
from . import mend
from .archive import Archives
from .mend import Found, inspect
from .replay import (
    RECORDS_AT_RISK,
    RebuildIndex,
    RebuildShard,
    Seen,
    ShardPlan,
    merged,
    rebuilt_entry,
    replay,
    salvage,
)
from .reports import Action, Kind, ObjectRepair, RepairReport, RestoredEntry
from .restore import attempt, next_index, same

T = TypeVar("T")


class Repairer:
    """Finds and rebuilds the damaged manifest objects of one task."""

    def __init__(
        self,
        store: ObjectStore,
        docs: Documents,
        layout: TaskLayout,
        history: History,
        codecs: Mapping[str, ShardCodec],
        index_codec: IndexCodec,
        stages: tuple[str, ...],
        objects: Callable[[], Sequence[tuple[str, Codec[Any]]]] = tuple,
        upload_codec: Callable[[str], UploadCodec | None] = lambda key: None,
    ) -> None:
        self.objects = objects
        """Every journaled object (shards, the index, upload states), whose blocks are read."""
        self.upload_codec = upload_codec
        self.store = store
        self.docs = docs
        self.layout = layout
        self.history = history
        self.codecs = codecs
        self.stages = stages
        self.index_codec = index_codec
        self.archives = Archives(store, layout)
        self.place = mend.Place(store, docs, layout, self.archives)

    def run(self, dry_run: bool, repair_index: Callable[[], list[str]]) -> RepairReport:
        """Journal blocks read first (what is damaged or missing); the index restored from
        a kept version if it can be; then shards (from a kept version, else from their
        journal and the index, if it is sound), then the index from the shards (an index
        that is sound but lacks ids gets them: ``repair_index``), then the upload states
        ready chunked entries need, and last the damaged blocks, mended or said lost."""
        self.block_damage: dict[str, list[mending.BlockDamage]] = {}
        self.carried: dict[str, tuple[str | None, Sequence[JournalRecord]]] = {}
        objects = list(self.objects())
        reports: list[ObjectRepair] = []
        for key, _ in objects:  # first: what every later read of the journal relies on
            damaged_marker = mend.marker(self.store, self.docs, self.layout, key, dry_run)
            if damaged_marker is not None:
                reports.append(damaged_marker)
        for key, codec in objects:
            try:
                live = codec.journal(self.docs.read(key, codec))
            except (NotFound, CorruptShard, UnsupportedSchema):
                live = None
            if live is not None:
                self.carried[key] = live
            self.block_damage[key] = mending.find(self.store, self.layout, key, live)
        index_found = inspect(self.store, self.layout.index, self.index_codec.decode)
        index = None if index_found.damage else self.docs.read(self.layout.index, self.index_codec)
        restored_index: tuple[ObjectRepair, shard_index.ShardIndex | None] | str = ""
        if index_found.damage in ("deleted", "corrupt"):
            restored_index = self._restore(index_found, "index", self.index_codec, dry_run)
            if not isinstance(restored_index, str):
                index = restored_index[1]
        shards: dict[str, Shard] = {}
        for shard, codec in self.codecs.items():
            key = self.layout.shard(shard)
            found = inspect(self.store, key, codec.decode)
            if found.damage is None:
                shards[shard] = self.docs.read(key, codec)
                continue
            report, rebuilt = self._shard(found, shard, codec, index, dry_run)
            if report is not None:
                reports.append(report)
            if rebuilt is not None:
                shards[shard] = rebuilt
        added: list[str] = []
        if not isinstance(restored_index, str):
            reports.append(restored_index[0])
        if index_found.damage is not None and isinstance(restored_index, str):
            report = self._index(index_found, shards, dry_run, restored_index)
            if report is not None:
                reports.append(report)
                added = list(report.indexed) if report.action != "left alone" else []
        elif index is not None and not any(r.damage == "newer" for r in reports):
            lacking = sorted({f for sh in shards.values() for f in sh.entries if f not in index})
            added = lacking if dry_run or not lacking else repair_index()
        for shard, doc in shards.items():
            if doc.archived:
                key = self.layout.shard(shard)
                carried = self.carried.get(key, (None, ()))[1]
                records = [*self.history.blocks(key, damaged=[]), *carried]
                place = mend.Place(self.store, self.docs, self.layout, self.archives)
                reports += mend.archives(
                    place, shard, doc, self.codecs[shard], records, index, self._entry, dry_run
                )
        for doc in shards.values():
            for entry in sorted(doc.entries.values(), key=lambda e: e.file_id):
                if needs_parts(entry):
                    report = self._upload_state(entry, dry_run)
                    if report is not None:
                        reports.append(report)
        for damages in self.block_damage.values():
            reports += [self._block(d, dry_run) for d in damages]
        return RepairReport(self.layout.task_id, dry_run, tuple(reports), tuple(added))

    # -- journal blocks, retention markers and upload states ------------------------------

    def _block(self, damage: mending.BlockDamage, dry_run: bool) -> ObjectRepair:
        journal_id, records = self.carried.get(damage.object_key, (None, ()))
        carried = {r.version: r for r in records} if journal_id == damage.journal_id else {}
        whole = all(v in carried for v in range(damage.first, damage.last + 1))
        moved = None
        action: Action = "would rebuild" if whole else "would record as lost"
        if not dry_run:
            action, moved = mending.mend(self.store, self.docs, self.layout, damage, carried)
        versions = damage.last - damage.first + 1
        lost = () if whole else (f"versions {damage.first}..{damage.last} of {damage.object_key}",)
        return ObjectRepair(
            key=damage.key,
            kind="journal block",
            damage=damage.damage,
            problem=damage.problem,
            action=action,
            moved_to=moved,
            records=versions,
            not_restored=lost,
            source="journal" if whole else "",
        )

    def _upload_state(self, entry: Entry, dry_run: bool) -> ObjectRepair | None:
        """A ready (or consumed) chunked entry's upload state, if it is deleted or damaged:
        restored from a kept version, else rebuilt from its data, which must make the
        entry's checksum (``_rebuilt_upload``)."""
        key = entry.parts_key
        assert key is not None
        codec = self.upload_codec(key)
        if codec is None:
            return None
        found = inspect(self.store, key, codec.decode)
        if found.damage is None:
            return None
        if found.damage == "newer":
            return ObjectRepair(key, "upload state", "newer", found.problem, "left alone")
        restored = self._restore(found, "upload state", codec, dry_run)
        if not isinstance(restored, str):
            return restored[0]
        report = self._rebuilt_upload(entry, found, codec, dry_run)
        return replace(report, source="data", versions_note=restored)

    def _rebuilt_upload(
        self, entry: Entry, found: Found, codec: UploadCodec, dry_run: bool
    ) -> ObjectRepair:
        key = found.key
        assert found.damage is not None and found.damage != "newer"
        if dry_run:
            return ObjectRepair(
                key,
                "upload state",
                found.damage,
                found.problem,
                "would rebuild",
                not_restored=(f"{entry.file_id}: rebuilt only if its data makes its checksum",),
            )
        read = read_parts(self.store, entry)
        if isinstance(read, str):
            why = f"{entry.file_id}: {read}; consuming it sends it back to be produced again"
            return ObjectRepair(
                key,
                "upload state",
                found.damage,
                found.problem,
                "left alone",
                not_restored=(why,),
            )
        parts, whole = read
        version = max((r.version for r in self.history.blocks(key, damaged=[])), default=0)
        rebuilt = rebuilt_state(codec, entry, parts, whole, version)
        moved, landed = self._replace(found, codec, RebuildUpload(rebuilt))
        return ObjectRepair(
            key=key,
            kind="upload state",
            damage=found.damage,
            problem=found.problem,
            action="rebuilt" if landed else "left alone",
            moved_to=moved,
            records=len(parts),
        )

    # -- one shard ---------------------------------------------------------------------

    def _shard(
        self,
        found: Found,
        shard: str,
        codec: ShardCodec,
        index: shard_index.ShardIndex | None,
        dry_run: bool,
    ) -> tuple[ObjectRepair | None, Shard | None]:
        key = self.layout.shard(shard)
        kind: Literal["shard"] = "shard"
        if found.damage == "newer":
            return ObjectRepair(key, kind, "newer", found.problem, "left alone"), None
        blocks = list(self.history.blocks(key, damaged=[]))
        own, complete = salvage(found.body) if found.damage == "corrupt" else ([], False)
        records = merged([*blocks, *own])
        # Versions a damaged or missing block held are unknown: each may have raised an
        # epoch by one, as a version lost with the object's own records may.
        unknown = sum(d.last - d.first + 1 for d in self.block_damage.get(key, ()))
        indexed = {
            fid
            for stage in self._stages_of(shard)
            for fid in (index.file_ids(stage) if index is not None else ())
            if self.layout.shard_of(stage, fid) == shard
        }
        if found.damage == "deleted" and not records and not indexed:
            return None, None  # never written: nothing was lost
        restored = self._restore(found, kind, codec, dry_run, records)
        if not isinstance(restored, str):
            return restored
        plan = self._plan(shard, codec, records, complete, index, indexed, unknown)
        moved = None
        action: Action = "would rebuild"
        if not dry_run:
            moved, landed = self._replace(found, codec, RebuildShard(plan.shard))
            action = "rebuilt" if landed else "left alone"
        not_restored = [f"{e.file_id}: {', '.join(e.lost)}" for e in plan.restored if e.lost]
        if index is None:
            not_restored.append(
                "the index is damaged too: ids declared after the last journal "
                "block of this shard are lost"
            )
        for d in self.block_damage.get(key, ()):
            not_restored.append(
                f"versions {d.first}..{d.last}: their journal block is {d.damage} "
                f"({d.problem}); entries whose last change was there are fenced"
            )
        report = ObjectRepair(
            key=key,
            kind=kind,
            damage=found.damage or "deleted",
            problem=found.problem,
            action=action,
            moved_to=moved,
            records=len(records),
            journal_complete=complete,
            entries=tuple(plan.restored),
            not_restored=tuple(not_restored),
            source="journal",
            versions_note=restored,
        )
        return report, plan.shard if action != "left alone" else None

    def _plan(
        self,
        shard: str,
        codec: ShardCodec,
        records: list[JournalRecord],
        complete: bool,
        index: shard_index.ShardIndex | None,
        indexed: set[str],
        unknown: int = 0,
    ) -> ShardPlan:
        own_stage = self.layout.stage_of_shard(shard)
        seen = {fid: s for fid, s in replay(records).items() if not s.removed}
        archived = self._archived(shard, seen)
        for fid in indexed:
            if fid not in archived:
                seen.setdefault(fid, Seen(fid))
        data_epochs: dict[tuple[str, str], int] = {}
        for data_stage in self._stages_of(shard):
            for row in self.store.list(self.layout.data_of(data_stage)):
                parsed = self.layout.parse(row.key)
                if parsed.kind != "data" or parsed.file_id is None or parsed.epoch is None:
                    continue
                at = (data_stage, parsed.file_id)
                data_epochs[at] = max(data_epochs.get(at, 0), parsed.epoch)
        margin = (0 if complete else RECORDS_AT_RISK) + unknown
        entries: dict[str, Entry] = {}
        restored: list[RestoredEntry] = []
        for fid in sorted(seen):
            s = seen[fid]
            stage = own_stage or (index.stage_of(fid) if index is not None else None)
            if stage is None and len(self.stages) == 1:
                stage = self.stages[0]  # one stage: whose it is needs no index
            if stage is None:
                # The task's one shard holds every stage; only the index says whose, and the
                # index is rebuilt from the shards: nothing left names this entry's stage.
                why = (
                    "not restored: the task keeps every stage in one shard, and the index, "
                    "which names each entry's stage, is damaged too; declare it again"
                )
                restored.append(RestoredEntry(fid, "lost", 0, s.state, s.epoch, why, ("all",)))
                continue
            floor = max(s.max_epoch, data_epochs.get((stage, fid), 0)) + 1 + margin
            entry, note = self._entry(stage, s, floor, index)
            entries[fid] = entry
            restored.append(note)
        version = max((r.version for r in records), default=0)
        rebuilt = Shard(
            task_id=codec.task_id,
            stage=codec.stage,
            creation_id=codec.creation_id or None,
            schema_version=codec.writes,
            version=version,
            entries=entries,
            archived=archived or None,
        )
        restored += [
            RestoredEntry(fid, ref.state.value, 0, None, None, f"archived in {ref.archive}")
            for fid, ref in sorted(archived.items())
        ]
        return ShardPlan(rebuilt, restored)

    def _stages_of(self, shard: str) -> list[str]:
        """The stages whose entries ``shard`` holds: its own, or all of them."""
        own = self.layout.stage_of_shard(shard)
        return [own] if own is not None else list(self.stages)

    def _archived(self, shard: str, live: Mapping[str, Seen]) -> dict[str, Archived]:
        """The shard's ``archived`` map, from its archive objects (written once, never
        inside the shard): every entry an archive object holds that the journal does not
        show live. An entry the journal shows live stays live (its archive object is one an
        archiver that died before its shard commit left; the next ``archive()`` commits it).
        Newer archive objects win (their ids begin with the store time)."""
        ids = sorted(
            archive_id
            for row in self.store.list(self.layout.archive_of(shard))
            if (archive_id := self.layout.parse_archive(row.key, shard)) is not None
        )
        archived: dict[str, Archived] = {}
        for archive_id in ids:
            try:
                doc = self.archives.read(shard, archive_id)
            except NotFound:
                continue
            for fid, e in doc.entries.items():
                if fid in live:
                    continue
                archived[fid] = Archived(
                    state=e.state,
                    archive=archive_id,
                    declared=declaration_digest(e.stage, e.depends_on, e.consumers),
                )
        return archived

    def _entry(
        self, stage: str, s: Seen, floor: int, index: shard_index.ShardIndex | None
    ) -> tuple[Entry, RestoredEntry]:
        return rebuilt_entry(self.store, self.layout, stage, s, floor, index)

    # -- the index ---------------------------------------------------------------------

    def _index(
        self, found: Found, shards: Mapping[str, Shard], dry_run: bool, versions_note: str
    ) -> ObjectRepair | None:
        key = self.layout.index
        if found.damage == "newer":
            return ObjectRepair(key, "index", "newer", found.problem, "left alone")
        held: dict[str, list[Entry]] = {}
        for shard in shards.values():
            for fid, entry in shard.entries.items():
                held.setdefault(fid, []).append(entry)
        if found.damage == "deleted" and not held:
            return None
        tuples: list[tuple[str, str, tuple[str, ...]]] = []
        unplaced: list[str] = []
        for fid, entries in sorted(held.items()):
            stages = sorted({e.stage for e in entries})
            if len(stages) > 1:
                unplaced.append(f"{fid}: in the shards of {', '.join(stages)}")
            else:
                tuples.append((fid, stages[0], entries[0].depends_on))
        blocks = list(self.history.blocks(key, damaged=[]))
        own, _ = salvage(found.body) if found.damage == "corrupt" else ([], False)
        version = max((r.version for r in merged([*blocks, *own])), default=0)
        try:
            rebuilt = shard_index.ShardIndex.empty(self.index_codec.writes).declare_many(tuples)
        except shard_index.ShardIndexError as e:
            raise index_error(e) from None
        rebuilt = rebuilt.with_meta(rebuilt.meta, version + 1)
        moved = None
        action: Action = "would rebuild"
        if not dry_run:
            moved, landed = self._replace(found, self.index_codec, RebuildIndex(rebuilt))
            action = "rebuilt" if landed else "left alone"
        return ObjectRepair(
            key=key,
            kind="index",
            damage=found.damage or "deleted",
            problem=found.problem,
            action=action,
            moved_to=moved,
            records=0,
            indexed=tuple(fid for fid, _, _ in tuples),
            not_restored=tuple(unplaced),
            source="shards",
            versions_note=versions_note,
        )

    # -- writing -----------------------------------------------------------------------

    def _restore(
        self,
        found: Found,
        kind: Kind,
        codec: Codec[T],
        dry_run: bool,
        records: list[JournalRecord] | None = None,
    ) -> tuple[ObjectRepair, T | None] | str:
        """``found`` restored from a kept version (``restore.attempt``), judged against its
        journal (``records``, else its blocks and what its damaged bytes carry) and its
        damaged blocks; the records it carries then count for mending those blocks."""
        if records is None:
            own = salvage(found.body)[0] if found.damage == "corrupt" else []
            records = merged([*self.history.blocks(found.key, damaged=[]), *own])
        unknown = max((d.last for d in self.block_damage.get(found.key, ())), default=0)
        bump = next_index if kind == "index" else same
        got = attempt(self.place, found, kind, codec, records, dry_run, unknown, bump)
        if not isinstance(got, str) and got[1] is not None:
            journal = codec.journal(got[1])
            if journal is not None:
                self.carried[found.key] = journal
        return got

    def _replace(self, found: Found, codec: Any, command: Any) -> tuple[str | None, bool]:
        """Copy a corrupt object aside (create-only, then read back), then commit
        ``command`` over exactly those bytes; a deleted object is re-created create-only."""
        if found.damage != "corrupt":
            self.docs.forget(found.key)
            return None, bool(self.docs.commit(found.key, codec, command))
        aside = mend.copy_aside(self.store, self.layout, found.key, found.body, "object")
        return aside, bool(self.docs.commit(found.key, codec, command, over=found.etag))


__all__ = ["Repairer"]
