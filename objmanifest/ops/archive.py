"""Archiving: terminal entries leave the live shards for write-once archive objects.

One archive commit of a shard is two writes, in this order: the archive object
(``archive/SHARD/ARCHIVE_ID.json``, create-only) with the entries chosen, then the shard
commit (``commands.Archive``) that removes those entries still exactly as written and records
each as ``file id -> (state, ARCHIVE_ID, declaration digest)`` in the shard's ``archived``
map. Readers find an archived entry only through that map, so:

- an archiver that dies between the two writes loses nothing (the entries are still live)
  and makes nothing appear twice (no map points at its object); the next archiver of that
  shard finds the object no map names and commits it (only entries still identical);
- an entry that changed between the two writes (a conflict the CAS loop re-applies over)
  stays live; the archive object's stale copy is never read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from pydantic import ValidationError

from ..cas.codecs import load_json, schema_problems
from ..core.ages import older_than_cutoff
from ..core.changes import TERMINAL
from ..core.commands import Archive
from ..core.layout import TaskLayout
from ..core.model import ArchiveObject, Entry, Shard
from ..errors import CorruptShard, NotFound, StoreError
from ..store import CREATE, ObjectStore, get_if_any
from ..store.errors import NoSuchObject, OutcomeUnknown, PreconditionFailed

ARCHIVE_SCHEMA = 1
ARCHIVE_REPAIR = (
    "run `objmanifest repair` (Task.repair()), which copies it aside and writes its entries "
    "to a new archive object from their journal records"
)
WRITE_TRIES = 3
"""How often an archive object's create-only write is tried at one key, and how many keys."""

Commit = Callable[[str, Archive], list[str]]
"""Commits an ``Archive`` command to one shard (by name); returns the ids it moved."""


def due(shard: Shard, now: datetime, older_than: float) -> dict[str, Entry]:
    """The shard's terminal entries last updated at least ``older_than`` seconds ago (every
    one for 0: ``older_than_cutoff``)."""
    cutoff = older_than_cutoff(now, older_than)
    return {
        fid: e
        for fid, e in shard.entries.items()
        if e.state in TERMINAL and (e.updated_at or e.declared_at or now) <= cutoff
    }


