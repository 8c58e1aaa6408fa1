"""Reading a task's manifest: a stage's view over its shards (read in parallel for a split
stage) and one entry wherever it lives, live or archived."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import shard_index

from ..core.model import Entry, Shard
from ..errors import CorruptShard, NotFound
from ..store import list_keys
from .manifest import Manifest


def shard(m: Manifest, stage: str) -> Shard:
    """A fresh read of one stage's entries: its shard, or a view of all its partitions (or
    of its entries in the task's one shard)."""
    names = m.shard_names(stage)
    if names == [stage]:
        return m.read_shard(stage)
    return view(m, stage, m.read_shards(names), m.index)


def view(
    m: Manifest,
    stage: str,
    docs: Mapping[str, Shard],
    index: Callable[[], shard_index.ShardIndex | None],
) -> Shard:
    """``stage``'s entries from the shards ``docs`` holds (read already); ``index`` is asked
    only to place the archived ids of a task's one shard (None: they are left out). A view
    is no stored object: its version is 0."""
    names = m.layout.shards_of(stage)
    if names == [stage]:
        return docs[stage]
    parts = [docs[name] for name in names]
    entries = {f: e for p in parts for f, e in p.entries.items() if e.stage == stage}
    archived = {f: a for p in parts for f, a in (p.archived or {}).items()}
    if archived and m.layout.single:
        found = index()
        archived = {
            f: a for f, a in archived.items() if found is not None and found.stage_of(f) == stage
        }
    return Shard(
        task_id=m.task_id,
        stage=stage,
        entries=entries,
        archived=archived or None,
        schema_version=m.header.objects_schema,
    )


def entry(m: Manifest, file_id: str) -> Entry:
    """The entry as the store has it now, live or archived."""
    known = m.docs.peek(m.layout.index)
    stage = known.stage_of(file_id) if isinstance(known, shard_index.ShardIndex) else None
    if stage is not None and stage in m.stages:
        # An entry's stage never changes while it is declared: the index this process read
        # already says where to look, and a fresh read of the index is needed only if the
        # entry is not there (undeclared, or declared again elsewhere since).
        doc = m.read_shard(m.layout.shard_of(stage, file_id))
        found = doc.entries.get(file_id) or m.archives.entry(doc, file_id)
        if found is not None:
            return found
    stage = m.stage_of(file_id)
    doc = m.read_shard(m.layout.shard_of(stage, file_id))
    found = doc.entries.get(file_id) or m.archives.entry(doc, file_id)
    if found is None:
        lost = lost_shard(m, m.layout.shard_of(stage, file_id), doc, m.index())
        if lost is not None:
            raise lost
        raise NotFound(
            f"{file_id!r} is in the index but not in shard {stage!r}: its declaration "
            "was interrupted; declare it again to finish it"
        )
    return found


def entries(m: Manifest, stage: str | None = None) -> list[Entry]:
    """The live entries of ``stage`` (every stage: None), read fresh."""
    stages = [stage] if stage else list(m.stages)
    return [e for s in stages for e in shard(m, s).entries.values()]


def lost_shard(
    m: Manifest, shard: str, doc: Shard, index: shard_index.ShardIndex
) -> CorruptShard | None:
    """``CorruptShard`` naming ``shard`` if it was deleted: it does not exist, the index
    names entries in it, and something shows it was written (its journal, an archive
    object, the data of one of those entries). Without a trace it is a first declaration
    still in flight, or one interrupted before its shard was written: running the same
    declaration again finishes it and loses nothing."""
    if doc.version or doc.entries:
        return None
    own = m.layout.stage_of_shard(shard)
    stages = [own] if own is not None else list(m.stages)
    indexed = sorted(
        fid
        for stage in stages
        for fid in index.file_ids(stage)
        if m.layout.shard_of(stage, fid) == shard
    )
    if not indexed:
        return None
    key = m.layout.shard(shard)
    trace = next(iter(list_keys(m.store, m.layout.journal_of(key))), None)
    trace = trace or next(iter(list_keys(m.store, m.layout.archive_of(shard))), None)
    wanted = set(indexed)
    for stage in stages if trace is None else ():
        for row in m.store.list(m.layout.data_of(stage)):
            if m.layout.parse(row.key).file_id in wanted:
                trace = row.key
                break
        if trace is not None:
            break
    if trace is None:
        return None
    shown = ", ".join(repr(f) for f in indexed[:5]) + (" ..." if len(indexed) > 5 else "")
    return CorruptShard(
        key,
        f"it does not exist, yet the index names {len(indexed)} entr"
        f"{'y' if len(indexed) == 1 else 'ies'} in it ({shown}) and "
        f"{m.store.describe(trace)} shows it was written: it was deleted",
        m.store.describe(key),
        "run `objmanifest repair` (Task.repair()), which rebuilds it from its journal, its "
        "data and the index; declaring its entries again would lose what they were",
    )
