"""The operators' verbs on a task, each a named commit or an operation of ``ops``: revive,
undeclare, repair and archive."""

from __future__ import annotations

from ..core import commands, operator_changes
from ..core.ages import check_age
from ..core.model import (
    ArchiveReport,
    Entry,
)
from ..ops.repair import Repairer
from ..ops.reports import RepairReport
from .declaring import repair_index
from .manifest import Manifest


def revive(m: Manifest, file_id: str) -> Entry:
    """A dead entry back to failed (an archived one into its live shard)."""
    stage = m.stage_of(file_id)
    shard = m.layout.shard_of(stage, file_id)
    doc = m.read_shard(shard)
    archived = m.archives.entry(doc, file_id) if file_id not in doc.entries else None
    command = operator_changes.Revive(file_id, archived=archived)
    return m.docs.commit(m.layout.shard(shard), m.codec(shard), command)


def undeclare(m: Manifest, file_id: str) -> Entry | None:
    """A pending entry nobody depends on out of its shard, then out of the index."""
    stage = m.stage_of(file_id)
    waiting = sorted(m.index().dependents(file_id))
    if waiting:
        raise operator_changes.dependents_error(file_id, waiting)
    shard = m.layout.shard_of(stage, file_id)
    removed = m.docs.commit(
        m.layout.shard(shard), m.codec(shard), operator_changes.Undeclare(file_id)
    )
    m.docs.commit(m.layout.index, m.index_codec, operator_changes.UndeclareInIndex(file_id))
    return removed


def repair(m: Manifest, dry_run: bool = False) -> RepairReport:
    """The repairer run over this task (see ``ops.repair``)."""
    repairer = Repairer(
        m.store,
        m.docs,
        m.layout,
        m.journal,
        m.shard_codecs(),
        m.index_codec,
        m.stages,
        m.journaled_objects,
        m.upload_codec,
    )
    return repairer.run(dry_run, lambda: repair_index(m))


def archive(m: Manifest, older_than: float = 86400.0, actor: str = "") -> ArchiveReport:
    """Every shard's old terminal entries moved to write-once archive objects."""
    age = check_age("older_than", older_than)
    archived: dict[str, list[str]] = {}
    written: list[str] = []
    adopted: list[str] = []

    def commit(shard: str, command: commands.Archive) -> list[str]:
        return m.docs.commit(m.layout.shard(shard), m.codec(shard), command)

    for shard in m.layout.all_shards(m.stages):
        ids, new, left = m.archives.archive_shard(m.read_shard(shard), age, commit, actor)
        own = m.layout.stage_of_shard(shard)
        index = m.index() if own is None and ids else None
        for fid in ids:
            stage = own or (index.stage_of(fid) if index is not None else None) or shard
            archived.setdefault(stage, []).append(fid)
        written += new
        adopted += left
    return ArchiveReport(
        archived={s: archived.get(s, []) for s in dict.fromkeys((*m.stages, *archived))},
        objects=written,
        adopted=adopted,
    )