class Archives:
    """The archive objects of one task: written once, so each is read at most once here."""

    def __init__(self, store: ObjectStore, layout: TaskLayout) -> None:
        self.store = store
        self.layout = layout
        self._read: dict[str, ArchiveObject] = {}
        self._lock = threading.Lock()

    def read(self, shard: str, archive_id: str) -> ArchiveObject:
        """One archive object (``NotFound`` naming it if it is not there, ``CorruptShard``
        if it does not parse: it is left as it is)."""
        key = self.layout.archive_object(shard, archive_id)
        with self._lock:
            if key in self._read:
                return self._read[key]
        try:
            blob = self.store.get(key)
        except NoSuchObject as e:
            raise NotFound(str(e)) from e
        assert blob is not None
        where = self.store.describe(key)
        try:
            data = load_json(key, blob.body, ARCHIVE_SCHEMA)
        except CorruptShard as e:
            raise e.at(where, ARCHIVE_REPAIR) from None
        try:
            doc = ArchiveObject.model_validate(data)
        except ValidationError as e:
            problem = f"not an archive object: {schema_problems(e)}"
            raise CorruptShard(key, problem, where, ARCHIVE_REPAIR) from None
        if (doc.task_id, doc.shard, doc.archive_id) != (self.layout.task_id, shard, archive_id):
            problem = f"it is archive {doc.archive_id!r} of {doc.task_id}/{doc.shard}"
            raise CorruptShard(key, problem, where, ARCHIVE_REPAIR)
        with self._lock:
            self._read[key] = doc
        return doc

    def entry(self, shard: Shard, file_id: str) -> Entry | None:
        """The whole archived entry, if ``shard`` archived ``file_id``."""
        ref = (shard.archived or {}).get(file_id)
        if ref is None:
            return None
        found = self.read(shard.stage, ref.archive).entries.get(file_id)
        if found is None:
            key = self.layout.archive_object(shard.stage, ref.archive)
            problem = f"it lacks {file_id!r}, which shard {shard.stage!r} says it holds"
            raise CorruptShard(key, problem, self.store.describe(key), ARCHIVE_REPAIR)
        if ref.data_removed_at is not None:  # gc removed its data since (the shard says)
            return found.model_copy(update={"data_removed_at": ref.data_removed_at})
        return found

    def write(self, shard: str, entries: dict[str, Entry], now: datetime) -> str:
        """Write the archive object of one commit, once; returns its id. A key that holds
        other bytes (a 412 that is not our own write) is given up for a new id."""
        key = ""
        for _ in range(WRITE_TRIES):
            archive_id = f"{now:%Y%m%dT%H%M%S}Z-{self.store.runtime.new_id()}"
            doc = ArchiveObject(
                schema_version=ARCHIVE_SCHEMA,
                task_id=self.layout.task_id,
                shard=shard,
                archive_id=archive_id,
                created_at=now,
                entries=entries,
            )
            key = self.layout.archive_object(shard, archive_id)
            if self._write_once(key, doc.model_dump_json(exclude_none=True).encode()):
                with self._lock:
                    self._read[key] = doc
                return archive_id
        raise StoreError(
            f"could not write an archive object of shard {shard!r} (last tried "
            f"{self.store.describe(key)}): the store kept refusing create-only writes of new "
            "keys; nothing was archived, run archive again"
        )

    def _write_once(self, key: str, body: bytes) -> bool:
        """True once ``key`` holds exactly ``body``; False if it holds other bytes.

        A refused (412) or unanswered create-only write is read back: our own bytes mean
        our write landed (its answer was lost, or it was sent twice); a missing object means
        it did not land, and it is written again."""
        for _ in range(WRITE_TRIES):
            try:
                self.store.put(key, body, mode=CREATE, content_type="application/json")
                return True
            except (PreconditionFailed, OutcomeUnknown):
                pass
            blob = get_if_any(self.store, key)
            if blob is None:
                continue
            return blob.body == body
        return False

    def unreferenced(self, shard: Shard) -> list[str]:
        """Archive objects of the shard its ``archived`` map names no entry of: left by an
        archiver that died before its shard commit (or whose entries all changed)."""
        named = {ref.archive for ref in (shard.archived or {}).values()}
        ids = (
            self.layout.parse_archive(row.key, shard.stage)
            for row in self.store.list(self.layout.archive_of(shard.stage))
        )
        return sorted(i for i in ids if i is not None and i not in named)

    def archive_shard(
        self,
        shard: Shard,
        older_than: float,
        commit: Commit,
        actor: str = "",
    ) -> tuple[list[str], list[str], list[str]]:
        """Archive one shard (read fresh by the caller): first commit what a dead archiver
        left, then write and commit a new archive object of what is due. Returns (file ids
        moved, archive objects written, archive objects adopted)."""
        moved: list[str] = []
        written: list[str] = []
        adopted: list[str] = []
        for archive_id in self.unreferenced(shard):
            try:
                left = self.read(shard.stage, archive_id)
            except (NotFound, PreconditionFailed):
                continue
            live = {f: e for f, e in left.entries.items() if shard.entries.get(f) == e}
            if live:
                ids = commit(shard.stage, Archive(archive_id, live, actor))
                if ids:
                    moved += ids
                    adopted.append(self.layout.archive_object(shard.stage, archive_id))
        now = self.store.now()
        chosen = {f: e for f, e in due(shard, now, older_than).items() if f not in moved}
        if chosen:
            archive_id = self.write(shard.stage, chosen, now)
            written.append(self.layout.archive_object(shard.stage, archive_id))
            moved += commit(shard.stage, Archive(archive_id, chosen, actor))
        return sorted(moved), written, adopted


__all__ = ["ARCHIVE_SCHEMA", "Archives", "due"]
