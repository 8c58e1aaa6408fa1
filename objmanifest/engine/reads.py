"""Reading a task's manifest: a stage's view over its shards (read in parallel for a split
stage) and one entry wherever it lives, live or archived."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import shard_index

from ..core.model import Entry, Shard
from ..errors import NotFound
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
    stage = m.stage_of(file_id)
    doc = m.read_shard(m.layout.shard_of(stage, file_id))
    found = doc.entries.get(file_id) or m.archives.entry(doc, file_id)
    if found is None:
        raise NotFound(
            f"{file_id!r} is in the index but not in shard {stage!r}: its declaration "
            "was interrupted; declare it again to finish it"
        )
    return found


def entries(m: Manifest, stage: str | None = None) -> list[Entry]:
    """The live entries of ``stage`` (every stage: None), read fresh."""
    stages = [stage] if stage else list(m.stages)
    return [e for s in stages for e in shard(m, s).entries.values()]
