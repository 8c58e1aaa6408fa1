"""The task's journal as the engine offers it: the journaled objects, history, log and
lineage, retention and migration to the current schema."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..cas.codecs import (
    HeaderCodec,
)
from ..core.model import (
    READERS,
    SCHEMA_VERSION,
    Entry,
    JournalRecord,
    Shard,
    State,
)
from ..core.names import check_file_id
from ..errors import (
    NotFound,
)
from ..journal import history as journal_history
from ..journal.history import Dropped, Lineage, Transition, transitions_of
from ..journal.retention import Trimmer
from .commands import Migratable, Migrate, MigrateHeader
from .settings import check_retention

if TYPE_CHECKING:
    from .manifest import Manifest


def journaled_objects(self: Manifest) -> list[tuple[str, Migratable[Any]]]:
    objects: list[tuple[str, Migratable[Any]]] = [
        (self.layout.shard(shard), codec) for shard, codec in self._codecs.items()
    ]
    objects.append((self.layout.index, self.index_codec))
    for row in self.store.list(self.layout.uploads_prefix):
        codec = self._upload_codec(row.key)
        if codec is not None:
            objects.append((row.key, codec))
    return objects


def history(self: Manifest, file_id: str) -> list[Transition]:
    stage = self.stage_of(file_id)
    shard = self.layout.shard_of(stage, file_id)
    return self.journal.history(file_id, self.layout.shard(shard), self.codec(shard))


def log(
    self: Manifest,
    since: datetime | None = None,
    stage: str | None = None,
    agent: str | None = None,
) -> list[JournalRecord]:
    if stage is not None:
        self._check_stage(stage)
    return self.journal.log(since=since, stage=stage, agent=agent, stage_of=self.stage_namer())


def stage_namer(self: Manifest) -> Callable[[str], str | None] | None:
    if not self.layout.single:
        return None
    index = self.index()

    def stage_of(file_id: str) -> str | None:
        nonlocal index
        found = index.stage_of(file_id)
        if found is None:
            index = self.index()
            found = index.stage_of(file_id)
        return found

    return stage_of


def lineage(self: Manifest, file_id: str) -> Lineage:
    check_file_id(file_id)
    index = self.index()
    if file_id not in index:
        raise NotFound(f"{file_id!r} is not declared in task {self.task_id!r}")
    shards: dict[str, Shard] = {}

    def entry(fid: str) -> Entry | None:
        stage = index.stage_of(fid)
        if stage is None or stage not in self.stages:
            return None
        shard = self.layout.shard_of(stage, fid)
        if shard not in shards:
            shards[shard] = self.read_shard(shard)
        found = shards[shard].entries.get(fid)
        return found if found is not None else self.archives.entry(shards[shard], fid)

    journals: dict[str, list[JournalRecord]] = {}

    def ready_at(found: Entry) -> datetime | None:
        shard = self.layout.shard_of(found.stage, found.file_id)
        if shard not in journals:
            key = self.layout.shard(shard)
            journals[shard] = self.journal.records(key, self.codec(shard))
        made = [
            t.at
            for t in transitions_of(found.file_id, journals[shard])
            if t.to_state == State.ready.value and t.epoch == found.epoch
        ]
        return made[-1] if made else None

    return journal_history.lineage(file_id, index, entry, ready_at)


def trim_journal(
    self: Manifest,
    keep_seconds: float | None = None,
    keep_versions: int | None = None,
    *,
    dry_run: bool = False,
) -> list[Dropped]:
    if keep_seconds is None and keep_versions is None:
        keep_seconds = self.header.journal_keep_seconds
        keep_versions = self.header.journal_keep_versions
    seconds, versions = check_retention(keep_seconds, keep_versions)
    trimmer = Trimmer(self.store, self.docs.detached(), self.layout, seconds, versions)
    return trimmer.trim(self.journaled_objects(), dry_run=dry_run)


def dropped(self: Manifest, file_id: str | None = None) -> list[Dropped]:
    if file_id is not None:
        stage = self.stage_of(file_id)
        keys = [self.layout.shard(self.layout.shard_of(stage, file_id))]
    else:
        keys = [key for key, _ in self.journaled_objects()]
    return [d for key in keys for d in self.journal.dropped(key)]


def migrate(self: Manifest) -> list[str]:
    target = SCHEMA_VERSION
    moved: list[str] = []
    header_codec = HeaderCodec(self.task_id)
    header = self.docs.read(self.layout.header, header_codec)
    if header.schema_version < target:
        header = self.docs.commit(
            self.layout.header, header_codec, MigrateHeader(target, READERS[target])
        )
        moved.append(self.layout.header)
    self._configure(header)
    for key, codec in self.journaled_objects():
        try:
            if self.docs.commit(key, codec, Migrate(codec, target)):
                moved.append(key)
        except NotFound:
            continue
    return moved
