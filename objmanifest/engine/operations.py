"""The operators' verbs on a task, each a named commit or an operation of ``ops``: revive,
undeclare, repair and archive."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core import commands, verbs
from ..core.model import (
    ArchiveReport,
    Entry,
)
from ..ops.archive import check_age
from ..ops.repair import Repairer
from ..ops.reports import RepairReport

if TYPE_CHECKING:
    from .manifest import Manifest


def revive(self: Manifest, file_id: str) -> Entry:
    stage = self.stage_of(file_id)
    shard = self.layout.shard_of(stage, file_id)
    doc = self.read_shard(shard)
    archived = self.archives.entry(doc, file_id) if file_id not in doc.entries else None
    command = verbs.Revive(file_id, archived=archived)
    return self.docs.commit(self.layout.shard(shard), self.codec(shard), command)


def undeclare(self: Manifest, file_id: str) -> Entry | None:
    stage = self.stage_of(file_id)
    waiting = sorted(self.index().dependents(file_id))
    if waiting:
        raise verbs.dependents_error(file_id, waiting)
    shard = self.layout.shard_of(stage, file_id)
    removed = self.docs.commit(
        self.layout.shard(shard), self.codec(shard), verbs.Undeclare(file_id)
    )
    self.docs.commit(self.layout.index, self.index_codec, verbs.UndeclareInIndex(file_id))
    return removed


def repair(self: Manifest, dry_run: bool = False) -> RepairReport:
    repairer = Repairer(
        self.store,
        self.docs,
        self.layout,
        self.journal,
        self._codecs,
        self.index_codec,
        self.stages,
        self.journaled_objects,
        self._upload_codec,
    )
    return repairer.run(dry_run, self.repair_index)


def archive(self: Manifest, older_than: float = 86400.0, actor: str = "") -> ArchiveReport:
    age = check_age(older_than)
    archived: dict[str, list[str]] = {}
    written: list[str] = []
    adopted: list[str] = []

    def commit(shard: str, command: commands.Archive) -> list[str]:
        return self.docs.commit(self.layout.shard(shard), self.codec(shard), command)

    for shard in self.layout.all_shards(self.stages):
        ids, new, left = self.archives.archive_shard(self.read_shard(shard), age, commit, actor)
        own = self.layout.stage_of_shard(shard)
        index = self.index() if own is None and ids else None
        for fid in ids:
            stage = own or (index.stage_of(fid) if index is not None else None) or shard
            archived.setdefault(stage, []).append(fid)
        written += new
        adopted += left
    return ArchiveReport(
        archived={s: archived.get(s, []) for s in dict.fromkeys((*self.stages, *archived))},
        objects=written,
        adopted=adopted,
    )
