"""Declaring entries and what claims need of the manifest: declarations checked against the
index and written there first, damage between the index and the shards found and mended,
the lookups of dependencies, and claims rebuilt or routed to their shard."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import shard_index

from ..core import changes, commands
from ..core.model import (
    Claim,
    Declaration,
    Entry,
    Shard,
)
from ..core.names import check_file_id
from ..errors import (
    CorruptShard,
    InvalidInput,
    NotFound,
)
from ..store.errors import NoSuchObject
from . import opening
from .commands import DeclareInIndex, RepairIndex, refuse_twice
from .manifest import Manifest
from .reads import lost_shard


def resumed(m: Manifest, agent: str, held: list[tuple[str, int]]) -> list[Claim]:
    """The claims ``agent`` got at each (file id, epoch), rebuilt from the index and the
    entries (each shard read once); see ``Agent.resume``."""
    index = m.index()
    shards: dict[str, Shard] = {}
    claims = []
    for file_id, epoch in held:
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise InvalidInput(
                f"the epoch of a claim on {file_id!r} is a whole number of at least 1 "
                f"(the one its claim printed), not {epoch!r}"
            )
        stage = index.stage_of(check_file_id(file_id))
        if stage is None:
            raise NotFound(f"{file_id!r} is not declared in task {m.task_id!r}")
        shard = m.layout.shard_of(stage, file_id)
        if shard not in shards:
            shards[shard] = m.read_shard(shard)
        entry = shards[shard].entries.get(file_id)
        expiry = entry.lease_expires_at if entry is not None else None
        claims.append(
            Claim(
                task_id=m.task_id,
                file_id=file_id,
                stage=stage,
                agent=agent,
                epoch=epoch,
                lease_expires_at=expiry or m.store.now(),
                shard=shard,
            )
        )
    return claims


def declare(
    m: Manifest,
    file_id: str,
    stage: str,
    depends_on: Iterable[str] = (),
    consumers: Iterable[str] = (),
) -> Entry:
    """One declaration, as ``declare_many`` makes it."""
    decl = {
        "file_id": file_id,
        "stage": stage,
        "depends_on": depends_on,
        "consumers": consumers,
    }
    return declare_many(m, [decl])[0]


def refuse_another_task(m: Manifest) -> None:
    """Before a declaration makes a shard: the task under its id must still be the one this
    process opened. A shard it made for the old task in a new one would carry the old
    ``creation_id``, and refuse the new task's own agents."""
    try:
        now, _ = opening.read_header(m.store, m.task_id)
    except NoSuchObject:
        raise NotFound(
            f"task {m.task_id!r} was deleted since this process opened it: nothing was declared"
        ) from None
    if m.header.creation_id and now.creation_id != m.header.creation_id:
        raise NotFound(
            f"task {m.task_id!r} was deleted and created again since this process opened it: "
            "nothing was declared; open the task again"
        )


def declare_many(
    m: Manifest, decls: Iterable[Declaration | dict[str, Any] | tuple[Any, ...]]
) -> list[Entry]:
    """Declare a batch: refused whole before anything is written, then the index first and
    one commit per shard touched (see ``Task.declare_many``)."""
    if isinstance(decls, (str, bytes, dict, Declaration)):
        raise InvalidInput(
            f"declare_many() takes a list of declarations, not a {type(decls).__name__}: "
            f"wrap it in a list ([...]), or call declare() for one file"
        )
    batch = [Declaration.of(d) for d in decls]
    refuse_twice(batch)
    by_shard: dict[str, list[Declaration]] = {}
    for decl in batch:
        m.check_stage(decl.stage)
        by_shard.setdefault(m.layout.shard_of(decl.stage, decl.file_id), []).append(decl)
    # Refuse a conflicting batch before writing anything: the index checks stages,
    # dependencies and cycles, the shards (read fresh: 304s) check consumers. Shards are
    # read before the index: a declaration in flight writes the index first, so an id
    # found in a shard and missing from a later read of the index is damage, not a race.
    shards = {shard: m.read_shard(shard) for shard in by_shard}
    refuse_unindexed(m, batch, shards)
    if any(not doc.version for doc in shards.values()):
        refuse_another_task(m)
        index = m.index()
        for shard, doc in shards.items():
            lost = lost_shard(m, shard, doc, index)
            if lost is not None:
                raise lost  # a new shard would hide what the index says it held
    for shard, group in by_shard.items():
        changes.declare(shards[shard], m.store.now(), group)
    if batch:
        m.docs.commit(m.layout.index, m.index_codec, DeclareInIndex(batch))
    declared: dict[str, Entry] = {}
    for shard, group in by_shard.items():
        entries = m.docs.commit(m.layout.shard(shard), m.codec(shard), commands.Declare(group))
        declared.update((e.file_id, e) for e in entries)
        fresh = m.docs.cached(m.layout.shard(shard), m.codec(shard))
        for decl in group:
            whole = m.archives.entry(fresh, decl.file_id)
            if whole is not None:
                declared[decl.file_id] = whole  # archived: declared again, a no-op
    return [declared[d.file_id] for d in batch]


