"""Garbage collection: removing what no entry references any more, safely while agents work.

Every candidate is found by listing, then judged on a fresh read of its entry's shard and
upload state taken *after* the listing, so an entry that moved on meanwhile is judged as it
is now. A data key of epoch E of an entry is garbage once no holder can ever make the entry
point at it: it is not the entry's key, it is not the key of the live holder's epoch (the
entry is not ``writing`` at E), and no open upload state a holder may still adopt records
it. Epochs only grow, so once that holds it holds forever; a fenced holder that writes its
key again later leaves garbage for the next run, never a reference. Keys of an unknown
shape, and data of entries that are not in the live shards, are left alone and reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from ..cas.codecs import ShardCodec
from ..cas.loop import Documents
from ..core.ages import older_than_cutoff
from ..core.changes import data_expired
from ..core.commands import DropArchivedData, DropData
from ..core.layout import TaskLayout
from ..core.model import Entry
from ..core.states import State
from ..data.chunked import Scope, adoptable, sweep_plan
from ..data.chunked.state import read_state
from ..data.transfer import META_DIGEST
from ..errors import ObjManifestError
from ..store import PROBE_PREFIX, ObjectStore, get_if_any
from ..store.errors import NoSuchObject
from .archive import Archives

log = logging.getLogger(__name__)

GcKind = Literal["fenced_data", "fenced_upload_object", "upload", "probe", "consumed_data"]
KINDS: tuple[GcKind, ...] = (
    "fenced_data",
    "fenced_upload_object",
    "upload",
    "probe",
    "consumed_data",
)


@dataclass(frozen=True)
class GcItem:
    """One object (or multipart upload) gc removed, or would remove with ``dry_run``."""

    kind: GcKind
    key: str
    size: int | None
    """Bytes freed; None for a multipart upload (its parts are not listed)."""
    file_id: str | None = None


@dataclass(frozen=True)
class GcKept:
    """Something gc left alone on purpose, and why."""

    key: str
    reason: str


@dataclass
class GcReport:
    """What ``task.gc()`` removed (or would, with ``dry_run``), by kind, and what it kept."""

    dry_run: bool
    removed: list[GcItem] = field(default_factory=list)
    kept: list[GcKept] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def by_kind(self) -> dict[GcKind, list[GcItem]]:
        return {k: [i for i in self.removed if i.kind == k] for k in KINDS}

    @property
    def bytes_freed(self) -> int:
        return sum(i.size or 0 for i in self.removed)

    def to_json(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "bytes_freed": self.bytes_freed,
            "removed": {
                kind: {
                    "count": len(items),
                    "bytes": sum(i.size or 0 for i in items),
                    "keys": [i.key for i in items],
                }
                for kind, items in self.by_kind().items()
            },
            "kept": [{"key": k.key, "reason": k.reason} for k in self.kept],
            "errors": list(self.errors),
        }


@dataclass(frozen=True)
class Collector:
    """The task as gc sees it: its store, CAS loop, keys, stages and upload scope."""

    store: ObjectStore
    docs: Documents
    layout: TaskLayout
    stages: tuple[str, ...]
    scope: Scope
    codec: Callable[[str], ShardCodec]
    now: Callable[[], datetime]
    archives: Archives | None = None
    """Where archived entries are read (their data is gc's too once consumed)."""

    def entries(self, shard: str) -> dict[str, Entry]:
        """A fresh read of one shard's entries."""
        return dict(self.docs.read(self.layout.shard(shard), self.codec(shard)).entries)

    def archived(self, shard: str) -> dict[str, Entry]:
        """The archived entries of one shard (read fresh; their archive objects once), each
        with ``data_removed_at`` if the shard's ``archived`` map says gc removed its data."""
        doc = self.docs.read(self.layout.shard(shard), self.codec(shard))
        if self.archives is None or not doc.archived:
            return {}
        out: dict[str, Entry] = {}
        for file_id in doc.archived:
            found = self.archives.entry(doc, file_id)
            if found is not None:
                out[file_id] = found
        return out

    def run(self, dry_run: bool, consumed_older_than: float | None) -> GcReport:
        report = GcReport(dry_run)
        uploads = sweep_plan(self.scope, apply=not dry_run)
        report.removed.extend(GcItem("upload", key, None) for key in uploads)
        self._data(report, dry_run)
        if consumed_older_than is not None:
            self._consumed(report, dry_run, consumed_older_than)
        self._probes(report, dry_run)
        removed = {item.key for item in report.removed}
        report.kept = [k for k in report.kept if k.key not in removed]  # never both
        return report

    # -- data of fenced holders and fenced uploads ------------------------------------------

    def _data(self, report: GcReport, dry_run: bool) -> None:
        listed = [row.key for row in self.store.list(self.layout.root)]
        fresh: dict[str, dict[str, Entry]] = {}  # read after the listing
        archived: dict[str, dict[str, Entry]] = {}
        for key in listed:
            parsed = self.layout.parse(key)
            if parsed.kind == "other":
                report.kept.append(GcKept(key, "not a key objmanifest writes"))
                continue
            if parsed.kind != "data" or parsed.stage is None or parsed.file_id is None:
                continue  # a manifest object, journal or archive: never gc's
            if parsed.stage not in self.stages:
                report.kept.append(GcKept(key, f"{parsed.stage!r} is not a stage of the task"))
                continue
            shard = self.layout.shard_of(parsed.stage, parsed.file_id)
            if shard not in fresh:
                fresh[shard] = self.entries(shard)
            entry = fresh[shard].get(parsed.file_id)
            if entry is None:
                if shard not in archived:
                    archived[shard] = self.archived(shard)
                gone = archived[shard].get(parsed.file_id)
                if gone is not None and gone.key == key:
                    if gone.data_removed_at is not None:
                        # Marked by an earlier run whose removal failed.
                        head = self._head(key)
                        if head is not None and self._remove(report, key, dry_run):
                            report.removed.append(
                                GcItem("consumed_data", key, head[0], gone.file_id)
                            )
                    continue  # an archived entry's own data: as a live one's, or past it
            if entry is None or entry.stage != parsed.stage:
                report.kept.append(GcKept(key, "its entry is not in the live shard"))
                continue
            assert parsed.epoch is not None
            if parsed.epoch > entry.epoch:
                report.kept.append(GcKept(key, f"an epoch above its entry's ({entry.epoch})"))
                continue
            marked = key == entry.key and entry.data_removed_at is not None
            if not marked and not self._garbage(entry, key, parsed.epoch, dry_run):
                continue
            head = self._head(key)
            if head is None:
                continue
            size, single = head
            kind: GcKind = "fenced_data" if single else "fenced_upload_object"
            if marked:  # marked by an earlier run whose removal failed
                kind = "consumed_data"
            if self._remove(report, key, dry_run):
                report.removed.append(GcItem(kind, key, size, entry.file_id))

    def _garbage(self, entry: Entry, key: str, epoch: int, dry_run: bool) -> bool:
        """May no holder ever make ``entry`` point at ``key`` (of ``epoch``)?"""
        if key == entry.key:
            return False
        if entry.state is State.writing and epoch == entry.epoch:
            return False  # the live holder's own key
        doc = read_state(
            self.store, self.layout, self.layout.upload_state(entry.stage, entry.file_id)
        )
        if adoptable(entry, doc, key):
            return False
        recorded_open = doc is not None and doc.status == "open" and doc.key == key
        return dry_run or not recorded_open  # (a dry run: sweep would abort it first)

    def _head(self, key: str) -> tuple[int, bool] | None:
        try:
            head = self.store.head(key)
        except NoSuchObject:
            return None
        return head.size, META_DIGEST in head.metadata

    def _remove(self, report: GcReport, key: str, dry_run: bool) -> bool:
        if dry_run:
            return True
        try:
            self.store.delete(key)
        except ObjManifestError as e:
            report.errors.append(f"could not remove {self.store.describe(key)}: {e}")
            return False
        log.info("gc: removed %s", self.store.describe(key))
        return True

    # -- consumed data past its retention ---------------------------------------------------

    def _consumed(self, report: GcReport, dry_run: bool, seconds: float) -> None:
        before = older_than_cutoff(self.now(), seconds)  # 0: every consumed entry's data
        for shard in self.layout.all_shards(self.stages):
            wanted = _expired_keys(self.entries(shard).values(), before)
            if not wanted:
                continue
            if dry_run:
                marked = [(fid, key) for fid, key in wanted.items()]
            else:
                entries = self.docs.commit(
                    self.layout.shard(shard), self.codec(shard), DropData(wanted, before)
                )
                marked = [(e.file_id, e.key) for e in entries if e.key is not None]
            for file_id, key in marked:
                self._remove_data(report, file_id, key, dry_run)
        self._consumed_archived(report, dry_run, before)

    def _consumed_archived(self, report: GcReport, dry_run: bool, before: datetime) -> None:
        """The same for archived consumed entries: marked in their shard's ``archived`` map
        (their archive object is written once), then their data removed."""
        for shard in self.layout.all_shards(self.stages):
            keys = _expired_keys(self.archived(shard).values(), before)
            if not keys:
                continue
            marked = list(keys)
            if not dry_run:
                marked = self.docs.commit(
                    self.layout.shard(shard), self.codec(shard), DropArchivedData(tuple(keys))
                )
            for file_id in marked:
                self._remove_data(report, file_id, keys[file_id], dry_run)

    def _remove_data(self, report: GcReport, file_id: str, key: str, dry_run: bool) -> None:
        head = self._head(key)
        if head is not None and self._remove(report, key, dry_run):
            report.removed.append(GcItem("consumed_data", key, head[0], file_id))

    # -- probe objects -----------------------------------------------------------------------

    def _probes(self, report: GcReport, dry_run: bool) -> None:
        """A probe's object is removed once its last write (``current:``) is there: the
        probe has nothing left to do with it but delete it. Earlier bodies may be a probe
        running now, and are reported."""
        for row in list(self.store.list(PROBE_PREFIX)):
            blob = get_if_any(self.store, row.key)
            if blob is None:
                continue
            if not blob.body.startswith(b"current:"):
                report.kept.append(GcKept(row.key, "a probe that may be running now"))
                continue
            if self._remove(report, row.key, dry_run):
                report.removed.append(GcItem("probe", row.key, len(blob.body)))


def _expired_keys(entries: Iterable[Entry], before: datetime) -> dict[str, str]:
    """File id -> data key of the entries whose data gc may remove (``data_expired``)."""
    return {e.file_id: e.key for e in entries if e.key is not None and data_expired(e, before)}