def refuse_unindexed(m: Manifest, batch: list[Declaration], shards: dict[str, Shard]) -> None:
    """Refuse to declare an id that a shard holds but the index lacks (the index was
    deleted or replaced by hand): declaring it again could put it in a second stage."""
    index = m.index()
    new = {d.file_id for d in batch if d.file_id not in index}
    if not new:
        return
    everything = m.all_shards(shards)
    index = m.index()  # again, after the shards
    for shard_name, shard in everything.items():
        for file_id in sorted(new & set(shard.entries)):
            if file_id in index:
                continue
            raise CorruptShard(
                m.layout.index,
                f"it lacks {file_id!r}, which shard {shard_name!r} holds: the index was "
                "deleted or replaced by hand",
                m.store.describe(m.layout.index),
                "run `objmanifest repair` (Task.repair_index()) to add what the shards "
                "hold, then declare again",
            )


def repair_index(m: Manifest) -> list[str]:
    """Put back into the index every entry a shard holds and the index lacks."""
    shards = m.all_shards()
    index = m.index()
    held: dict[str, list[Entry]] = {}
    for shard in shards.values():
        for file_id, entry in shard.entries.items():
            held.setdefault(file_id, []).append(entry)
    missing: list[tuple[str, str, tuple[str, ...]]] = []
    unplaced: list[str] = []
    for file_id, entries in sorted(held.items()):
        stages = sorted({e.stage for e in entries})
        known = index.stage_of(file_id)
        if len(stages) > 1:
            unplaced.append(f"{file_id!r} is in the shards of {', '.join(stages)}")
        elif known is None:
            missing.append((file_id, entries[0].stage, entries[0].depends_on))
        elif known != stages[0]:
            unplaced.append(
                f"{file_id!r} is in the shard of {stages[0]}, the index puts it in {known}"
            )
    if missing:
        m.docs.commit(m.layout.index, m.index_codec, RepairIndex(missing))
    if unplaced:
        raise CorruptShard(
            m.layout.index,
            f"it cannot be repaired for {len(unplaced)} file ids: {'; '.join(unplaced[:20])}",
            m.store.describe(m.layout.index),
            "remove each of these entries from the shard where it does not belong",
        )
    return [file_id for file_id, _, _ in missing]


def lookup_for(m: Manifest, shard: str, candidates: Iterable[Entry]) -> changes.Lookups:
    """Build dependency look-ups for entries of ``shard``: the shard's own entries are
    taken from the version the CAS loop hands over, foreign ones from fresh reads of the
    index and their shards, never from a cache.

    ``candidates`` come from ``Manifest.claim_base`` (the cached version, or a fresh read),
    and the foreign dependencies they name are read here. Entries the CAS loop's version
    has that the base lacked (declared since; the loop re-read after a 412) have theirs
    read when that version is handed over, so no entry finds a dependency "not declared"
    for want of a read.
    """
    key, codec = m.layout.shard(shard), m.codec(shard)
    here = m.docs.cached(key, codec)
    known_here = {*here.entries, *(here.archived or {})}
    found = _Foreign(m, shard)
    found.read({d for e in candidates for d in e.depends_on if d not in known_here})

    def make(doc: Shard) -> changes.Lookup:
        if doc is not here:
            new = [doc.entries[f] for f in doc.entries.keys() - here.entries.keys()]
            found.read(
                {
                    d
                    for e in new
                    for d in e.depends_on
                    if d not in found.asked and _live_or_archived(doc, d) is None
                }
            )

        def lookup(dep: str) -> Entry | None:
            mine = _live_or_archived(doc, dep)
            return mine if mine is not None else found.entry(dep)

        return lookup

    return make


class _Foreign:
    """The entries of other shards a claim's dependencies name, from fresh reads of the
    index and those shards (each shard read once per claim, the index once per batch)."""

    def __init__(self, task: Manifest, shard: str) -> None:
        self.task = task
        self.shard = shard
        self.asked: set[str] = set()
        self.index: shard_index.ShardIndex | None = None
        self.shards: dict[str, Shard] = {}

    def read(self, deps: set[str]) -> None:
        if not deps:
            return
        self.asked |= deps
        task = self.task
        self.index = index = task.index()
        wanted = {
            task.layout.shard_of(stage, dep)
            for dep in deps
            if (stage := index.stage_of(dep)) is not None
        } - {self.shard, *self.shards}
        self.shards.update((s, task.read_shard(s)) for s in sorted(wanted))

    def entry(self, dep: str) -> Entry | None:
        stage = self.index.stage_of(dep) if self.index is not None else None
        other = self.shards.get(self.task.layout.shard_of(stage, dep)) if stage else None
        return _live_or_archived(other, dep) if other is not None else None


def _live_or_archived(doc: Shard, file_id: str) -> Entry | None:
    """A dependency as a shard knows it: its live entry, or its archived state."""
    found = doc.entries.get(file_id)
    if found is not None:
        return found
    ref = (doc.archived or {}).get(file_id)
    return changes.archived_stub(file_id, doc.stage, ref) if ref is not None else None
